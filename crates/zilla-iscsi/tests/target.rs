//! The target in process, over a duplex stream, against MemVolumes: a small initiator
//! built from the crate's own PDU encoders drives login, discovery, R2T writes,
//! Data-In reads, MODE SELECT, the CmdSN window and malformed input.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use zilla_frontend::volume::MemVolume;
use zilla_frontend::{ExportRegistry, StaticRegistry};
use zilla_iscsi::pdu::{self, op, Bhs, BHS_BYTES};
use zilla_iscsi::{IscsiConfig, IscsiServer};

const TIMEOUT: Duration = Duration::from_secs(10);

struct Initiator {
    stream: DuplexStream,
    cmd_sn: u32,
    itt: u32,
    header_digest: bool,
}

struct Response {
    bhs: Bhs,
    data: Vec<u8>,
}

fn start(volume_bytes: u64) -> (Initiator, watch::Sender<bool>) {
    let mut registry = StaticRegistry::new();
    registry.insert("tank/vol", "", Arc::new(MemVolume::new("tank/vol", volume_bytes, 16384)));
    registry.insert("tank/Other_Vol", "", Arc::new(MemVolume::new("tank/Other_Vol", 1 << 20, 4096)));
    let server = IscsiServer::new(Arc::new(registry), IscsiConfig { command_window: 8, ..IscsiConfig::default() });
    let (client, served) = tokio::io::duplex(1 << 20);
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move { server.serve_stream(served, Some("10.0.0.1:3260".into()), stop).await });
    (Initiator { stream: client, cmd_sn: 1, itt: 1, header_digest: false }, stop_tx)
}

impl Initiator {
    async fn send(&mut self, mut bhs: Bhs, data: &[u8]) {
        bhs.set_data_segment_bytes(data.len());
        let mut bytes = bhs.0.to_vec();
        if self.header_digest {
            bytes.extend_from_slice(&pdu::crc32c(&bhs.0).to_le_bytes());
        }
        bytes.extend_from_slice(data);
        bytes.resize(bytes.len() + pdu::padded(data.len()) - data.len(), 0);
        self.stream.write_all(&bytes).await.unwrap();
    }

    async fn receive(&mut self) -> Option<Response> {
        let mut bhs = Bhs::default();
        match tokio::time::timeout(TIMEOUT, self.stream.read_exact(&mut bhs.0)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return None,
            Err(_) => panic!("no PDU within {TIMEOUT:?}"),
        }
        if self.header_digest {
            let mut digest = [0u8; 4];
            self.stream.read_exact(&mut digest).await.unwrap();
            assert_eq!(u32::from_le_bytes(digest), pdu::crc32c(&bhs.0), "header digest");
        }
        let mut data = vec![0; pdu::padded(bhs.data_segment_bytes())];
        self.stream.read_exact(&mut data).await.unwrap();
        data.truncate(bhs.data_segment_bytes());
        Some(Response { bhs, data })
    }

    async fn login(&mut self, keys: &[(&str, &str)]) -> Response {
        let mut bhs = Bhs::new(op::LOGIN, false);
        bhs.0[0] |= 0x40;
        bhs.0[1] = 0x80 | (1 << 2) | 3; // T, operational -> full feature
        bhs.0[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0, 1]);
        bhs.set_u32(16, 0);
        bhs.set_u32(24, self.cmd_sn);
        let pairs: Vec<(String, String)> = keys.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.send(bhs, &pdu::encode_text(&pairs)).await;
        self.receive().await.expect("login response")
    }

    fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }

    /// A SCSI command; returns its ITT.
    async fn command(&mut self, cdb: &[u8], expected: u32, read: bool, write: bool, final_bit: bool, immediate: &[u8]) -> u32 {
        let itt = self.next_itt();
        let mut bhs = Bhs::new(op::SCSI_COMMAND, final_bit);
        if read {
            bhs.0[1] |= 0x40;
        }
        if write {
            bhs.0[1] |= 0x20;
        }
        bhs.set_u32(16, itt);
        bhs.set_u32(20, expected);
        bhs.set_u32(24, self.cmd_sn);
        self.cmd_sn += 1;
        bhs.0[32..32 + cdb.len()].copy_from_slice(cdb);
        self.send(bhs, immediate).await;
        itt
    }

    async fn data_out(&mut self, itt: u32, ttt: u32, data_sn: u32, offset: u32, data: &[u8], final_bit: bool) {
        let mut bhs = Bhs::new(op::DATA_OUT, final_bit);
        bhs.set_u32(16, itt);
        bhs.set_u32(20, ttt);
        bhs.set_u32(36, data_sn);
        bhs.set_u32(40, offset);
        self.send(bhs, data).await;
    }

    /// A task management request (`function`, referenced task `ref_itt`) and its
    /// response.
    async fn task_management(&mut self, function: u8, ref_itt: u32, ref_cmd_sn: u32) -> Response {
        let itt = self.next_itt();
        let mut bhs = Bhs::new(op::TASK_MANAGEMENT, true);
        bhs.0[1] = 0x80 | function;
        bhs.set_u32(16, itt);
        bhs.set_u32(20, ref_itt);
        bhs.set_u32(24, self.cmd_sn);
        self.cmd_sn += 1;
        bhs.set_u32(32, ref_cmd_sn);
        self.send(bhs, &[]).await;
        let r = self.receive().await.expect("a task management response");
        assert_eq!((r.bhs.opcode(), r.bhs.itt()), (op::TASK_MANAGEMENT_RESPONSE, itt), "the response to the request");
        r
    }

    /// Data-In until the status: (data, status, residual flags, residual).
    async fn read_status(&mut self) -> (Vec<u8>, u8, u8, u32, Vec<u8>) {
        let mut data = Vec::new();
        loop {
            let r = self.receive().await.expect("a response");
            match r.bhs.opcode() {
                op::DATA_IN => {
                    assert_eq!(r.bhs.u32_at(40) as usize, data.len(), "Data-In offsets in order");
                    data.extend_from_slice(&r.data);
                    if r.bhs.flags() & 0x01 != 0 {
                        return (data, r.bhs.0[3], r.bhs.flags() & 0x06, r.bhs.u32_at(44), Vec::new());
                    }
                }
                op::SCSI_RESPONSE => return (data, r.bhs.0[3], r.bhs.flags() & 0x06, r.bhs.u32_at(44), r.data),
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&blocks.to_be_bytes());
    c.push(0);
    c
}

fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

const NORMAL: &[(&str, &str)] = &[
    ("InitiatorName", "iqn.2026-11.test:init"),
    ("TargetName", "iqn.2026-11.io.zilla:tank.vol"),
    ("SessionType", "Normal"),
    ("ImmediateData", "Yes"),
    ("InitialR2T", "Yes"),
    ("MaxRecvDataSegmentLength", "8192"),
    ("MaxBurstLength", "16384"),
    ("FirstBurstLength", "8192"),
];

#[tokio::test]
async fn discovery_lists_every_volume_with_its_mapped_name() {
    let (mut i, _stop) = start(1 << 20);
    let r = i.login(&[("InitiatorName", "iqn.2026-11.test:init"), ("SessionType", "Discovery")]).await;
    assert_eq!((r.bhs.opcode(), r.bhs.0[36]), (op::LOGIN_RESPONSE, 0), "login accepted");
    assert_ne!(r.bhs.u16_at(14), 0, "a TSIH is assigned");
    let mut bhs = Bhs::new(op::TEXT, true);
    bhs.set_u32(16, 7);
    bhs.set_u32(20, pdu::NO_TAG);
    bhs.set_u32(24, i.cmd_sn);
    i.send(bhs, b"SendTargets=All\0").await;
    let r = i.receive().await.unwrap();
    assert_eq!(r.bhs.opcode(), op::TEXT_RESPONSE);
    let keys = pdu::parse_text(&r.data);
    let names: Vec<&str> = keys.iter().filter(|(k, _)| k == "TargetName").map(|(_, v)| v.as_str()).collect();
    assert_eq!(names, ["iqn.2026-11.io.zilla:tank.other-vol", "iqn.2026-11.io.zilla:tank.vol"]);
    assert!(keys.iter().any(|(k, v)| k == "TargetAddress" && v == "10.0.0.1:3260,1"));
    // logout closes
    let mut bhs = Bhs::new(op::LOGOUT, true);
    bhs.0[0] |= 0x40;
    bhs.set_u32(16, 8);
    i.send(bhs, &[]).await;
    let r = i.receive().await.unwrap();
    assert_eq!((r.bhs.opcode(), r.bhs.0[2]), (op::LOGOUT_RESPONSE, 0));
    assert!(i.receive().await.is_none(), "connection closed after the logout");
}

#[tokio::test]
async fn unknown_targets_and_missing_names_are_refused() {
    let (mut i, _stop) = start(1 << 20);
    let r = i.login(&[("InitiatorName", "iqn.x"), ("TargetName", "iqn.2026-11.io.zilla:tank.none")]).await;
    assert_eq!((r.bhs.0[36], r.bhs.0[37]), (2, 3), "target not found");
    let (mut i, _stop) = start(1 << 20);
    let r = i.login(&[("TargetName", "iqn.2026-11.io.zilla:tank.vol")]).await;
    assert_eq!((r.bhs.0[36], r.bhs.0[37]), (2, 7), "missing InitiatorName");
}

#[tokio::test]
async fn writes_through_r2t_read_back_with_data_in_and_residuals() {
    let (mut i, _stop) = start(4 << 20);
    let r = i.login(NORMAL).await;
    assert_eq!(r.bhs.0[36], 0);
    let answers = pdu::parse_text(&r.data);
    assert!(answers.iter().any(|(k, v)| k == "MaxBurstLength" && v == "16384"));
    // 40 KiB at LBA 7: 8 KiB immediate, then R2Ts of at most 16 KiB
    let payload: Vec<u8> = (0..40 * 1024).map(|n| (n * 7 % 251) as u8).collect();
    let itt = i.command(&write10(7, 80), payload.len() as u32, false, true, true, &payload[..8192]).await;
    let mut sent = 8192;
    while sent < payload.len() {
        let r = i.receive().await.unwrap();
        assert_eq!(r.bhs.opcode(), op::R2T, "an R2T for the rest");
        let (ttt, offset, len) = (r.bhs.u32_at(20), r.bhs.u32_at(40) as usize, r.bhs.u32_at(44) as usize);
        assert_eq!(offset, sent);
        assert!(len <= 16384);
        let mut data_sn = 0;
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(8192);
            i.data_out(itt, ttt, data_sn, at as u32, &payload[at..at + n], at + n == offset + len).await;
            data_sn += 1;
            at += n;
        }
        sent += len;
    }
    let (_, status, flags, _, _) = i.read_status().await;
    assert_eq!((status, flags), (0, 0), "write GOOD without residual");
    // read back with a larger expected length: underflow residual
    i.command(&read10(7, 80), payload.len() as u32 + 512, true, false, true, &[]).await;
    let (data, status, flags, residual, _) = i.read_status().await;
    assert_eq!(status, 0);
    assert_eq!(data, payload);
    assert_eq!((flags, residual), (0x02, 512), "underflow of 512");
    // expected below the command's length: overflow, only what was expected
    i.command(&read10(7, 2), 512, true, false, true, &[]).await;
    let (data, _, flags, residual, _) = i.read_status().await;
    assert_eq!((data.len(), flags, residual), (512, 0x04, 512));
    assert_eq!(data, payload[..512]);
}

#[tokio::test]
async fn errors_answer_check_condition_with_sense_and_residual() {
    let (mut i, _stop) = start(1 << 20);
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    // past the end: LBA OUT OF RANGE
    i.command(&read10(2048, 1), 512, true, false, true, &[]).await;
    let (_, status, flags, residual, sense) = i.read_status().await;
    assert_eq!(status, 2);
    assert_eq!((flags, residual), (0x02, 512));
    assert_eq!((sense[2 + 2] & 0x0f, sense[2 + 12]), (0x05, 0x21));
    // unknown opcode
    i.command(&[0xc7, 0, 0, 0, 0, 0], 0, false, false, true, &[]).await;
    let (_, status, _, _, sense) = i.read_status().await;
    assert_eq!((status, sense[2 + 12]), (2, 0x20));
    // a write whose Data-Out comes out of order fails with a data phase error
    let itt = i.command(&write10(0, 32), 16384, false, true, true, &[]).await;
    let r = i.receive().await.unwrap();
    assert_eq!(r.bhs.opcode(), op::R2T);
    i.data_out(itt, r.bhs.u32_at(20), 0, 4096, &[0u8; 4096], false).await;
    let (_, status, _, _, sense) = i.read_status().await;
    assert_eq!((status, sense[2 + 2] & 0x0f, sense[2 + 12]), (2, 0x0b, 0x4b));
}

#[tokio::test]
async fn mode_select_turns_the_write_cache_on() {
    let (mut i, _stop) = start(1 << 20);
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    let sense_wce = |data: &[u8]| data[4 + usize::from(data[3]) + 2] & 0x04 != 0;
    i.command(&[0x1a, 0, 0x08, 0, 255, 0], 255, true, false, true, &[]).await;
    let (data, ..) = i.read_status().await;
    assert!(!sense_wce(&data), "wce off by default");
    let mut params = vec![0u8, 0, 0, 0, 0x08, 0x12, 0x04];
    params.resize(4 + 20, 0);
    i.command(&[0x15, 0x10, 0, 0, params.len() as u8, 0], params.len() as u32, false, true, true, &params).await;
    let (_, status, ..) = i.read_status().await;
    assert_eq!(status, 0, "MODE SELECT accepted");
    i.command(&[0x1a, 0, 0x08, 0, 255, 0], 255, true, false, true, &[]).await;
    let (data, ..) = i.read_status().await;
    assert!(sense_wce(&data), "wce on after MODE SELECT");
}

#[tokio::test]
async fn commands_outside_the_cmdsn_window_are_dropped() {
    let (mut i, _stop) = start(1 << 20);
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    // a TEST UNIT READY far beyond MaxCmdSN: no answer
    i.cmd_sn += 100;
    i.command(&[0, 0, 0, 0, 0, 0], 0, false, false, true, &[]).await;
    i.cmd_sn -= 101;
    // a NOP-Out in the window is answered, showing the window did not move
    let mut bhs = Bhs::new(op::NOP_OUT, true);
    bhs.set_u32(16, 99);
    bhs.set_u32(20, pdu::NO_TAG);
    bhs.set_u32(24, i.cmd_sn);
    i.send(bhs, b"ping").await;
    let r = i.receive().await.unwrap();
    assert_eq!((r.bhs.opcode(), r.bhs.itt()), (op::NOP_IN, 99), "the dropped command got no answer");
    assert_eq!(r.data, b"ping");
    assert_eq!(r.bhs.u32_at(28), i.cmd_sn + 1, "ExpCmdSN counts the NOP-Out only");
    assert_eq!(r.bhs.u32_at(32), i.cmd_sn + 8, "MaxCmdSN: the window of 8");
}

#[tokio::test]
async fn header_digests_are_negotiated_and_checked() {
    let (mut i, _stop) = start(1 << 20);
    let mut keys = NORMAL.to_vec();
    keys.push(("HeaderDigest", "CRC32C,None"));
    let r = i.login(&keys).await;
    assert!(pdu::parse_text(&r.data).iter().any(|(k, v)| k == "HeaderDigest" && v == "CRC32C"));
    i.header_digest = true;
    i.command(&[0, 0, 0, 0, 0, 0], 0, false, false, true, &[]).await;
    let (_, status, ..) = i.read_status().await;
    assert_eq!(status, 0);
    // a wrong header digest closes the connection
    let mut bhs = Bhs::new(op::SCSI_COMMAND, true);
    bhs.set_u32(24, i.cmd_sn);
    let mut bytes = bhs.0.to_vec();
    bytes.extend_from_slice(&[1, 2, 3, 4]);
    i.stream.write_all(&bytes).await.unwrap();
    assert!(i.receive().await.is_none(), "closed on a bad header digest");
}

#[tokio::test]
async fn oversized_data_segments_close_the_connection() {
    let (mut i, _stop) = start(1 << 20);
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    let mut bhs = Bhs::new(op::NOP_OUT, true);
    bhs.set_u32(16, 1);
    bhs.set_data_segment_bytes(pdu::DATA_SEGMENT_FIELD_MAX);
    i.stream.write_all(&bhs.0[..BHS_BYTES]).await.unwrap();
    assert!(i.receive().await.is_none(), "closed on a data segment above MaxRecvDataSegmentLength");
}

/// A registry that keeps volume properties, as the daemon's does.
struct PropertyRegistry {
    inner: StaticRegistry,
    properties: std::sync::Mutex<Vec<(String, String, String)>>,
}

impl zilla_frontend::ExportRegistry for PropertyRegistry {
    fn list(&self) -> Vec<zilla_frontend::ExportInfo> {
        self.inner.list()
    }
    fn open(&self, name: &str) -> Option<Arc<dyn zilla_frontend::volume::BlockVolume>> {
        self.inner.open(name)
    }
    fn property(&self, name: &str, property: &str) -> Option<String> {
        let set = self.properties.lock().unwrap();
        set.iter().rev().find(|(n, p, _)| n == name && p == property).map(|(_, _, v)| v.clone())
    }
    fn set_property(&self, name: &str, property: &str, value: &str) -> Result<(), String> {
        self.properties.lock().unwrap().push((name.into(), property.into(), value.into()));
        Ok(())
    }
}

#[tokio::test]
async fn a_wce_change_is_saved_and_the_next_session_sees_it() {
    let registry = Arc::new(PropertyRegistry {
        inner: StaticRegistry::new().with("tank/vol", Arc::new(MemVolume::new("tank/vol", 1 << 20, 16384))),
        properties: Default::default(),
    });
    let server = IscsiServer::new(registry.clone(), IscsiConfig::default());
    let (_stop_tx, stop) = watch::channel(false);
    let connect = || {
        let (client, served) = tokio::io::duplex(1 << 20);
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move { server.serve_stream(served, None, stop).await });
        Initiator { stream: client, cmd_sn: 1, itt: 1, header_digest: false }
    };
    let mut i = connect();
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    let mut params = vec![0u8, 0, 0, 0, 0x08, 0x12, 0x04];
    params.resize(4 + 20, 0);
    i.command(&[0x15, 0x10, 0, 0, params.len() as u8, 0], params.len() as u32, false, true, true, &params).await;
    assert_eq!(i.read_status().await.1, 0);
    assert_eq!(registry.property("tank/vol", "wce").as_deref(), Some("on"), "saved as the wce property");
    // a new session starts with the saved setting
    let mut j = connect();
    assert_eq!(j.login(NORMAL).await.bhs.0[36], 0);
    j.command(&[0x5a, 0x08, 0x08, 0, 0, 0, 0, 0, 255, 0], 255, true, false, true, &[]).await;
    let (data, status, ..) = j.read_status().await;
    assert_eq!(status, 0);
    assert_eq!(data[8 + 2] & 0x04, 0x04, "MODE SENSE 10 shows WCE on");
}

/// Writes that together exceed the connection's share of the memory budget: the
/// reader waits for budget for the third while it takes in the first two's data, so
/// all complete (no deadlock) and read back.
#[tokio::test]
async fn writes_beyond_the_memory_share_wait_and_complete() {
    let config = zilla_frontend::FrontendConfig {
        memory_budget_bytes: 72 << 20,
        memory_reserve_bytes: 32 << 20,
        memory_per_connection_max_bytes: 40 << 20,
        ..zilla_frontend::FrontendConfig::default()
    };
    config.validate().unwrap();
    let registry = StaticRegistry::new().with("tank/vol", Arc::new(MemVolume::new("tank/vol", 64 << 20, 16384)));
    let frontend = zilla_frontend::Frontend::new(Arc::new(registry), config);
    let server = IscsiServer::with_frontend(frontend.clone(), IscsiConfig::default());
    let (client, served) = tokio::io::duplex(1 << 20);
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move { server.serve_stream(served, None, stop).await });
    let mut i = Initiator { stream: client, cmd_sn: 1, itt: 1, header_digest: false };
    let mut keys = NORMAL.to_vec();
    keys.retain(|(k, _)| *k != "MaxBurstLength" && *k != "MaxRecvDataSegmentLength");
    keys.push(("MaxBurstLength", "8388608"));
    assert_eq!(i.login(&keys).await.bhs.0[36], 0);
    const WRITE_BYTES: usize = 16 << 20;
    let blocks = (WRITE_BYTES / 512) as u32;
    let mut itts = Vec::new();
    for n in 0..3u32 {
        let mut cdb = vec![0x8a, 0];
        cdb.extend_from_slice(&u64::from(n * blocks).to_be_bytes());
        cdb.extend_from_slice(&blocks.to_be_bytes());
        cdb.extend_from_slice(&[0, 0]);
        itts.push(i.command(&cdb, WRITE_BYTES as u32, false, true, true, &[]).await);
    }
    let fill = |itt: u32| (itt % 251) as u8;
    let mut done = 0;
    while done < 3 {
        let r = i.receive().await.expect("a PDU");
        match r.bhs.opcode() {
            op::R2T => {
                let (itt, ttt, offset, len) = (r.bhs.itt(), r.bhs.u32_at(20), r.bhs.u32_at(40) as usize, r.bhs.u32_at(44) as usize);
                let chunk = vec![fill(itt); 32 << 10];
                let mut at = 0;
                let mut data_sn = 0;
                while at < len {
                    let n = (len - at).min(chunk.len());
                    i.data_out(itt, ttt, data_sn, (offset + at) as u32, &chunk[..n], at + n == len).await;
                    at += n;
                    data_sn += 1;
                }
            }
            op::SCSI_RESPONSE => {
                assert_eq!(r.bhs.0[3], 0, "write GOOD");
                done += 1;
            }
            other => panic!("unexpected opcode {other:#x}"),
        }
    }
    for (n, &itt) in itts.iter().enumerate() {
        i.command(&read10((n as u32 * blocks) + blocks - 8, 8), 4096, true, false, true, &[]).await;
        let (data, status, ..) = i.read_status().await;
        assert_eq!(status, 0);
        assert!(data.iter().all(|&b| b == fill(itt)), "write {n} read back");
    }
    assert!(frontend.memory.stats().waits > 0, "the third write waited for the memory budget");
}

#[tokio::test]
async fn task_management_aborts_writes_waiting_for_data_and_frees_their_window_slots() {
    let (mut i, _stop) = start(4 << 20);
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    // a 32 KiB WRITE sent without data: the target asks for it with an R2T and waits
    let payload = vec![0xABu8; 32 << 10];
    let itt = i.command(&write10(0, 64), payload.len() as u32, false, true, true, &[]).await;
    let r2t = i.receive().await.unwrap();
    assert_eq!(r2t.bhs.opcode(), op::R2T);
    let r = i.task_management(1, itt, i.cmd_sn - 1).await;
    assert_eq!(r.bhs.0[2], 0, "ABORT TASK of a write waiting for data: function complete");
    // its window slot is free again: MaxCmdSN is ExpCmdSN + 7 (a window of 8, nothing in flight)
    assert_eq!(r.bhs.u32_at(32), r.bhs.u32_at(28).wrapping_add(7), "the aborted write still holds a window slot");
    // Data-Out for it now is ignored; it never answers and wrote nothing
    i.data_out(itt, r2t.bhs.u32_at(20), 0, 0, &payload[..8192], false).await;
    let read = i.command(&read10(0, 64), payload.len() as u32, true, false, true, &[]).await;
    let first = i.receive().await.unwrap();
    assert_eq!((first.bhs.opcode(), first.bhs.itt()), (op::DATA_IN, read), "the aborted write answered");
    let mut data = first.data.clone();
    let mut last = first;
    while last.bhs.flags() & 0x01 == 0 {
        last = i.receive().await.unwrap();
        data.extend_from_slice(&last.data);
    }
    assert!(data.iter().all(|&b| b == 0), "the aborted write reached the volume");
    // a task that was answered already: task does not exist
    let r = i.task_management(1, read, i.cmd_sn - 2).await;
    assert_eq!(r.bhs.0[2], 1, "ABORT TASK of an answered command");
    // LOGICAL UNIT RESET drops every write waiting for data
    let a = i.command(&write10(0, 64), payload.len() as u32, false, true, true, &[]).await;
    let b = i.command(&write10(64, 64), payload.len() as u32, false, true, true, &[]).await;
    for _ in 0..2 {
        assert_eq!(i.receive().await.unwrap().bhs.opcode(), op::R2T);
    }
    let r = i.task_management(5, 0, 0).await;
    assert_eq!(r.bhs.0[2], 0, "LUN RESET: function complete");
    assert_eq!(r.bhs.u32_at(32), r.bhs.u32_at(28).wrapping_add(7), "the reset writes still hold window slots");
    let _ = (a, b);
    // unsupported functions say so
    assert_eq!(i.task_management(7, 0, 0).await.bhs.0[2], 5, "TARGET COLD RESET: not supported");
    assert_eq!(i.task_management(8, itt, 0).await.bhs.0[2], 4, "TASK REASSIGN: allegiance reassignment not supported");
}

/// Two initiators on one volume: a persistent reservation by one fences the other's
/// writes (RESERVATION CONFLICT), reads stay open; MODE SELECT and a LUN reset reach
/// the other session as unit attentions; with APTPL the state is stored as the volume's
/// internal property and a restarted target loads it.
#[tokio::test]
async fn persistent_reservations_fence_other_sessions_and_persist_with_aptpl() {
    let registry = Arc::new(PropertyRegistry {
        inner: StaticRegistry::new().with("tank/vol", Arc::new(MemVolume::new("tank/vol", 1 << 20, 16384))),
        properties: Default::default(),
    });
    let (_stop_tx, stop) = watch::channel(false);
    let connect = |server: &IscsiServer| {
        let (client, served) = tokio::io::duplex(1 << 20);
        let (server, stop) = (server.clone(), stop.clone());
        tokio::spawn(async move { server.serve_stream(served, None, stop).await });
        Initiator { stream: client, cmd_sn: 1, itt: 1, header_digest: false }
    };
    let as_initiator = |name: &'static str| {
        let mut keys = NORMAL.to_vec();
        keys[0] = ("InitiatorName", name);
        keys
    };
    let server = IscsiServer::new(registry.clone(), IscsiConfig::default());
    let mut a = connect(&server);
    assert_eq!(a.login(&as_initiator("iqn.2026-11.test:a")).await.bhs.0[36], 0);
    let mut b = connect(&server);
    assert_eq!(b.login(&as_initiator("iqn.2026-11.test:b")).await.bhs.0[36], 0);
    let pr_out = |service_action: u8, kind: u8| [0x5f, service_action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut params = [0u8; 24];
    params[8..16].copy_from_slice(&0xa_u64.to_be_bytes());
    params[20] = 0x01; // APTPL
    a.command(&pr_out(6, 0), 24, false, true, true, &params).await;
    assert_eq!(a.read_status().await.1, 0, "REGISTER AND IGNORE EXISTING KEY");
    let mut params = [0u8; 24];
    params[..8].copy_from_slice(&0xa_u64.to_be_bytes());
    a.command(&pr_out(1, 1), 24, false, true, true, &params).await;
    assert_eq!(a.read_status().await.1, 0, "RESERVE, Write Exclusive");
    let stored = registry.property("tank/vol", "_iscsi_pr").expect("the APTPL state is stored");
    assert!(stored.starts_with("zpr1 1 1 0 000000000000000a="), "{stored}");

    b.command(&write10(0, 1), 512, false, true, true, &[7u8; 512]).await;
    assert_eq!(b.read_status().await.1, 0x18, "B's WRITE: RESERVATION CONFLICT");
    b.command(&read10(0, 1), 512, true, false, true, &[]).await;
    assert_eq!(b.read_status().await.1, 0, "B's READ under Write Exclusive");
    a.command(&write10(0, 1), 512, false, true, true, &[7u8; 512]).await;
    assert_eq!(a.read_status().await.1, 0, "the holder writes");

    // MODE SELECT by A: B hears of it once, then runs
    let mut mode = vec![0u8, 0, 0, 0, 0x08, 0x12, 0x04];
    mode.resize(4 + 20, 0);
    a.command(&[0x15, 0x10, 0, 0, mode.len() as u8, 0], mode.len() as u32, false, true, true, &mode).await;
    assert_eq!(a.read_status().await.1, 0);
    b.command(&[0x12, 0, 0, 0, 36, 0], 36, true, false, true, &[]).await;
    assert_eq!(b.read_status().await.1, 0, "INQUIRY does not report a unit attention");
    b.command(&[0; 6], 0, false, false, true, &[]).await;
    let (_, status, _, _, sense) = b.read_status().await;
    assert_eq!((status, sense[2 + 2] & 0x0f, sense[2 + 12], sense[2 + 13]), (2, 6, 0x2a, 0x01), "MODE PARAMETERS CHANGED");
    b.command(&[0; 6], 0, false, false, true, &[]).await;
    assert_eq!(b.read_status().await.1, 0, "reported once");
    a.command(&[0; 6], 0, false, false, true, &[]).await;
    assert_eq!(a.read_status().await.1, 0, "not to the session that changed it");

    // a LUN reset: every session hears of it; the persistent reservation stays
    assert_eq!(b.task_management(5, 0, 0).await.bhs.0[2], 0);
    for i in [&mut a, &mut b] {
        i.command(&[0; 6], 0, false, false, true, &[]).await;
        let (_, status, _, _, sense) = i.read_status().await;
        assert_eq!((status, sense[2 + 12], sense[2 + 13]), (2, 0x29, 0x03), "BUS DEVICE RESET FUNCTION OCCURRED");
    }

    // a restarted target loads the stored state
    let restarted = IscsiServer::new(registry.clone(), IscsiConfig::default());
    let mut c = connect(&restarted);
    assert_eq!(c.login(&as_initiator("iqn.2026-11.test:c")).await.bhs.0[36], 0);
    c.command(&[0x5e, 1, 0, 0, 0, 0, 0, 0, 64, 0], 64, true, false, true, &[]).await;
    let (data, status, ..) = c.read_status().await;
    assert_eq!(status, 0);
    assert_eq!((&data[8..16], data[21]), (&0xa_u64.to_be_bytes()[..], 1), "A's Write Exclusive reservation, loaded");
    c.command(&write10(0, 1), 512, false, true, true, &[7u8; 512]).await;
    assert_eq!(c.read_status().await.1, 0x18, "still fenced after the restart");
}

/// A target on one 1 MiB MemVolume with `config`, its front end, and an initiator.
fn start_with(config: IscsiConfig) -> (Initiator, Arc<zilla_frontend::Frontend>, watch::Sender<bool>) {
    let registry = StaticRegistry::new().with("tank/vol", Arc::new(MemVolume::new("tank/vol", 1 << 20, 4096)));
    let frontend = zilla_frontend::Frontend::new(Arc::new(registry), zilla_frontend::FrontendConfig::default());
    let server = IscsiServer::with_frontend(frontend.clone(), config);
    let (client, served) = tokio::io::duplex(1 << 20);
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move { server.serve_stream(served, None, stop).await });
    (Initiator { stream: client, cmd_sn: 1, itt: 1, header_digest: false }, frontend, stop_tx)
}

async fn test_unit_ready_is_good(i: &mut Initiator) {
    let itt = i.command(&[0; 6], 0, false, false, true, &[]).await;
    let r = i.receive().await.expect("the session goes on");
    assert_eq!((r.bhs.opcode(), r.bhs.itt(), r.bhs.0[3]), (op::SCSI_RESPONSE, itt, 0), "TEST UNIT READY answered GOOD next");
}

/// A Data-Out for a tag no command has is answered with a Reject (invalid PDU field)
/// and the session goes on; one for a command that ended before its unsolicited data
/// (refused, aborted) is dropped without an answer.
#[tokio::test]
async fn a_data_out_for_no_command_is_rejected_and_stragglers_are_dropped() {
    let (mut i, _frontend, _stop) = start_with(IscsiConfig::default());
    let mut keys = NORMAL.to_vec();
    keys.retain(|(k, _)| *k != "InitialR2T");
    keys.push(("InitialR2T", "No"));
    assert_eq!(i.login(&keys).await.bhs.0[36], 0);
    i.data_out(0x7777, 0xffff_ffff, 0, 0, &[0xab; 512], true).await;
    let r = i.receive().await.expect("a Reject");
    assert_eq!((r.bhs.opcode(), r.bhs.0[2]), (op::REJECT, 0x09), "Reject, invalid PDU field");
    assert_eq!(r.data.len(), BHS_BYTES);
    assert_eq!(Bhs(r.data[..BHS_BYTES].try_into().unwrap()).itt(), 0x7777, "the Reject carries the rejected header");
    test_unit_ready_is_good(&mut i).await;
    // a WRITE beyond the end whose unsolicited Data-Out follows (no F bit): refused, its
    // Data-Out dropped
    let itt = i.command(&write10(4096, 2), 1024, false, true, false, &[0xcd; 512]).await;
    let (_, status, ..) = i.read_status().await;
    assert_eq!(status, 2, "LBA out of range");
    i.data_out(itt, 0xffff_ffff, 0, 512, &[0xcd; 512], true).await;
    test_unit_ready_is_good(&mut i).await;
}

/// A command with both R and W set is refused: CHECK CONDITION, ILLEGAL REQUEST,
/// INVALID FIELD IN CDB, and nothing is written.
#[tokio::test]
async fn a_bidirectional_command_is_refused_with_invalid_field_in_cdb() {
    let (mut i, _frontend, _stop) = start_with(IscsiConfig::default());
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    i.command(&write10(0, 1), 512, true, true, true, &[0xee; 512]).await;
    let (_, status, _, _, sense) = i.read_status().await;
    assert_eq!(status, 2, "CHECK CONDITION");
    // sense data: 2 length bytes, then fixed format (key at 2, ASC/ASCQ at 12/13)
    assert_eq!((sense[2 + 2] & 0x0f, sense[2 + 12], sense[2 + 13]), (0x05, 0x24, 0x00), "ILLEGAL REQUEST, INVALID FIELD IN CDB");
    i.command(&read10(0, 1), 512, true, false, true, &[]).await;
    let (data, status, ..) = i.read_status().await;
    assert_eq!(status, 0);
    assert!(data.iter().all(|&b| b == 0), "the bidirectional WRITE wrote");
}

/// A WRITE whose Data-Out stops halfway through the R2T's burst: after the data-out
/// timeout the connection ends and the budget the command held returns.
#[tokio::test]
async fn a_write_whose_data_out_stops_ends_the_connection_after_the_timeout() {
    let config = IscsiConfig { data_out_timeout: Duration::from_millis(400), ..IscsiConfig::default() };
    let (mut i, frontend, _stop) = start_with(config);
    assert_eq!(i.login(NORMAL).await.bhs.0[36], 0);
    let itt = i.command(&write10(0, 16), 8192, false, true, true, &[]).await;
    let r2t = i.receive().await.unwrap();
    assert_eq!(r2t.bhs.opcode(), op::R2T);
    // a steady trickle within the timeout keeps the command alive
    for n in 0..3u32 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        i.data_out(itt, r2t.bhs.u32_at(20), n, n * 512, &[0x11; 512], false).await;
    }
    assert!(frontend.memory.stats().in_use > 0, "the waiting write holds budget");
    let started = std::time::Instant::now();
    assert!(i.receive().await.is_none(), "the connection ends");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(5), "closed after {waited:?}");
    for _ in 0..100 {
        if frontend.memory.stats().in_use == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(frontend.memory.stats().in_use, 0, "the stalled write's budget returned");
}
