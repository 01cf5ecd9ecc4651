//! block: the on-disk block format — block pointers, checksums, compression, and the
//! bounds-checked reader every on-disk decoder uses.
//!
//! Theory of operation
//! -------------------
//! These are pure functions and plain data: nothing here does I/O, holds a lock or
//! knows about devices. They sit low in the layer table so that everything that stores
//! or names a block (labels and uberblocks in `vdev`, DVAs in `metaslab`, checksum and
//! compression properties in `props`) can use them without importing the I/O pipeline
//! (`zio`), which sits above the allocator and the ARC and uses all of them.
//!
//! A block pointer (`blkptr`, 128 bytes) names up to three copies (DVAs), the birth
//! txg, the logical and physical sizes, and the checksum of the bytes on disk; the
//! checksum lives in the parent, so the tree is a Merkle tree up to the uberblock.

pub mod blkptr;
pub mod checksum;
pub mod compress;
pub mod reader;
