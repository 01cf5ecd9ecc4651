//! Untrusted bytes never panic the parsers (PDU frames, text keys, login keys, CDBs,
//! MODE SELECT parameter lists), nor a connection fed arbitrary bytes after a valid
//! login or instead of one.

use std::sync::Arc;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zilla_frontend::volume::MemVolume;
use zilla_frontend::StaticRegistry;
use zilla_iscsi::login::Negotiation;
use zilla_iscsi::pdu::{self, op, Bhs, Digests};
use zilla_iscsi::scsi::{self, Geometry};
use zilla_iscsi::{IscsiConfig, IscsiServer};

fn geometry(blocks: u64, read_only: bool) -> Geometry {
    Geometry {
        blocks,
        volume_block_bytes: 16384,
        read_only,
        thin: true,
        transfer_max_bytes: 32 << 20,
        naa: 0x3000_0000_0000_0001,
        serial: "0000000000000001".into(),
        target_name: "iqn.2026-11.io.zilla:tank.vol".into(),
    }
}

proptest! {
    #[test]
    fn chap_keys_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), open: bool) {
        use zilla_iscsi::auth::{decode_binary, Credential, TargetAuth};
        use zilla_iscsi::security::{requirement, SecurityStage};
        let keys = pdu::parse_text(&bytes);
        for (_, value) in &keys {
            let _ = decode_binary(value, 1024);
        }
        let entry = TargetAuth {
            chap: Credential::new("alice", b"secretpass12").ok(),
            mutual: Credential::new("tgt", b"targetsecret34").ok(),
            initiators: vec![],
        };
        let mut stage = SecurityStage::with_challenge(requirement(&entry, open), 1, [7; 16]);
        for _ in 0..3 {
            if stage.offer(&keys).is_err() {
                break;
            }
        }
        // garbage never authenticates
        prop_assert!(!stage.passed());
    }

    #[test]
    fn chap_values_never_panic(text in "(0[xXbB])?[0-9a-zA-Z+/=]{0,80}") {
        if let Some(bytes) = zilla_iscsi::auth::decode_binary(&text, 32) {
            prop_assert!(!bytes.is_empty() && bytes.len() <= 32);
        }
    }

    #[test]
    fn frames_and_text_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), max in 0usize..70000, h: bool, d: bool) {
        let digests = Digests { header: h, data: d };
        if let Ok(Some(layout)) = pdu::parse_frame(&bytes, digests, max) {
            prop_assert!(layout.data_bytes <= max);
            prop_assert!(layout.total_bytes >= layout.data_at + layout.data_bytes);
            let _ = pdu::data_digest_ok(&bytes, &layout, digests);
        }
        let keys = pdu::parse_text(&bytes);
        let mut n = Negotiation::new(&IscsiConfig::default());
        let _ = n.declare(&keys);
        let _ = n.offer(&keys, 0, false);
        let _ = n.declare(&keys);
        let _ = n.offer(&keys, 1, true);
        let _ = n.check_required();
    }

    #[test]
    fn cdbs_never_panic_and_stay_in_range(cdb in proptest::collection::vec(any::<u8>(), 0..20), blocks in 0u64..u64::MAX, lun0: bool, ro: bool) {
        let g = geometry(blocks, ro);
        match scsi::decode(&cdb, lun0, &g) {
            Ok(scsi::Operation::Read { lba, blocks: n, .. }) | Ok(scsi::Operation::Write { lba, blocks: n, .. }) => {
                prop_assert!(lba + u64::from(n) <= blocks);
                prop_assert!(u64::from(n) * 512 <= 32 << 20);
            }
            Ok(scsi::Operation::ModeSense { ten, dbd, llbaa, page_control, page, subpage, allocation }) => {
                if let Ok(data) = scsi::mode_sense(&g, true, ten, dbd, llbaa, page_control, page, subpage, allocation) {
                    prop_assert!(data.len() <= allocation as usize);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn mode_select_lists_never_panic(params in proptest::collection::vec(any::<u8>(), 0..64), ten: bool, wce: bool) {
        let _ = scsi::mode_select(&params, ten, wce);
        let g = geometry(4096, false);
        if let Ok(ranges) = zilla_iscsi::thin::unmap_ranges(&params, &g) {
            prop_assert!(ranges.iter().all(|&(lba, n)| lba + n <= 4096));
        }
    }
}

fn login_pdu() -> Vec<u8> {
    let mut bhs = Bhs::new(op::LOGIN, false);
    bhs.0[0] |= 0x40;
    bhs.0[1] = 0x80 | (1 << 2) | 3;
    let text = b"InitiatorName=iqn.x\0TargetName=iqn.2026-11.io.zilla:tank.vol\0MaxRecvDataSegmentLength=4096\0";
    bhs.set_data_segment_bytes(text.len());
    let mut bytes = bhs.0.to_vec();
    bytes.extend_from_slice(text);
    bytes.resize(48 + pdu::padded(text.len()), 0);
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn connections_survive_arbitrary_bytes(garbage in proptest::collection::vec(any::<u8>(), 0..2000), logged_in: bool, opcode in 0u8..0x40) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let mut registry = StaticRegistry::new();
            registry.insert("tank/vol", "", Arc::new(MemVolume::new("tank/vol", 1 << 20, 4096)));
            let server = IscsiServer::new(Arc::new(registry), IscsiConfig::default());
            let (mut client, served) = tokio::io::duplex(1 << 16);
            let (_stop_tx, stop) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(async move { server.serve_stream(served, None, stop).await });
            let mut bytes = if logged_in { login_pdu() } else { Vec::new() };
            // a header with a chosen opcode and a small length, then garbage
            let mut bhs = Bhs::new(opcode, true);
            bhs.0[4] = garbage.first().copied().unwrap_or(0) % 4;
            bhs.set_data_segment_bytes(garbage.len().min(300));
            bytes.extend_from_slice(&bhs.0);
            bytes.extend_from_slice(&garbage);
            let _ = client.write_all(&bytes).await;
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_to_end(&mut sink)).await;
            drop(client);
            let joined = tokio::time::timeout(std::time::Duration::from_secs(10), task).await;
            assert!(matches!(joined, Ok(Ok(()))), "the connection task ended without a panic");
        });
    }
}
