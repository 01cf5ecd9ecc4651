//! Shared helpers for engine tests: pools on in-memory devices.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use zilla_core::spa::{CreateOptions, Opener, Pool, TopSpec};
use zilla_core::vdev::{Device, LeafSpec, Role};
use zilla_core::Error;

/// Devices by name; the opener resolves `LeafSpec.path` = name.
#[derive(Clone, Default)]
pub struct DevSet {
    pub devs: Arc<Mutex<HashMap<String, Arc<dyn Device>>>>,
}

impl DevSet {
    pub fn insert(&self, name: &str, d: Arc<dyn Device>) {
        self.devs.lock().insert(name.to_string(), d);
    }
    pub fn get(&self, name: &str) -> Arc<dyn Device> {
        self.devs.lock().get(name).cloned().expect("device")
    }
    pub fn opener(&self) -> Opener {
        let devs = self.devs.clone();
        Arc::new(move |spec: &LeafSpec, _role: Role| {
            devs.lock()
                .get(&spec.path.to_string_lossy().to_string())
                .cloned()
                .ok_or_else(|| Error::NotFound(spec.path.display().to_string()))
        })
    }
    pub fn specs(&self) -> Vec<LeafSpec> {
        let mut v: Vec<String> = self.devs.lock().keys().cloned().collect();
        v.sort();
        v.into_iter().map(|n| LeafSpec { path: PathBuf::from(n), model: None }).collect()
    }
}

pub fn leaf(name: &str) -> LeafSpec {
    LeafSpec { path: PathBuf::from(name), model: None }
}

/// Two 2-way mirrors: m0a m0b, m1a m1b.
pub fn two_mirrors() -> Vec<TopSpec> {
    vec![
        TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m0a"), leaf("m0b")] },
        TopSpec { role: Role::Normal, mirror: true, leaves: vec![leaf("m1a"), leaf("m1b")] },
    ]
}

pub fn mem_devs(names: &[&str], size: u64) -> DevSet {
    let d = DevSet::default();
    for n in names {
        d.insert(n, Arc::new(zilla_core::vdev::fault::MemDevice::new(size)));
    }
    d
}

pub fn create(devs: &DevSet, tops: Vec<TopSpec>) -> Arc<Pool> {
    Pool::create_with("tank", tops, CreateOptions::default(), devs.opener()).expect("create pool")
}

pub fn import(devs: &DevSet) -> Arc<Pool> {
    Pool::import_with(&devs.specs(), devs.opener()).expect("import pool")
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A FLUSH as the NBD front end makes it: started without blocking
/// (`flush_async`, answered from the engine thread that completes the log write),
/// finished by the blocking `flush` when the volume says it cannot without blocking.
#[allow(dead_code)]
pub fn flush_as_front_end(v: &dyn zilla_core::zvol::BlockVolume) -> zilla_core::Result<()> {
    flush_as_front_end_on(v).0
}

/// `flush_as_front_end`, also saying whether the engine answered from another thread
/// (the asynchronous path) rather than at once or through the blocking fallback.
#[allow(dead_code)]
pub fn flush_as_front_end_on(v: &dyn zilla_core::zvol::BlockVolume) -> (zilla_core::Result<()>, bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    let caller = std::thread::current().id();
    v.flush_async(Box::new(move |r| {
        let _ = tx.send((r, std::thread::current().id() != caller));
    }));
    match rx.recv() {
        Ok((Some(r), elsewhere)) => (r, elsewhere),
        Ok((None, _)) => (v.flush(), false),
        Err(_) => (Err(zilla_core::Error::Io(std::io::Error::other("flush_async dropped its completion"))), false),
    }
}

/// A FUA write as the NBD front end makes it (see `flush_as_front_end`).
#[allow(dead_code)]
pub fn fua_write_as_front_end(v: &dyn zilla_core::zvol::BlockVolume, off: u64, data: &[u8]) -> zilla_core::Result<()> {
    match v.try_write_nonblocking_sync(off, &zilla_core::zvol::WriteData::copy_of(data), true) {
        Some(Ok(true)) => flush_as_front_end(v),
        Some(r) => r.map(|_| ()),
        None => v.write(off, data, true),
    }
}

/// Named crash-testing devices (CrashDevice) of one size, for intent-log and power-cut
/// tests: their durable images after a cut become a new rig, or a pool at once.
pub struct CrashRig {
    pub set: DevSet,
    pub devs: Vec<(String, Arc<zilla_core::vdev::fault::CrashDevice>)>,
}

impl CrashRig {
    pub fn new(names: &[&str], dev_size: u64) -> CrashRig {
        let set = DevSet::default();
        let mut devs = Vec::new();
        for n in names {
            let d = Arc::new(zilla_core::vdev::fault::CrashDevice::new(dev_size));
            set.insert(n, d.clone());
            devs.push((n.to_string(), d));
        }
        CrashRig { set, devs }
    }

    /// Cut the power of every device (device i with seed + i); the new rig holds their
    /// durable images.
    pub fn power_cut(&self, mode: zilla_core::vdev::fault::CrashMode, seed: u64) -> CrashRig {
        let set = DevSet::default();
        let mut devs = Vec::new();
        for (i, (n, d)) in self.devs.iter().enumerate() {
            let nd = Arc::new(zilla_core::vdev::fault::CrashDevice::from_image(d.power_cut(mode, seed.wrapping_add(i as u64))));
            set.insert(n, nd.clone());
            devs.push((n.clone(), nd));
        }
        CrashRig { set, devs }
    }

    pub fn dev(&self, name: &str) -> Arc<zilla_core::vdev::fault::CrashDevice> {
        self.devs.iter().find(|(n, _)| n == name).map(|(_, d)| d.clone()).unwrap_or_else(|| panic!("no device {name}"))
    }

    pub fn import(&self) -> Arc<Pool> {
        Pool::import_with(&self.set.specs(), self.set.opener()).expect("import")
    }

    /// Writes device `name` has taken (0 for an unknown name).
    pub fn writes(&self, name: &str) -> u64 {
        self.devs.iter().find(|(n, _)| n == name).map(|(_, d)| d.writes()).unwrap_or(0)
    }
}
