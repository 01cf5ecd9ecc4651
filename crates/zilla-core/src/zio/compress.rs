//! Block compression (HELPER: implement).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression { Off, Lz4, Zstd(u8) }
