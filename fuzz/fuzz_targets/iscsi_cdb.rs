//! Fuzz the SCSI CDB decoder and the MODE SELECT parameter-list parser: whatever
//! decodes as a read or write stays inside the unit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zilla_iscsi::scsi::{self, Geometry, Operation};

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let (head, rest) = data.split_at(9);
    let blocks = u64::from_le_bytes(head[..8].try_into().unwrap_or([0; 8]));
    let knobs = head[8];
    let g = Geometry {
        blocks,
        volume_block_bytes: 16384,
        read_only: knobs & 1 != 0,
        thin: knobs & 16 != 0,
        transfer_max_bytes: 32 << 20,
        naa: 0x3000_0000_0000_0001,
        serial: "0000000000000001".into(),
        target_name: "iqn.2026-11.io.zilla:tank.vol".into(),
    };
    let (cdb, params) = rest.split_at(rest.len().min(16));
    match scsi::decode(cdb, knobs & 2 != 0, &g) {
        Ok(Operation::Read { lba, blocks: n, .. }) | Ok(Operation::Write { lba, blocks: n, .. }) => {
            assert!(lba.checked_add(u64::from(n)).is_some_and(|end| end <= blocks));
        }
        _ => {}
    }
    let _ = scsi::mode_select(params, knobs & 4 != 0, knobs & 8 != 0);
    if let Ok(ranges) = zilla_iscsi::thin::unmap_ranges(params, &g) {
        assert!(ranges.iter().all(|&(lba, n)| lba.checked_add(n).is_some_and(|end| end <= blocks)));
    }
});
