//! framing: a small buffered reader whose fixed-size reads are cancel-safe.
//!
//! The connection loop waits on "next request header" and "shutdown fired" at the
//! same time (`tokio::select!`). `AsyncReadExt::read_exact` loses bytes when its
//! future is dropped half way; [`FrameReader::read_array`] instead keeps whatever it
//! has read in its own buffer, so abandoning it and calling it again later is safe.
//! Payloads are read with [`FrameReader::read_into`] (not cancel-safe; the caller never
//! races it) which drains the buffer and then reads straight into the caller's memory,
//! avoiding a copy for large writes.
//!
//! Bound: the buffer holds at most `BUFFER_BYTES` plus one header.

use std::io;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

const BUFFER_BYTES: usize = 64 * 1024;

pub(crate) struct FrameReader<R> {
    inner: R,
    buffer: BytesMut,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(inner: R) -> FrameReader<R> {
        FrameReader { inner, buffer: BytesMut::with_capacity(BUFFER_BYTES) }
    }

    /// Bytes already read from the socket and not yet consumed.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// Make at least `wanted` bytes available in the buffer. Cancel-safe.
    async fn fill(&mut self, wanted: usize) -> io::Result<()> {
        while self.buffer.len() < wanted {
            if self.buffer.capacity() - self.buffer.len() < wanted {
                self.buffer.reserve(BUFFER_BYTES.max(wanted));
            }
            let read_bytes = self.inner.read_buf(&mut self.buffer).await?;
            if read_bytes == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Read exactly N bytes. Cancel-safe: partial data stays buffered.
    pub(crate) async fn read_array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        self.fill(N).await?;
        let mut out = [0u8; N];
        self.buffer.copy_to_slice(&mut out);
        Ok(out)
    }

    /// Fill `out` completely. Not cancel-safe.
    pub(crate) async fn read_into(&mut self, out: &mut [u8]) -> io::Result<()> {
        let buffered = self.buffer.len().min(out.len());
        self.buffer.copy_to_slice(&mut out[..buffered]);
        if buffered < out.len() {
            self.inner.read_exact(&mut out[buffered..]).await?;
        }
        Ok(())
    }

    /// Discard exactly `count` bytes without allocating for them.
    pub(crate) async fn skip(&mut self, mut count: u64) -> io::Result<()> {
        let mut scratch = [0u8; 8192];
        while count > 0 {
            let step = count.min(scratch.len() as u64) as usize;
            self.read_into(&mut scratch[..step]).await?;
            count -= step as u64;
        }
        Ok(())
    }
}
