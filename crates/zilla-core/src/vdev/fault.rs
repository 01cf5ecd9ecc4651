//! Test devices: crash simulation and fault injection (HELPER: implement).
