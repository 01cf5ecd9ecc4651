//! framing: a cancel-safe reader of whole PDUs.
//!
//! The reader keeps what it has read in its own buffer, so dropping a `read_pdu`
//! future (a `select!` that took another branch) loses nothing: the next call goes on
//! where it stopped. The buffer grows to one PDU at most (header, AHS, digests and
//! our declared MaxRecvDataSegmentLength: 64 KiB by default), checked by
//! [`crate::pdu::parse_frame`] before it grows. One socket read may bring several
//! PDUs: they are taken from where the last one ended (`start`), and the unread rest
//! moves to the front only when the next PDU would not fit behind it, so a burst of
//! small PDUs costs no copy per PDU. The connection's fixed buffers stay within the
//! daemon's per-connection memory term.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::pdu::{self, Bhs, Digests, FrameError, Pdu, BHS_BYTES};

/// What a read produced.
pub(crate) enum Frame {
    Pdu(Pdu),
    /// A whole PDU whose data digest did not match (to be rejected, not used).
    DataDigestError(Bhs),
}

pub(crate) struct PduReader<R> {
    inner: R,
    buffer: Vec<u8>,
    /// Where the next PDU begins in `buffer`.
    start: usize,
    /// End of the bytes read.
    filled: usize,
    pub(crate) digests: Digests,
    pub(crate) data_segment_max: usize,
}

/// The error of a malformed frame, as an I/O error (the connection closes).
fn malformed(error: FrameError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}

impl<R: AsyncRead + Unpin> PduReader<R> {
    pub(crate) fn new(inner: R, data_segment_max: usize) -> PduReader<R> {
        PduReader { inner, buffer: vec![0; 16 << 10], start: 0, filled: 0, digests: Digests::default(), data_segment_max }
    }

    /// At least `want` bytes of the next PDU buffered (from `start`).
    async fn fill_to(&mut self, want: usize) -> io::Result<()> {
        if self.filled - self.start >= want {
            return Ok(());
        }
        if self.buffer.len() - self.start < want {
            // make room: the unread bytes to the front, then grow if still short
            self.buffer.copy_within(self.start..self.filled, 0);
            self.filled -= self.start;
            self.start = 0;
            if self.buffer.len() < want {
                self.buffer.resize(want, 0);
            }
        }
        let want = self.start + want;
        while self.filled < want {
            let n = self.inner.read(&mut self.buffer[self.filled..]).await?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
            }
            self.filled += n;
        }
        Ok(())
    }

    /// The next PDU. Cancel-safe. EOF between PDUs is `UnexpectedEof` too.
    pub(crate) async fn read_pdu(&mut self) -> io::Result<Frame> {
        self.fill_to(BHS_BYTES).await?;
        let first = pdu::parse_frame(&self.buffer[self.start..self.filled], Digests { header: false, ..self.digests }, self.data_segment_max)
            .map_err(malformed)?
            .ok_or_else(|| io::Error::other("short header"))?;
        // read the header digest too, then check it
        let header_with_digest = first.data_at.max(BHS_BYTES + first.ahs_bytes + if self.digests.header { 4 } else { 0 });
        self.fill_to(header_with_digest).await?;
        let layout = pdu::parse_frame(&self.buffer[self.start..self.filled], self.digests, self.data_segment_max)
            .map_err(malformed)?
            .ok_or_else(|| io::Error::other("short header"))?;
        self.fill_to(layout.total_bytes).await?;
        let bytes = &self.buffer[self.start..self.start + layout.total_bytes];
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(&bytes[..BHS_BYTES]);
        let frame = if pdu::data_digest_ok(bytes, &layout, self.digests) {
            Frame::Pdu(Pdu {
                bhs,
                ahs: bytes[BHS_BYTES..BHS_BYTES + layout.ahs_bytes].to_vec(),
                data: bytes[layout.data_at..layout.data_at + layout.data_bytes].to_vec(),
            })
        } else {
            Frame::DataDigestError(bhs)
        };
        // what follows is the next PDU
        self.start += layout.total_bytes;
        if self.start == self.filled {
            (self.start, self.filled) = (0, 0);
        }

        Ok(frame)
    }
}
