//! zilla-lazyfs: a FUSE file system for power-loss tests through real system calls.
//!
//! Theory of operation
//! -------------------
//! LazyFS (INESC TEC) showed that databases lose acknowledged data in ways only a
//! file system that *withholds unsynced data* exposes: the kernel page cache makes every
//! write look durable until a real power cut. This tool mounts a backing directory
//! through FUSE and keeps every write in its own page cache ([`cache`]) until the file
//! is fsynced or fdatasynced. On command ([`ctl`]) it forgets (`drop`) or partly keeps
//! (`tear`) what was never synced, as a power cut would, and it can fail or ignore the
//! next syncs of one file. The FUSE side ([`fs`]) passes everything else through.
//!
//! Used by tests/system/66_power_loss_fuse.sh: the zilla daemon runs a mirror pool on
//! files in the mount, is killed with -9, the unsynced data is dropped or torn, and
//! every write the daemon acknowledged must read back after it restarts.

pub mod cache;
pub mod ctl;
pub mod fs;
