//! Logins against the target in process, over a duplex stream: CHAP (one-way and
//! mutual), initiator lists, discovery with the default entry, a store replaced while
//! serving, and the session listing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;
use zilla_frontend::volume::MemVolume;
use zilla_frontend::StaticRegistry;
use zilla_iscsi::auth::{chap_response, decode_binary, encode_hex, AuthStore, Credential, TargetAuth};
use zilla_iscsi::pdu::{self, op, Bhs};
use zilla_iscsi::{IscsiConfig, IscsiServer};

const TIMEOUT: Duration = Duration::from_secs(10);
const TARGET: &str = "iqn.2026-11.io.zilla:tank.vol";
const INITIATOR: &str = "iqn.2026-11.org.example:host1";
const SECRET: &[u8] = b"secretpass12";
const TARGET_SECRET: &[u8] = b"targetsecret34";

fn server() -> IscsiServer {
    let mut registry = StaticRegistry::new();
    registry.insert("tank/vol", "", Arc::new(MemVolume::new("tank/vol", 1 << 20, 4096)));
    IscsiServer::new(Arc::new(registry), IscsiConfig::default())
}

fn chap(initiators: &[&str], mutual: bool) -> TargetAuth {
    TargetAuth {
        chap: Some(Credential::new("alice", SECRET).unwrap()),
        mutual: mutual.then(|| Credential::new("tgt", TARGET_SECRET).unwrap()),
        initiators: initiators.iter().map(|s| s.to_string()).collect(),
    }
}

struct Login {
    stream: DuplexStream,
    _stop: watch::Sender<bool>,
}

struct Answer {
    status: (u8, u8),
    transit: bool,
    tsih: u16,
    keys: Vec<(String, String)>,
}

impl Answer {
    fn key(&self, name: &str) -> Option<&str> {
        self.keys.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

impl Login {
    fn start(server: &IscsiServer) -> Login {
        let (client, served) = tokio::io::duplex(1 << 16);
        let (stop_tx, stop) = watch::channel(false);
        let server = server.clone();
        tokio::spawn(async move { server.serve_stream(served, Some("10.0.0.1:3260".into()), stop).await });
        Login { stream: client, _stop: stop_tx }
    }

    /// One Login Request in stage `csg` (to `nsg` when `transit`) and its response;
    /// `None`: the connection closed.
    async fn request(&mut self, csg: u8, nsg: u8, transit: bool, keys: &[(&str, &str)]) -> Option<Answer> {
        let mut bhs = Bhs::new(op::LOGIN, false);
        bhs.0[0] |= 0x40;
        bhs.0[1] = (if transit { 0x80 } else { 0 }) | (csg << 2) | if transit { nsg } else { 0 };
        bhs.0[8..14].copy_from_slice(&[0x80, 0, 0, 0x12, 0x34, 1]);
        bhs.set_u32(24, 1);
        let pairs: Vec<(String, String)> = keys.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let data = pdu::encode_text(&pairs);
        bhs.set_data_segment_bytes(data.len());
        let mut bytes = bhs.0.to_vec();
        bytes.extend_from_slice(&data);
        bytes.resize(pdu::BHS_BYTES + pdu::padded(data.len()), 0);
        self.stream.write_all(&bytes).await.ok()?;
        let mut response = Bhs::default();
        tokio::time::timeout(TIMEOUT, self.stream.read_exact(&mut response.0)).await.expect("a login response in time").ok()?;
        let mut data = vec![0; pdu::padded(response.data_segment_bytes())];
        self.stream.read_exact(&mut data).await.ok()?;
        data.truncate(response.data_segment_bytes());
        assert_eq!(response.opcode(), op::LOGIN_RESPONSE);
        Some(Answer {
            status: (response.0[36], response.0[37]),
            transit: response.flags() & 0x80 != 0,
            tsih: response.u16_at(14),
            keys: pdu::parse_text(&data),
        })
    }

    /// AuthMethod=CHAP, CHAP_A=5: the target's (identifier, challenge).
    async fn chap_challenge(&mut self, session: &[(&str, &str)]) -> (u8, Vec<u8>) {
        let mut first = session.to_vec();
        first.push(("AuthMethod", "CHAP,None"));
        let a = self.request(0, 1, true, &first).await.unwrap();
        assert_eq!((a.status, a.key("AuthMethod"), a.transit), ((0, 0), Some("CHAP"), false), "{:?}", a.keys);
        let a = self.request(0, 1, false, &[("CHAP_A", "5")]).await.unwrap();
        assert_eq!(a.key("CHAP_A"), Some("5"));
        let identifier: u8 = a.key("CHAP_I").unwrap().parse().unwrap();
        let challenge = decode_binary(a.key("CHAP_C").unwrap(), 1024).unwrap();
        assert_eq!(challenge.len(), 16);
        (identifier, challenge)
    }
}

fn normal() -> Vec<(&'static str, &'static str)> {
    vec![("InitiatorName", INITIATOR), ("TargetName", TARGET), ("SessionType", "Normal")]
}

#[tokio::test]
async fn one_way_chap_logs_in_with_the_right_secret_only() {
    let server = server();
    let mut store = AuthStore::default();
    store.set_target(TARGET, chap(&[], false)).unwrap();
    server.set_auth_store(store);

    let mut login = Login::start(&server);
    let (identifier, challenge) = login.chap_challenge(&normal()).await;
    let response = encode_hex(&chap_response(identifier, SECRET, &challenge));
    let a = login.request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", &response)]).await.unwrap();
    assert_eq!((a.status, a.transit), ((0, 0), true));
    let a = login.request(1, 3, true, &[("HeaderDigest", "None"), ("MaxBurstLength", "65536")]).await.unwrap();
    assert_eq!((a.status, a.transit), ((0, 0), true));
    assert_ne!(a.tsih, 0);
    let sessions = server.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].initiator_name, INITIATOR);
    assert_eq!(sessions[0].isid, "800000123401");
    assert_eq!(sessions[0].tsih, a.tsih);
    assert_eq!(sessions[0].target, TARGET);
    assert_eq!(sessions[0].auth, "chap");
    assert_eq!(sessions[0].max_burst_bytes, 65536);
    drop(login);
    for _ in 0..100 {
        if server.sessions().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(server.sessions().is_empty(), "a closed session leaves the listing");

    // a wrong secret, a wrong user, no CHAP at all, skipping the security stage
    let mut login = Login::start(&server);
    let (identifier, challenge) = login.chap_challenge(&normal()).await;
    let wrong = encode_hex(&chap_response(identifier, b"secretpass13", &challenge));
    let a = login.request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", &wrong)]).await.unwrap();
    assert_eq!(a.status, (2, 1));
    let mut login = Login::start(&server);
    let (identifier, challenge) = login.chap_challenge(&normal()).await;
    let right = encode_hex(&chap_response(identifier, SECRET, &challenge));
    let a = login.request(0, 1, true, &[("CHAP_N", "bob"), ("CHAP_R", &right)]).await.unwrap();
    assert_eq!(a.status, (2, 1));
    let mut login = Login::start(&server);
    let mut keys = normal();
    keys.push(("AuthMethod", "None"));
    assert_eq!(login.request(0, 1, true, &keys).await.unwrap().status, (2, 1));
    let mut login = Login::start(&server);
    assert_eq!(login.request(1, 3, true, &normal()).await.unwrap().status, (2, 1));
    let mut login = Login::start(&server);
    let a = login.request(0, 1, true, &normal()).await.unwrap();
    assert_eq!(a.status, (2, 1), "no AuthMethod and asking to move on");
    let mut login = Login::start(&server);
    let (_, _) = login.chap_challenge(&normal()).await;
    let a = login.request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", "0bnot base64!")]).await.unwrap();
    assert_eq!(a.status, (2, 1));
    assert_eq!(server.stats().logins_auth_failed.load(Ordering::Relaxed), 6);
}

#[tokio::test]
async fn an_initiator_off_the_list_is_not_authorized() {
    let server = server();
    let mut store = AuthStore::default();
    store.set_target(TARGET, TargetAuth { initiators: vec!["iqn.2026-11.org.example:other".into()], ..Default::default() }).unwrap();
    server.set_auth_store(store.clone());
    let mut login = Login::start(&server);
    assert_eq!(login.request(1, 3, true, &normal()).await.unwrap().status, (2, 2));
    // on the list (any case): in
    store.set_target(TARGET, TargetAuth { initiators: vec![INITIATOR.to_uppercase()], ..Default::default() }).unwrap();
    server.set_auth_store(store);
    let mut login = Login::start(&server);
    assert_eq!(login.request(1, 3, true, &normal()).await.unwrap().status, (0, 0));
    assert_eq!(server.stats().logins_auth_failed.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn mutual_chap_proves_the_target_secret() {
    let server = server();
    let mut store = AuthStore::default();
    store.set_default(chap(&[], true)).unwrap();
    server.set_auth_store(store);
    let mut login = Login::start(&server);
    let (identifier, challenge) = login.chap_challenge(&normal()).await;
    let response = encode_hex(&chap_response(identifier, SECRET, &challenge));
    let ours: Vec<u8> = (200u8..216).collect();
    let a = login
        .request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", &response), ("CHAP_I", "77"), ("CHAP_C", &encode_hex(&ours))])
        .await
        .unwrap();
    assert_eq!((a.status, a.transit), ((0, 0), true));
    assert_eq!(a.key("CHAP_N"), Some("tgt"));
    assert_eq!(a.key("CHAP_R"), Some(&*encode_hex(&chap_response(77, TARGET_SECRET, &ours))));
    // its own challenge sent back: refused
    let mut login = Login::start(&server);
    let (identifier, challenge) = login.chap_challenge(&normal()).await;
    let response = encode_hex(&chap_response(identifier, SECRET, &challenge));
    let a = login
        .request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", &response), ("CHAP_I", "77"), ("CHAP_C", &encode_hex(&challenge))])
        .await
        .unwrap();
    assert_eq!(a.status, (2, 1));
}

#[tokio::test]
async fn discovery_uses_the_default_entry_and_the_store_changes_live() {
    let server = server();
    let mut store = AuthStore::default();
    store.set_default(chap(&[], false)).unwrap();
    server.set_auth_store(store);
    let discovery = [("InitiatorName", INITIATOR), ("SessionType", "Discovery"), ("AuthMethod", "None")];
    let mut login = Login::start(&server);
    assert_eq!(login.request(0, 3, true, &discovery).await.unwrap().status, (2, 1));
    let mut login = Login::start(&server);
    let (identifier, challenge) = login.chap_challenge(&[("InitiatorName", INITIATOR), ("SessionType", "Discovery")]).await;
    let response = encode_hex(&chap_response(identifier, SECRET, &challenge));
    let a = login.request(0, 3, true, &[("CHAP_N", "alice"), ("CHAP_R", &response)]).await.unwrap();
    assert_eq!((a.status, a.transit), ((0, 0), true));
    // the default entry removed: open again (loopback-like stream), no restart
    server.set_auth_store(AuthStore::default());
    let mut login = Login::start(&server);
    assert_eq!(login.request(0, 3, true, &discovery).await.unwrap().status, (0, 0));
}

const GOOD: &str = "iqn.2026-11.org.good:h1";
const EVIL: &str = "iqn.2026-11.org.evil:h9";
const OTHER_TARGET: &str = "iqn.2026-11.io.zilla:tank.other";

/// tank/vol with CHAP for `GOOD` only, tank/other open.
fn two_targets() -> IscsiServer {
    let mut registry = StaticRegistry::new();
    registry.insert("tank/vol", "", Arc::new(MemVolume::new("tank/vol", 1 << 20, 4096)));
    registry.insert("tank/other", "", Arc::new(MemVolume::new("tank/other", 1 << 20, 4096)));
    let server = IscsiServer::new(Arc::new(registry), IscsiConfig::default());
    let mut store = AuthStore::default();
    store.set_target(TARGET, chap(&[GOOD], false)).unwrap();
    server.set_auth_store(store);
    server
}

impl Login {
    /// A CHAP login of `initiator` to `TARGET` with `secret`, to the full-feature phase;
    /// the last response's status.
    async fn chap_login(&mut self, initiator: &str, secret: &[u8]) -> (u8, u8) {
        let session = [("InitiatorName", initiator), ("TargetName", TARGET), ("SessionType", "Normal")];
        let (identifier, challenge) = self.chap_challenge(&session).await;
        let response = encode_hex(&chap_response(identifier, secret, &challenge));
        let a = self.request(0, 1, true, &[("CHAP_N", "alice"), ("CHAP_R", &response)]).await.unwrap();
        if a.status != (0, 0) {
            return a.status;
        }
        self.request(1, 3, true, &[("HeaderDigest", "None")]).await.unwrap().status
    }

    /// A NOP-Out in the full-feature phase: answered (`true`), or the session is gone.
    async fn alive(&mut self) -> bool {
        let mut bhs = Bhs::new(op::NOP_OUT, true);
        bhs.0[0] |= 0x40;
        bhs.set_u32(16, 0x99);
        bhs.set_u32(20, 0xffff_ffff);
        if self.stream.write_all(&bhs.0).await.is_err() {
            return false;
        }
        let mut response = Bhs::default();
        match tokio::time::timeout(TIMEOUT, self.stream.read_exact(&mut response.0)).await.expect("an answer or a close in time") {
            Ok(_) => response.opcode() == op::NOP_IN,
            Err(_) => false,
        }
    }
}

/// Session identity is initiator name, ISID and target: a login with the victim's
/// name and ISID to another target, or to its target with a wrong secret, leaves the
/// victim's session alone; a successful login to its target reinstates it.
#[tokio::test]
async fn only_a_successful_login_to_the_same_target_reinstates_a_session() {
    let server = two_targets();
    let mut victim = Login::start(&server);
    assert_eq!(victim.chap_login(GOOD, SECRET).await, (0, 0));
    assert!(victim.alive().await);
    // the same name and ISID, another (open) target
    let mut other = Login::start(&server);
    let keys = [("InitiatorName", GOOD), ("TargetName", OTHER_TARGET), ("SessionType", "Normal")];
    assert_eq!(other.request(1, 3, true, &keys).await.unwrap().status, (0, 0));
    assert!(other.alive().await);
    assert!(victim.alive().await, "a login to another target ended the victim's session");
    // the victim's target with a wrong secret
    let mut wrong = Login::start(&server);
    assert_eq!(wrong.chap_login(GOOD, b"wrongsecret12").await, (2, 1));
    assert!(victim.alive().await, "a failed login ended the victim's session");
    // its target, right secret: reinstated
    let mut again = Login::start(&server);
    assert_eq!(again.chap_login(GOOD, SECRET).await, (0, 0));
    assert!(!victim.alive().await, "the old session survived its reinstatement");
    assert!(again.alive().await && other.alive().await);
}

/// The initiator list is checked on the name the first request gives; a later
/// request naming another initiator is refused (initiator error), so the session can
/// never run under a name the list did not allow. Repeating the first name is fine.
#[tokio::test]
async fn an_initiator_name_declared_again_with_another_value_is_refused() {
    let server = server();
    let mut store = AuthStore::default();
    store.set_target(TARGET, TargetAuth { initiators: vec![GOOD.into()], ..Default::default() }).unwrap();
    server.set_auth_store(store);
    let first = [("InitiatorName", GOOD), ("TargetName", TARGET), ("SessionType", "Normal"), ("AuthMethod", "None")];
    let mut login = Login::start(&server);
    assert_eq!(login.request(0, 1, true, &first).await.unwrap().status, (0, 0));
    let a = login.request(1, 3, true, &[("InitiatorName", EVIL), ("HeaderDigest", "None")]).await.unwrap();
    assert_eq!(a.status, (2, 0), "a second InitiatorName: initiator error");
    assert!(server.sessions().is_empty(), "{:?}", server.sessions());
    // the same name again (as libiscsi sends it): in, under that name
    let mut login = Login::start(&server);
    assert_eq!(login.request(0, 1, true, &first).await.unwrap().status, (0, 0));
    let again = [("InitiatorName", GOOD), ("TargetName", TARGET), ("SessionType", "Normal"), ("HeaderDigest", "None")];
    assert_eq!(login.request(1, 3, true, &again).await.unwrap().status, (0, 0));
    let sessions = server.sessions();
    assert_eq!(sessions.iter().map(|s| s.initiator_name.as_str()).collect::<Vec<_>>(), [GOOD]);
    // a discovery login turning into a normal one later: refused
    let mut login = Login::start(&server);
    let discovery = [("InitiatorName", EVIL), ("SessionType", "Discovery"), ("AuthMethod", "None")];
    assert_eq!(login.request(0, 1, true, &discovery).await.unwrap().status, (0, 0));
    let a = login.request(1, 3, true, &[("SessionType", "Normal"), ("TargetName", TARGET)]).await.unwrap();
    assert_eq!(a.status, (2, 0));
    // a bad receive limit: refused
    let mut login = Login::start(&server);
    let a = login.request(1, 3, true, &[("InitiatorName", GOOD), ("TargetName", TARGET), ("MaxRecvDataSegmentLength", "12")]).await.unwrap();
    assert_eq!(a.status, (2, 0));
}
