"""The zilla binaries under test.

Theory of operation: the *new* build is this tree's `target/release/zilla`, or
`$CARGO_TARGET_DIR/release/zilla` when that is set (`cargo build --release -p zilla` is
run first, a no-op when it is current; `ZILLA_BIN` overrides both). For an old-vs-new
comparison (`--compare-old REV`) the *old* build is REV checked out in a temporary git
worktree under the cache dir ($BENCH_OLD_DIR, default
/tmp/zilla-bench-old/COMMIT/) and built there with its own target dir, at low CPU
priority; its binary is kept as /tmp/zilla-bench-old/COMMIT/zilla and reused by later
runs, and the worktree and target dir are removed once the binary is copied out.
"""

import os
import shutil
import subprocess
import sys

from .proc import ROOT, BenchError, log, run

DEFAULT_OLD_REV = "204d980"   # main before the engine restructure


def git(*args):
    return run(["git", "-C", ROOT] + list(args)).stdout.strip()


class Build:
    """One zilla binary: `label` names it in results ("zilla", "zilla_old")."""

    def __init__(self, label, binary, commit, rev=None, dirty=False):
        self.label, self.binary, self.commit, self.rev, self.dirty = label, binary, commit, rev, dirty

    def describe(self):
        r = run([self.binary, "--version"], check=False)
        return {"label": self.label, "binary": self.binary, "git_commit": self.commit,
                "rev": self.rev, "uncommitted_changes": self.dirty,
                "zilla_version": (r.stdout or "").strip()}


def this_tree():
    """The build of this checkout (built or refreshed with cargo unless ZILLA_BIN is set)."""
    env_bin = os.environ.get("ZILLA_BIN")
    # cargo builds into $CARGO_TARGET_DIR when it is set (relative: to the tree)
    target = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target")
    b = env_bin or os.path.join(target, "release", "zilla")
    if env_bin:
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            raise BenchError(f"ZILLA_BIN={b} is not an executable")
    elif shutil.which("cargo"):
        log("cargo build --release -p zilla (no-op when current)")
        _cargo_build(ROOT, None)
    elif not os.path.isfile(b):
        raise BenchError(f"{b} not found and no cargo to build it "
                         "(run `cargo build --release -p zilla` or set ZILLA_BIN)")
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"))
    except BenchError:
        commit, dirty = "unknown", False
    return Build("zilla", b, commit, dirty=dirty)


def old_revision(rev):
    """The build of git revision `rev`, built once into the cache dir."""
    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except BenchError:
        raise BenchError(f"--compare-old: unknown git revision {rev!r}")
    cache = os.environ.get("BENCH_OLD_DIR") or "/tmp/zilla-bench-old"
    base = os.path.join(cache, sha[:12])
    binary = os.path.join(base, "zilla")
    if os.path.isfile(binary) and os.access(binary, os.X_OK):
        log(f"old build {rev} ({sha[:12]}): reusing {binary}")
        return Build("zilla_old", binary, sha[:12], rev=rev)
    src, target = os.path.join(base, "src"), os.path.join(base, "target")
    os.makedirs(base, exist_ok=True)
    _remove_worktree(src)
    log(f"old build {rev} ({sha[:12]}): git worktree {src}, cargo target {target}")
    git("worktree", "add", "--detach", src, sha)
    try:
        _cargo_build(src, target)
        shutil.copy2(os.path.join(target, "release", "zilla"), binary + ".tmp")
        os.rename(binary + ".tmp", binary)
    finally:
        _remove_worktree(src)
    shutil.rmtree(target, ignore_errors=True)
    return Build("zilla_old", binary, sha[:12], rev=rev)


def _remove_worktree(path):
    if os.path.exists(path):
        run(["git", "-C", ROOT, "worktree", "remove", "--force", path], check=False)
        shutil.rmtree(path, ignore_errors=True)


def _cargo_build(cwd, target_dir):
    """cargo build --release -p zilla at low priority; its output goes to stderr."""
    cmd = ["nice", "-n", "10", "cargo", "build", "--release", "-p", "zilla"]
    if target_dir:
        cmd += ["--target-dir", target_dir]
    r = subprocess.run(cmd, cwd=cwd, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0:
        raise BenchError(f"cargo build failed in {cwd} ({r.returncode})")
