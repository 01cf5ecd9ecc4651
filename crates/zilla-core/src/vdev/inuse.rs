//! inuse: is a device already in use? Mounts, loop devices and on-disk signatures.
//!
//! Theory of operation
//! -------------------
//! Before `pool create`, `add`, `attach` or `replace` writes labels over a device, the
//! engine asks three questions (OpenZFS: `zpool`'s `check_in_use`, libblkid probes):
//!
//! ```text
//!  1. mounted?        the device (st_rdev), one of its partitions, or - for a regular
//!                     file - a loop device backed by it, appears in /proc/self/mountinfo
//!                     (major:minor, field 3); a loop device attached to the file, or a
//!                     block device held by device-mapper/md (sysfs holders/), is in use
//!  2. another pool?   a Zilla label that is not "destroyed" (spa::config)
//!  3. a signature?    the first 72 KiB and the first 4 KiB of the 128 KiB label area:
//! ```
//!
//! | what               | where (bytes)             | magic                         |
//! |--------------------|---------------------------|-------------------------------|
//! | ext2/3/4           | 1080                      | 0xEF53 (le16)                 |
//! | xfs                | 0                         | "XFSB"                        |
//! | btrfs              | 65600                     | "_BHRfS_M"                    |
//! | swap               | 4086 (page size - 10)     | "SWAPSPACE2" / "SWAP-SPACE"   |
//! | LUKS               | 0                         | "LUKS\xba\xbe"                |
//! | LVM2 PV            | 536                       | "LVM2 001" (label at 512)     |
//! | md RAID 1.1 / 1.2  | 0 / 4096                  | 0xa92b4efc (le32)             |
//! | GPT                | 512 (and 4096: 4Kn)       | "EFI PART"                    |
//! | NTFS / FAT         | 3 / 54 or 82              | "NTFS    " / "FAT"            |
//! | MBR                | 510 + an entry at 446     | 0x55AA and a non-zero type    |
//! | ZFS label          | 131072                    | uberblock 0x00bab10c (le/be)  |
//!
//! Each answer names what was found; `-f` overrides 2 and 3 (and 1 for files backing a
//! loop device: the admin said so). A mounted block device cannot be taken even then:
//! its O_EXCL claim fails (vdev::file).
use std::path::Path;

use super::Device;

/// Bytes read from the start of the device for the signature probes.
const PROBE_BYTES: usize = 72 << 10;
/// ZFS label: the uberblock array starts 128 KiB into each label.
const ZFS_UB_AT: u64 = 128 << 10;
const ZFS_UB_MAGIC: u64 = 0x00bab10c;

/// A known file system, volume manager or partition table on `dev`, by name.
pub fn find_signature(dev: &dyn Device) -> Option<&'static str> {
    let n = (PROBE_BYTES as u64).min(dev.size()) as usize;
    let mut b = vec![0u8; n];
    dev.read_at(&mut b, 0).ok()?;
    let at = |off: usize, magic: &[u8]| b.get(off..off + magic.len()) == Some(magic);
    let le32 = |off: usize| b.get(off..off + 4).map(|s| u32::from_le_bytes(s.try_into().unwrap()));
    let found = if at(1080, &0xEF53u16.to_le_bytes()) {
        "ext2/ext3/ext4 file system"
    } else if at(0, b"XFSB") {
        "xfs file system"
    } else if at(65600, b"_BHRfS_M") {
        "btrfs file system"
    } else if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        "swap area"
    } else if at(0, b"LUKS\xba\xbe") {
        "LUKS encrypted volume"
    } else if at(536, b"LVM2 001") {
        "LVM2 physical volume"
    } else if le32(0) == Some(0xa92b4efc) || le32(4096) == Some(0xa92b4efc) {
        "Linux md RAID member"
    } else if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        "GPT partition table"
    } else if at(3, b"NTFS    ") {
        "NTFS file system"
    } else if at(510, &[0x55, 0xAA]) && (at(54, b"FAT") || at(82, b"FAT32")) {
        "FAT file system"
    } else if at(510, &[0x55, 0xAA]) && (0..4).any(|i| b[446 + 16 * i + 4] != 0) {
        "DOS (MBR) partition table"
    } else {
        return zfs_label(dev);
    };
    Some(found)
}

/// A ZFS label: an uberblock magic at 128 KiB that is not a sealed Zilla slot.
fn zfs_label(dev: &dyn Device) -> Option<&'static str> {
    let mut ub = vec![0u8; super::label::UB_SLOT_SIZE];
    dev.read_at(&mut ub, ZFS_UB_AT).ok()?;
    let magic = u64::from_le_bytes(ub[..8].try_into().unwrap());
    let zfs = magic == ZFS_UB_MAGIC || magic == ZFS_UB_MAGIC.swap_bytes();
    (zfs && !super::label::verify_sealed(&ub, ZFS_UB_AT)).then_some("ZFS pool member")
}

/// Why `path` is in use by the system (mounted, backing a loop device, held by a
/// device-mapper or md device), or None.
pub fn in_use_by_system(path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(path).ok()?;
    let mounts = mounted_devices();
    if md.file_type().is_block_device() {
        let (maj, min) = (rustix::fs::major(md.rdev()), rustix::fs::minor(md.rdev()));
        let sys = format!("/sys/dev/block/{maj}:{min}");
        let mut devs = vec![(maj, min, path.display().to_string())];
        devs.extend(partitions(&sys));
        for (ma, mi, name) in &devs {
            if let Some((_, at)) = mounts.iter().find(|(d, _)| *d == (*ma, *mi)) {
                return Some(format!("{name} is mounted at {at}"));
            }
        }
        let holders: Vec<String> = read_dir_names(&format!("{sys}/holders"));
        if !holders.is_empty() {
            return Some(format!("{} is held by {}", path.display(), holders.join(", ")));
        }
        return None;
    }
    let me = (md.dev(), md.ino());
    for loopdev in read_dir_names("/sys/block").into_iter().filter(|n| n.starts_with("loop")) {
        let Ok(backing) = std::fs::read_to_string(format!("/sys/block/{loopdev}/loop/backing_file")) else { continue };
        let backing = backing.trim().trim_end_matches(" (deleted)");
        let Ok(bmd) = std::fs::metadata(backing) else { continue };
        if (bmd.dev(), bmd.ino()) != me {
            continue;
        }
        let dev = std::fs::read_to_string(format!("/sys/block/{loopdev}/dev")).unwrap_or_default();
        let mount = parse_majmin(dev.trim()).and_then(|d| mounts.iter().find(|(m, _)| *m == d));
        return Some(match mount {
            Some((_, at)) => format!("{} backs /dev/{loopdev}, which is mounted at {at}", path.display()),
            None => format!("{} backs the loop device /dev/{loopdev}", path.display()),
        });
    }
    None
}

/// (major, minor) and mount point of every mount (/proc/self/mountinfo fields 3 and 5).
fn mounted_devices() -> Vec<((u32, u32), String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((parse_majmin(f.get(2)?)?, f.get(4)?.to_string()))
        })
        .collect()
}

fn parse_majmin(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Partitions of the block device at sysfs dir `sys`: (major, minor, /dev name).
fn partitions(sys: &str) -> Vec<(u32, u32, String)> {
    read_dir_names(sys)
        .into_iter()
        .filter(|n| Path::new(&format!("{sys}/{n}/partition")).exists())
        .filter_map(|n| {
            let d = std::fs::read_to_string(format!("{sys}/{n}/dev")).ok()?;
            let (ma, mi) = parse_majmin(d.trim())?;
            Some((ma, mi, format!("/dev/{n}")))
        })
        .collect()
}

fn read_dir_names(dir: &str) -> Vec<String> {
    std::fs::read_dir(dir).map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::fault::MemDevice;

    fn with(bytes: &[(usize, &[u8])]) -> MemDevice {
        let d = MemDevice::new(16 << 20);
        for (off, b) in bytes {
            d.write_at(b, *off as u64).unwrap();
        }
        d
    }

    #[test]
    fn each_signature_is_named() {
        assert_eq!(find_signature(&with(&[])), None);
        assert_eq!(find_signature(&with(&[(1080, &[0x53, 0xEF])])), Some("ext2/ext3/ext4 file system"));
        assert_eq!(find_signature(&with(&[(0, b"XFSB")])), Some("xfs file system"));
        assert_eq!(find_signature(&with(&[(65600, b"_BHRfS_M")])), Some("btrfs file system"));
        assert_eq!(find_signature(&with(&[(4086, b"SWAPSPACE2")])), Some("swap area"));
        assert_eq!(find_signature(&with(&[(512, b"EFI PART")])), Some("GPT partition table"));
        assert_eq!(find_signature(&with(&[(0, b"LUKS\xba\xbe")])), Some("LUKS encrypted volume"));
        assert_eq!(find_signature(&with(&[(510, &[0x55, 0xAA])])), None, "0x55AA without a partition entry");
        assert_eq!(find_signature(&with(&[(510, &[0x55, 0xAA]), (446 + 4, &[0x83])])), Some("DOS (MBR) partition table"));
        assert_eq!(find_signature(&with(&[(ZFS_UB_AT as usize, &ZFS_UB_MAGIC.to_le_bytes())])), Some("ZFS pool member"));
    }

    #[test]
    fn a_plain_file_is_not_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        assert_eq!(in_use_by_system(&p), None);
        assert!(mounted_devices().iter().any(|(_, at)| at == "/"), "mountinfo parses");
    }
}
