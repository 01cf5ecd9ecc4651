//! vdev_grammar: zpool's vdev list on the command line, parsed into the engine's
//! `TopSpec`s.
//!
//! Theory of operation
//! -------------------
//! `[mirror] A B ... log [mirror] C D cache E spare F`: a class keyword (`log`, `cache`,
//! `spare`) switches the class of what follows; each `mirror` keyword starts a new
//! mirror that collects leaves until the next keyword; a bare leaf is a single-disk
//! top-level vdev. The engine only ever sees the structured result.
use zilla_core::spa::TopSpec;
use zilla_core::vdev::{LeafSpec, Role};
use zilla_core::{Error, Result};

/// Parse zpool's vdev grammar: `[mirror] A B ... log [mirror] C D cache E spare F`.
/// Each `mirror` keyword starts a new mirror; bare leaves in the normal class are
/// single-disk top-level vdevs; cache and spare leaves are always single.
pub fn parse_vdev_args(args: &[String]) -> Result<Vec<TopSpec>> {
    let mut tops: Vec<TopSpec> = Vec::new();
    let mut role = Role::Normal;
    let mut in_mirror = false;
    for a in args {
        match a.as_str() {
            "mirror" => {
                if matches!(role, Role::Cache | Role::Spare) {
                    return Err(Error::invalid(format!("{:?} devices cannot be mirrored", role).to_lowercase()));
                }
                tops.push(TopSpec { role, mirror: true, leaves: vec![] });
                in_mirror = true;
            }
            "log" => { role = Role::Log; in_mirror = false; }
            "cache" => { role = Role::Cache; in_mirror = false; }
            "spare" => { role = Role::Spare; in_mirror = false; }
            "raidz" | "raidz1" | "raidz2" | "raidz3" | "draid" | "special" | "dedup" => {
                return Err(Error::invalid(format!("vdev type '{a}' is not supported (use mirror)")));
            }
            leaf => {
                let spec = LeafSpec::parse(leaf)?;
                if in_mirror {
                    tops.last_mut().expect("mirror pushed").leaves.push(spec);
                } else {
                    tops.push(TopSpec { role, mirror: false, leaves: vec![spec] });
                }
            }
        }
    }
    for t in &tops {
        if t.mirror && t.leaves.len() < 2 {
            return Err(Error::invalid("a mirror needs at least two devices"));
        }
    }
    if tops.is_empty() {
        return Err(Error::invalid("no devices given"));
    }
    let mut seen = std::collections::HashSet::new();
    for t in &tops {
        for l in &t.leaves {
            if !seen.insert(l.path.clone()) {
                return Err(Error::invalid(format!("{} is specified more than once", l.path.display())));
            }
        }
    }
    Ok(tops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn classes_and_mirrors() {
        let t = parse_vdev_args(&args("mirror a b mirror c d log mirror e f cache g spare h")).unwrap();
        let shape: Vec<(Role, bool, usize)> = t.iter().map(|t| (t.role, t.mirror, t.leaves.len())).collect();
        assert_eq!(
            shape,
            vec![(Role::Normal, true, 2), (Role::Normal, true, 2), (Role::Log, true, 2), (Role::Cache, false, 1), (Role::Spare, false, 1)]
        );
    }

    #[test]
    fn refuses_bad_lists() {
        for bad in ["", "mirror a", "raidz a b c", "a a", "cache mirror a b"] {
            assert!(parse_vdev_args(&args(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
