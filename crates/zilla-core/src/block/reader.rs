//! reader: a bounds-checked little-endian cursor over untrusted bytes, used by the
//! decoders of the object directory (dmu) and of the space maps stored in it (metaslab).
//! Every read checks the remaining length and returns `Error::Corrupt` instead of
//! panicking.

use crate::{Error, Result};

/// Little-endian reader over untrusted bytes: every read is bounds-checked.
pub struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, pos: 0 }
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.pos < n {
            return Err(Error::Corrupt("object directory truncated".into()));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().unwrap()))
    }
    pub fn string(&mut self) -> Result<String> {
        let n = self.u32()? as usize;
        if n > 1 << 20 {
            return Err(Error::Corrupt("string too long".into()));
        }
        String::from_utf8(self.bytes(n)?.to_vec()).map_err(|_| Error::Corrupt("bad utf-8".into()))
    }
    /// Bytes not read yet (an optional trailing section is present when > 0).
    pub fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
}
