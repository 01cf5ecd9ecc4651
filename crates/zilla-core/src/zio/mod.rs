//! zio: block transforms (checksum, compression) and block pointers.
pub mod checksum;
pub mod compress;
