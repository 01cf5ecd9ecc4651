//! names: iSCSI target names of volumes, and the identifiers SCSI reports for them.
//!
//! Every volume `POOL/NAME` is the target `iqn.2026-11.io.zilla:POOL.NAME` with the
//! volume as LUN 0. The name is lowercased; every character an IQN may not hold here
//! (anything but `a-z`, `0-9`, `-`, `.`) becomes `-`. Two volumes whose names map to the
//! same target name: the first in sort order is served under it, the other not (a
//! warning is logged when a client asks; the daemon refuses to create or share a volume
//! whose name would clash). Initiators compare target names without case, and so do
//! we. A volume with `shareiscsi=off` is no target at all: discovery does not list it
//! and a login naming it is refused as for an unknown target.

/// The naming authority of every target.
pub const IQN_PREFIX: &str = "iqn.2026-11.io.zilla:";

/// The target name of export `POOL/NAME`.
pub fn target_name(export: &str) -> String {
    let mut out = String::with_capacity(IQN_PREFIX.len() + export.len());
    out.push_str(IQN_PREFIX);
    for c in export.chars() {
        let c = c.to_ascii_lowercase();
        out.push(match c {
            '/' => '.',
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        });
    }
    out
}

/// Whether volume `export` of `registry` is served over iSCSI (`shareiscsi` not off).
pub fn is_shared(registry: &dyn zilla_frontend::ExportRegistry, export: &str) -> bool {
    registry.property(export, "shareiscsi").as_deref() != Some("off")
}

/// The exports served over iSCSI: every volume of `registry` but those with
/// `shareiscsi=off`, in the registry's order.
pub fn shared_exports(registry: &dyn zilla_frontend::ExportRegistry) -> Vec<String> {
    registry.list().into_iter().map(|e| e.name).filter(|name| is_shared(registry, name)).collect()
}

/// The export (of `exports`, in sort order) whose target name is `requested`.
pub fn export_for_target<'a>(requested: &str, exports: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut found = None;
    for export in exports {
        if target_name(export).eq_ignore_ascii_case(requested) {
            if found.is_some() {
                tracing::warn!(target = requested, "iscsi: two volumes map to this target name; serving the first");
                break;
            }
            found = Some(export);
        }
    }
    found
}

/// A stable 64-bit hash (FNV-1a) of the pool id and the export name.
fn identity_hash(pool_id: Option<u64>, export: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |b: u8| h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    for b in pool_id.unwrap_or(0).to_be_bytes() {
        eat(b);
    }
    for b in export.bytes() {
        eat(b);
    }
    h
}

/// The NAA identifier of the logical unit: NAA 3 (locally assigned), 60 bits of the
/// identity hash. Stable across restarts (pool GUID and volume name).
pub fn naa(pool_id: Option<u64>, export: &str) -> u64 {
    (0x3u64 << 60) | (identity_hash(pool_id, export) & 0x0fff_ffff_ffff_ffff)
}

/// The unit serial number: the identity hash in 16 hex digits.
pub fn serial(pool_id: Option<u64>, export: &str) -> String {
    format!("{:016x}", identity_hash(pool_id, export))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_are_lowercased_and_mapped() {
        assert_eq!(target_name("tank/vol1"), "iqn.2026-11.io.zilla:tank.vol1");
        assert_eq!(target_name("Tank/My_Vol:x"), "iqn.2026-11.io.zilla:tank.my-vol-x");
        let exports = ["a/b", "tank/Vol_1", "tank/vol-1"];
        assert_eq!(export_for_target("IQN.2026-11.io.zilla:tank.vol-1", exports), Some("tank/Vol_1"));
        assert_eq!(export_for_target("iqn.2026-11.io.zilla:a.b", exports), Some("a/b"));
        assert_eq!(export_for_target("iqn.2026-11.io.zilla:nope", exports), None);
    }

    #[test]
    fn identifiers_are_stable_and_distinct() {
        assert_eq!(naa(Some(7), "tank/a"), naa(Some(7), "tank/a"));
        assert_ne!(naa(Some(7), "tank/a"), naa(Some(8), "tank/a"));
        assert_ne!(naa(Some(7), "tank/a"), naa(Some(7), "tank/b"));
        assert_eq!(naa(None, "x") >> 60, 3);
        assert_eq!(serial(Some(1), "tank/a").len(), 16);
    }
}
