"""Processes, logging and cleanup.

Theory of operation: every process a scenario starts is registered here (`spawn`) and
every temp dir comes from `make_workdir`; an atexit hook plus SIGINT/SIGTERM/SIGHUP
handlers terminate the processes (then kill them after a grace period) and remove the
temp dirs on exit, error or signal. `BENCH_KEEP=1` keeps the temp dirs for inspection,
except those in memory (`make_memdir`: device images in RAM).
Logging goes to stderr, so stdout carries only the tables and the final JSON line.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The repository root (bench/lib/proc.py -> ..).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_procs = []      # Popen objects we started, newest last
_tmpdirs = []    # temp dirs we created
_memdirs = set() # those of them in memory (make_memdir): removed even with BENCH_KEEP=1


class BenchError(Exception):
    """A failure the runner reports as one line (exit 1)."""


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, check=True, capture=True, timeout=None, **kw):
    """Run a command; with check, a non-zero exit raises BenchError with its last
    stderr line."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None, text=True,
                       timeout=timeout, **kw)
    if check and r.returncode != 0:
        err = (r.stderr or "").strip().splitlines()
        raise BenchError(f"command failed ({r.returncode}): {' '.join(map(str, cmd))}"
                         + (f"\n  {err[-1]}" if err else ""))
    return r


def spawn(cmd, logpath, env=None):
    """Start a long-running process in its own session, output to `logpath`; it is
    terminated at exit."""
    with open(logpath, "w") as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    _procs.append(p)
    return p


def stop(p, grace_s=60):
    """Terminate one process we started (SIGTERM, then SIGKILL after `grace_s`)."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in _procs:
        _procs.remove(p)


def write_random_file(path, size):
    """`size` bytes of random data (a scenario's servers all hold the same bytes)."""
    chunk = 8 << 20
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n


def write_seeded_file(path, size, seed=1):
    """`size` pseudo-random bytes from `seed`: the same bytes in every run (a count of
    work per request is compared across runs and builds)."""
    import random
    r = random.Random(seed)
    chunk = 8 << 20
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(chunk, left)
            f.write(r.randbytes(n))
            left -= n


def make_workdir(prefix="zilla-bench-"):
    """A fresh temp dir under $BENCH_TMPDIR (default $TMPDIR or /tmp), removed at exit."""
    base = os.environ.get("BENCH_TMPDIR") or tempfile.gettempdir()
    d = tempfile.mkdtemp(prefix=prefix, dir=base)
    _tmpdirs.append(d)
    return d


def make_memdir(prefix="zilla-bench-mem-", need_bytes=2 << 30):
    """A fresh temp dir in memory (/dev/shm, tmpfs) for the backing files of sim devices
    whose model is faster than the lab disk: a sim device's service time hides its inner
    write only while that write is shorter than the model, and a 198 us log-SSD model
    does not hide a slow lab disk's O_DIRECT write (slog QD1 on one lab VM: 623 us with
    the backing on its disk, 428 us in tmpfs, where the model predicts ~200 + protocol).
    Falls back to make_workdir when /dev/shm is missing or has less than `need_bytes`
    free; removed at exit like the work dir, but also with BENCH_KEEP=1 (its files are
    device images held in RAM, up to several GiB, that a kept dir would pin until
    someone removes it by hand). BENCH_MEMDIR=0 turns it off."""
    shm = "/dev/shm"
    if os.environ.get("BENCH_MEMDIR") != "0" and os.path.isdir(shm):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= need_bytes:
            d = tempfile.mkdtemp(prefix=prefix, dir=shm)
            _tmpdirs.append(d)
            _memdirs.add(d)
            return d
    return make_workdir(prefix)


def is_memdir(d):
    """Whether `d` came from make_memdir and is in memory (not its disk fallback)."""
    return d in _memdirs


def allocated_bytes(paths):
    """Bytes the files at `paths` really occupy (st_blocks, not their sparse size): in
    tmpfs, the memory they hold."""
    return sum(os.stat(p).st_blocks * 512 for p in paths)


def fs_used_bytes(path):
    """Bytes in use on the file system holding `path` (df's Used), every user's."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def cleanup():
    for p in reversed(_procs):
        try:
            stop(p, grace_s=20)
        except Exception:
            try:
                p.kill()
                p.wait(timeout=5)
            except Exception:
                pass
    _procs.clear()
    for d in _tmpdirs:
        if os.environ.get("BENCH_KEEP") == "1" and d not in _memdirs:
            log(f"kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)
    _tmpdirs.clear()
    _memdirs.clear()


def _on_signal(signum, _frame):
    log(f"caught signal {signum}, cleaning up")
    sys.exit(128 + signum)   # runs atexit


def install_cleanup():
    atexit.register(cleanup)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)
