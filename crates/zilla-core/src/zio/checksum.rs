//! Block checksums (HELPER: implement).
