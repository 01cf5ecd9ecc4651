//! Latency-modelled leaves for the lab (HELPER: implement).
use std::sync::Arc;
use crate::kstat::TunableDef;
use super::Device;

pub const TUNABLES: &[TunableDef] = &[];

#[derive(Debug, Clone)]
pub struct SimProfile {}

impl SimProfile {
    pub fn hdd_from_tunables() -> SimProfile { todo!() }
    pub fn log_ssd_from_tunables() -> SimProfile { todo!() }
    pub fn cache_ssd_from_tunables() -> SimProfile { todo!() }
}

pub struct SimDevice {}

impl SimDevice {
    pub fn new(_inner: Arc<dyn Device>, _profile: SimProfile) -> SimDevice { todo!() }
}

impl Device for SimDevice {
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> std::io::Result<()> { todo!() }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> std::io::Result<()> { todo!() }
    fn flush(&self) -> std::io::Result<()> { todo!() }
    fn size(&self) -> u64 { todo!() }
    fn rotational(&self) -> bool { todo!() }
    fn kind(&self) -> String { todo!() }
}
