//! The iSCSI target's authentication settings as the daemon keeps them: the file
//! DIR/iscsi-auth.json, the changes `zilla iscsi auth` asks for, and the listing of
//! `zilla iscsi list`.
//!
//! Theory of operation
//! -------------------
//! The file holds a default entry and one entry per target name: a CHAP user and
//! secret, an optional mutual user and secret, the allowed initiator names. It is read
//! once at start (a file that cannot be read stops the start: serving with no CHAP
//! where the admin asked for it would open the targets) and rewritten whole on each
//! change, mode 0600, atomically (state_dir::replace_private); only then does the
//! target get the new store, which the next login reads. Secrets are in the file and
//! in change requests only: never in an answer, a listing or a log line.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use zilla_iscsi::auth::{check_iscsi_name, AuthStore, Credential, TargetAuth};

use crate::api::{IscsiAuthRequest, IscsiAuthView, IscsiListing, IscsiSessionRow, IscsiTargetRow};

pub const AUTH_FILE_NAME: &str = "iscsi-auth.json";
const AUTH_TMP_NAME: &str = "iscsi-auth.json.tmp";
const AUTH_FILE_VERSION: u32 = 1;
/// Largest file read: far beyond the entries allowed (auth::TARGETS_MAX).
const AUTH_FILE_MAX_BYTES: u64 = 256 << 20;

#[derive(Debug, Default, Serialize, Deserialize)]
struct AuthFile {
    version: u32,
    #[serde(default)]
    default: Option<EntryFile>,
    #[serde(default)]
    targets: BTreeMap<String, EntryFile>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct EntryFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mutual_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mutual_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    initiators: Vec<String>,
}

/// A user and secret given together, or neither.
fn credential(user: Option<&str>, secret: Option<&str>, what: &str) -> Result<Option<Credential>, String> {
    match (user, secret) {
        (None, None) => Ok(None),
        (Some(user), Some(secret)) => Credential::new(user, secret.as_bytes()).map(Some).map_err(|e| format!("{what}: {e}")),
        (Some(_), None) => Err(format!("{what}: a user needs a secret")),
        (None, Some(_)) => Err(format!("{what}: a secret needs a user")),
    }
}

fn secret_text(c: &Credential) -> String {
    // secrets are set from text (Credential checks them), so this is lossless
    String::from_utf8_lossy(c.secret()).into_owned()
}

impl EntryFile {
    fn to_entry(&self) -> Result<TargetAuth, String> {
        let entry = TargetAuth {
            chap: credential(self.user.as_deref(), self.secret.as_deref(), "CHAP")?,
            mutual: credential(self.mutual_user.as_deref(), self.mutual_secret.as_deref(), "mutual CHAP")?,
            initiators: self.initiators.clone(),
        };
        entry.validate()?;
        Ok(entry)
    }

    fn from_entry(entry: &TargetAuth) -> EntryFile {
        EntryFile {
            user: entry.chap.as_ref().map(|c| c.user.clone()),
            secret: entry.chap.as_ref().map(secret_text),
            mutual_user: entry.mutual.as_ref().map(|c| c.user.clone()),
            mutual_secret: entry.mutual.as_ref().map(secret_text),
            initiators: entry.initiators.clone(),
        }
    }
}

/// The store of DIR/iscsi-auth.json; an empty one when there is no such file.
pub fn load(dir: &Path) -> anyhow::Result<AuthStore> {
    let path = dir.join(AUTH_FILE_NAME);
    let bytes = match crate::state_dir::read_regular_file(&path, AUTH_FILE_MAX_BYTES) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(AuthStore::default()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!("{} can be read by other users (mode {:o}); it holds CHAP secrets: chmod 600 it", path.display(), meta.permissions().mode() & 0o777);
        }
    }
    let file: AuthFile = serde_json::from_slice(&bytes).map_err(|e| {
        // serde's message may quote a value, which may be a secret: give the place only
        anyhow::anyhow!("{} is not a valid iSCSI authentication file (line {}, column {})", path.display(), e.line(), e.column())
    })?;
    if file.version != AUTH_FILE_VERSION {
        anyhow::bail!("{}: unsupported version {}", path.display(), file.version);
    }
    let mut store = AuthStore::default();
    if let Some(default) = &file.default {
        let entry = default.to_entry().map_err(|e| anyhow::anyhow!("{}: the default entry: {e}", path.display()))?;
        store.set_default(entry).map_err(anyhow::Error::msg)?;
    }
    for (name, entry) in &file.targets {
        let shown = crate::clip::clip(name);
        let entry = entry.to_entry().map_err(|e| anyhow::anyhow!("{}: target {shown}: {e}", path.display()))?;
        store.set_target(name, entry).map_err(|e| anyhow::anyhow!("{}: target {shown}: {e}", path.display()))?;
    }
    tracing::info!(
        "iSCSI authentication from {}: default {}, {} targets with settings of their own",
        path.display(),
        store.default.kind(),
        store.targets().count()
    );
    Ok(store)
}

/// Replace DIR/iscsi-auth.json with `store` (mode 0600, atomically).
pub fn save(dir: &Path, store: &AuthStore) -> std::io::Result<()> {
    let file = AuthFile {
        version: AUTH_FILE_VERSION,
        default: (!store.default.is_empty()).then(|| EntryFile::from_entry(&store.default)),
        targets: store.targets().map(|(name, entry)| (name.to_string(), EntryFile::from_entry(entry))).collect(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    crate::state_dir::replace_private(dir, AUTH_FILE_NAME, AUTH_TMP_NAME, &bytes)
}

/// The target name `arg` names: a target name, or POOL/NAME of a volume.
pub fn target_name(arg: &str) -> Result<String, String> {
    let lower = arg.to_ascii_lowercase();
    if !(lower.starts_with("iqn.") || lower.starts_with("eui.") || lower.starts_with("naa.")) && arg.contains('/') {
        return Ok(zilla_iscsi::names::target_name(arg));
    }
    check_iscsi_name(arg)?;
    Ok(lower)
}

/// The store after `req`, and the target name it changed (`None`: the default entry).
/// A target's first settings start from the default entry's (so adding an initiator
/// list to a target under a default CHAP user keeps that user); `clear` starts from
/// nothing.
pub fn apply(store: &AuthStore, req: &IscsiAuthRequest) -> Result<(AuthStore, Option<String>), String> {
    let target = req.target.as_deref().map(target_name).transpose()?;
    let mut entry = match (&target, req.clear) {
        (_, true) => TargetAuth::default(),
        (Some(name), false) => store.own_entry(name).cloned().unwrap_or_else(|| store.default.clone()),
        (None, false) => store.default.clone(),
    };
    if let Some(chap) = credential(req.user.as_deref(), req.secret.as_deref(), "CHAP")? {
        entry.chap = Some(chap);
    }
    if let Some(mutual) = credential(req.mutual_user.as_deref(), req.mutual_secret.as_deref(), "mutual CHAP")? {
        entry.mutual = Some(mutual);
    }
    if let Some(initiators) = &req.initiators {
        let mut list: Vec<String> = Vec::with_capacity(initiators.len());
        for name in initiators {
            check_iscsi_name(name)?;
            if !list.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                list.push(name.clone());
            }
        }
        entry.initiators = list;
    }
    let mut next = store.clone();
    match &target {
        Some(name) => next.set_target(name, entry)?,
        None => next.set_default(entry)?,
    }
    Ok((next, target))
}

/// The entry of `target` (`None`: the default) without its secrets.
pub fn view(store: &AuthStore, target: Option<&str>) -> IscsiAuthView {
    let (name, entry, own_entry) = match target {
        Some(name) => (name.to_string(), store.entry(name), store.own_entry(name).is_some()),
        None => ("default".to_string(), &store.default, true),
    };
    IscsiAuthView {
        target: name,
        auth: entry.kind().to_string(),
        user: entry.chap.as_ref().map(|c| c.user.clone()),
        mutual_user: entry.mutual.as_ref().map(|c| c.user.clone()),
        initiators: entry.initiators.clone(),
        own_entry,
    }
}

/// What `GET /v1/iscsi` answers. Reads volume properties: call on a blocking thread.
pub fn listing(server: &zilla_iscsi::IscsiServer) -> IscsiListing {
    let store = server.auth_store();
    let targets = server
        .targets()
        .into_iter()
        .map(|t| IscsiTargetRow {
            iqn: t.iqn,
            volume: t.volume,
            shared: t.shared,
            auth: t.auth,
            own_entry: t.own_entry,
            initiators: t.initiators,
        })
        .collect();
    let sessions = server
        .sessions()
        .into_iter()
        .map(|s| IscsiSessionRow {
            initiator: s.initiator_name,
            isid: s.isid,
            tsih: s.tsih,
            peer: s.peer,
            target: s.target,
            discovery: s.discovery,
            auth: s.auth,
            max_recv_data_segment_length: s.initiator_max_recv_data_segment_bytes,
            target_max_recv_data_segment_length: s.target_max_recv_data_segment_bytes,
            max_burst_length: s.max_burst_bytes,
            first_burst_length: s.first_burst_bytes,
            immediate_data: s.immediate_data,
            initial_r2t: s.initial_r2t,
            header_digest: s.header_digest,
            data_digest: s.data_digest,
            started_unix_s: s.started_unix_s,
        })
        .collect();
    IscsiListing {
        default: view(&store, None),
        entries: store.targets().map(|(name, _)| view(&store, Some(name))).collect(),
        targets,
        sessions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn req(target: Option<&str>) -> IscsiAuthRequest {
        IscsiAuthRequest { target: target.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn changes_apply_and_the_file_round_trips_private() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), AuthStore::default());
        let mut r = req(Some("tank/vol"));
        r.user = Some("alice".into());
        r.secret = Some("secretpass12".into());
        r.initiators = Some(vec!["iqn.2026-11.org.example:h1".into(), "IQN.2026-11.org.example:H1".into()]);
        let (store, target) = apply(&AuthStore::default(), &r).unwrap();
        assert_eq!(target.as_deref(), Some("iqn.2026-11.io.zilla:tank.vol"));
        let entry = store.entry("iqn.2026-11.io.zilla:tank.vol");
        assert_eq!((entry.kind(), entry.initiators.len()), ("chap", 1));
        // mutual added later keeps the rest
        let mut m = req(Some("iqn.2026-11.io.zilla:tank.vol"));
        m.mutual_user = Some("tgt".into());
        m.mutual_secret = Some("targetsecret34".into());
        let (store, _) = apply(&store, &m).unwrap();
        assert_eq!(store.entry("iqn.2026-11.io.zilla:tank.vol").kind(), "mutual");
        save(dir.path(), &store).unwrap();
        let path = dir.path().join(AUTH_FILE_NAME);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load(dir.path()).unwrap(), store);
        let shown = serde_json::to_string(&view(&store, Some("iqn.2026-11.io.zilla:tank.vol"))).unwrap();
        assert!(shown.contains("alice") && !shown.contains("secretpass12") && !shown.contains("targetsecret34"));
        // clear removes the entry
        let mut c = req(Some("tank/vol"));
        c.clear = true;
        let (store, _) = apply(&store, &c).unwrap();
        assert!(store.own_entry("iqn.2026-11.io.zilla:tank.vol").is_none());
        // a target's first settings start from the default's: its CHAP user stays
        let mut d = req(None);
        d.user = Some("disco".into());
        d.secret = Some("defaultsecret56".into());
        let (store, _) = apply(&store, &d).unwrap();
        let mut acl = req(Some("tank/other"));
        acl.initiators = Some(vec!["iqn.2026-11.org.example:h2".into()]);
        let (store, _) = apply(&store, &acl).unwrap();
        let entry = store.own_entry("iqn.2026-11.io.zilla:tank.other").unwrap();
        assert_eq!((entry.kind(), entry.initiators.len()), ("chap", 1));
    }

    #[test]
    fn bad_changes_and_bad_files_are_refused_without_echoing_secrets() {
        let mut r = req(None);
        r.user = Some("alice".into());
        r.secret = Some("short".into());
        let e = apply(&AuthStore::default(), &r).unwrap_err();
        assert!(!e.contains("short"), "{e}");
        let mut r = req(None);
        r.secret = Some("secretpass12".into());
        assert!(apply(&AuthStore::default(), &r).is_err());
        let mut r = req(None);
        r.mutual_user = Some("tgt".into());
        r.mutual_secret = Some("targetsecret34".into());
        assert!(apply(&AuthStore::default(), &r).is_err(), "mutual without one-way CHAP");
        assert!(apply(&AuthStore::default(), &req(Some("not-a-target"))).is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(AUTH_FILE_NAME), br#"{"version":1,"default":{"user":"a","secret":"sekrit-but-short"#).unwrap();
        let e = format!("{:#}", load(dir.path()).unwrap_err());
        assert!(!e.contains("sekrit"), "{e}");
        std::fs::write(dir.path().join(AUTH_FILE_NAME), br#"{"version":1,"default":{"user":"a","secret":"tiny"}}"#).unwrap();
        let e = format!("{:#}", load(dir.path()).unwrap_err());
        assert!(!e.contains("tiny"), "{e}");
    }
}
