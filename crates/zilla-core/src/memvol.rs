//! MemVolume: an in-memory [`BlockVolume`], the oracle for model-based tests and the
//! stand-in volume for front-end tests. Sparse: blocks never written read as zeros and
//! report as holes.

use std::collections::BTreeMap;
use parking_lot::Mutex;

use crate::zvol::{block_chunks, BlockVolume, Extent};
use crate::{Error, Result};

pub struct MemVolume {
    name: String,
    size: u64,
    block_size: u32,
    read_only: bool,
    blocks: Mutex<BTreeMap<crate::BlockId, Box<[u8]>>>,
}

impl MemVolume {
    pub fn new(name: &str, size: u64, block_size: u32) -> MemVolume {
        assert!(block_size.is_power_of_two() && block_size >= 512);
        MemVolume { name: name.into(), size, block_size, read_only: false, blocks: Mutex::new(BTreeMap::new()) }
    }
    pub fn set_read_only(&mut self, ro: bool) {
        self.read_only = ro;
    }
    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).map_or(true, |end| end > self.size) {
            return Err(Error::invalid(format!("range {offset}+{len} beyond volume size {}", self.size)));
        }
        Ok(())
    }
    fn check_write(&self, offset: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        if offset.checked_add(len).map_or(true, |end| end > self.size) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }
    fn zero_range(&self, offset: u64, len: u64) {
        let bs = self.block_size as u64;
        let mut blocks = self.blocks.lock();
        for c in block_chunks(offset, len, bs) {
            if c.len as u64 == bs {
                blocks.remove(&c.blkid);
            } else if let Some(b) = blocks.get_mut(&c.blkid) {
                b[c.in_block..c.in_block + c.len].fill(0);
            }
        }
    }
}

impl BlockVolume for MemVolume {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let blocks = self.blocks.lock();
        for c in block_chunks(offset, buf.len() as u64, self.block_size as u64) {
            let out = &mut buf[c.in_range..c.in_range + c.len];
            match blocks.get(&c.blkid) {
                Some(b) => out.copy_from_slice(&b[c.in_block..c.in_block + c.len]),
                None => out.fill(0),
            }
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<()> {
        self.check_write(offset, data.len() as u64)?;
        let bs = self.block_size as usize;
        let mut blocks = self.blocks.lock();
        for c in block_chunks(offset, data.len() as u64, bs as u64) {
            let b = blocks.entry(c.blkid).or_insert_with(|| vec![0u8; bs].into_boxed_slice());
            b[c.in_block..c.in_block + c.len].copy_from_slice(&data[c.in_range..c.in_range + c.len]);
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn try_write_nonblocking(&self, offset: u64, data: &crate::zvol::WriteData) -> Option<Result<()>> {
        Some(self.write(offset, &data.to_vec(), false))
    }
    fn unmap(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        self.zero_range(offset, len);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        self.zero_range(offset, len);
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.check(offset, len)?;
        let blocks = self.blocks.lock();
        let mut out: Vec<Extent> = Vec::new();
        for c in block_chunks(offset, len, self.block_size as u64) {
            let (pos, n) = (offset + c.in_range as u64, c.len as u64);
            let hole = !blocks.contains_key(&c.blkid);
            match out.last_mut() {
                Some(last) if last.hole == hole => last.length += n,
                _ => out.push(Extent { offset: pos, length: n, hole }),
            }
        }
        Ok(out)
    }
}
