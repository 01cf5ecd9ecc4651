//! Engine errors. Each variant maps to one errno so front ends can answer clients
//! (NBD error field, SCSI sense) without guessing.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("checksum mismatch on every copy of block at {0}")]
    Checksum(String),
    #[error("out of space")]
    NoSpace,
    /// Out of space, with what did not fit (an admin request, not a client write).
    #[error("out of space: {0}")]
    NoSpaceFor(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}: does not exist")]
    NotFound(String),
    #[error("{0}: already exists")]
    Exists(String),
    #[error("{0}: is read-only")]
    ReadOnly(String),
    #[error("{0}")]
    Busy(String),
    #[error("pool is shutting down")]
    Shutdown,
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
}

impl Error {
    /// errno value for a client reply (NBD error field, SCSI mapping).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Checksum(_) | Error::Corrupt(_) => libc::EIO,
            Error::NoSpace | Error::NoSpaceFor(_) => libc::ENOSPC,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NotFound(_) => libc::ENOENT,
            Error::Exists(_) => libc::EEXIST,
            Error::ReadOnly(_) => libc::EPERM,
            Error::Busy(_) => libc::EBUSY,
            Error::Shutdown => libc::ESHUTDOWN,
        }
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

impl From<crate::kstat::TunableError> for Error {
    fn from(e: crate::kstat::TunableError) -> Self {
        Error::InvalidArgument(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
