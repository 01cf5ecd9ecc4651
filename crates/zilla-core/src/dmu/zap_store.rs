//! zap_store: a ZAP object's blocks are one object of an objset, in one txg.
//!
//! The ZAP (crate::zap) is code over a block seam; [`ObjectInTxg`] is that seam for
//! an object of an open [`Objset`]: its reads see the object as open context does, its
//! writes and frees become the object's dirty records of the txg, so everything one ZAP
//! call changes reaches the pool in that txg or not at all.

use std::borrow::Cow;
use std::sync::Arc;

use super::object_tree::BlockIo;
use super::objset::Objset;
use crate::vdev::abd::AlignedBuf;
use crate::zap::ZapStore;
use crate::{Error, Result, Txg};

/// One object of `objset`, changed in `txg`.
pub struct ObjectInTxg<'a> {
    pub objset: &'a Objset,
    pub io: &'a dyn BlockIo,
    pub txg: Txg,
    pub object: u64,
}

impl ObjectInTxg<'_> {
    fn data_block_bytes(&self) -> Result<u32> {
        let d = self.objset.dnode(self.io, self.object)?;
        d.phys().map(|p| p.data_block_bytes).ok_or_else(|| Error::NotFound(format!("object {}", self.object)))
    }
}

impl ZapStore for ObjectInTxg<'_> {
    fn block_bytes(&self) -> usize {
        // a ZAP object exists while the ZAP works on it; a vanished one reads as the
        // smallest block, and the read that follows fails naming it
        self.data_block_bytes().unwrap_or(512) as usize
    }

    fn set_block_bytes(&mut self, bytes: usize) -> Result<()> {
        self.objset.set_block_bytes(self.io, self.txg, self.object, bytes as u32)
    }

    fn read(&self, blkid: u64) -> Result<Option<Cow<'_, [u8]>>> {
        Ok(self.objset.read_block(self.io, self.object, blkid)?.map(|b| Cow::Owned(b.to_vec())))
    }

    fn write(&mut self, blkid: u64, data: &[u8]) -> Result<()> {
        self.objset.write_block(self.io, self.txg, self.object, blkid, Some(Arc::new(AlignedBuf::from(data))))
    }

    fn free(&mut self, blkid: u64) -> Result<()> {
        self.objset.write_block(self.io, self.txg, self.object, blkid, None)
    }
}
