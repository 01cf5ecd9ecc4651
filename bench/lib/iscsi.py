"""iSCSI clients the benchmarks run: libiscsi's tools and qemu-img over iscsi://.

Theory of operation: there is no kernel initiator on the bench machine and fio has no
libiscsi engine, so every iSCSI figure comes from a user-space initiator talking to the
target over loopback TCP:
- `probe` checks that a target serves a LUN: the port accepts connections, a login
  and READ CAPACITY(16) succeed (iscsi-readcapacity16), and gives the LU's block size
  and size. A target that is not there is an answer (`served` false with a reason),
  not an error.
- `iscsi_perf` runs libiscsi's iscsi-perf (READ16 only, one session, `max_in_flight`
  commands outstanding; a random run picks any LBA of the LU's block size, not aligned
  to the request size) and reads its final "iops average N" line. iscsi-perf reports
  no latency: the mean comes from Little's law (in flight / IOPS).
- `qemu_img_bench` runs `qemu-img bench` (any URL qemu's block layer opens: iscsi://,
  nbd://) and reads "Run completed in S seconds".
- `run_test_cu` runs iscsi-test-cu and `parse_test_cu` reads its CUnit output: the
  summary's tests line (total, ran, passed, failed, inactive) and, per test, whether
  it printed [SKIPPED] before its "passed" (a skipped test counts as passed in CUnit;
  passed minus skipped is the honest score).
Each load run measures the target's CPU (utime + stime of its pid from /proc/PID/stat)
before and after, like lib/fio does for fio runs, and keeps the client's output in the
workdir (`iscsi-perf-TAG.txt`, `qemu-img-bench-TAG.txt`), as lib/fio keeps fio's JSON.
"""

import os

import re
import socket
import time

from .machine import cpu_seconds
from .proc import BenchError, run

# iscsi-perf prints progress lines separated by \r; the last one is the run's average
_PERF_AVG = re.compile(r"(?:^|[\r\n])iops average (\d+) \((\d+) MB/s\)")
_QEMU_DONE = re.compile(r"Run completed in ([0-9.]+) seconds")
_RC_BLOCK = re.compile(r"LOGICAL BLOCK LENGTH IN BYTES:\s*(\d+)")
_RC_SIZE = re.compile(r"Total size:\s*(\d+)")
_CU_TESTS = re.compile(r"^\s*tests\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", re.M)
_CU_MARK = re.compile(r"^(Suite: (?P<suite>.*)|  Test: (?P<test>\S+) \.\.\.)", re.M)
# CUnit prints a test's outcome right after "..." or at the start of a line; the
# library's own messages are indented and bracketed ("    [FAILED] ...")
_CU_OUTCOME = re.compile(r"(?:\.\.\.|\n)(passed|FAILED)(?=\s|$)")


def port_open(port, host="127.0.0.1", timeout_s=5.0):
    """Whether something accepts TCP connections on host:port within `timeout_s`."""
    deadline = time.time() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            if time.time() >= deadline:
                return False
            time.sleep(0.2)


def parse_readcapacity(text):
    """(block bytes, size bytes) from iscsi-readcapacity16's output, or (None, None)."""
    b, s = _RC_BLOCK.search(text or ""), _RC_SIZE.search(text or "")
    return (int(b.group(1)) if b else None, int(s.group(1)) if s else None)


def probe(url, port, wait_s=5.0):
    """{"served", "reason", "block_bytes", "size_bytes"} of the LU at `url`."""
    out = {"served": False, "reason": None, "block_bytes": None, "size_bytes": None}
    if not port_open(port, timeout_s=wait_s):
        out["reason"] = f"nothing accepts connections on port {port}"
        return out
    try:
        r = run(["iscsi-readcapacity16", url], check=False, timeout=30)
    except Exception as e:    # subprocess.TimeoutExpired
        out["reason"] = f"login or READ CAPACITY(16) did not answer: {e}"
        return out
    block, size = parse_readcapacity(r.stdout)
    if r.returncode != 0 or not block or not size:
        said = ((r.stderr or "") + (r.stdout or "")).strip().splitlines()
        out["reason"] = (f"login or READ CAPACITY(16) failed ({r.returncode}): "
                         f"{said[-1] if said else 'no output'}")
        return out
    out.update(served=True, block_bytes=block, size_bytes=size)
    return out


def parse_iscsi_perf(text):
    """(IOPS, MB/s) of iscsi-perf's last "iops average" line, or None."""
    found = _PERF_AVG.findall(text or "")
    if not found:
        return None
    iops, mbps = found[-1]
    return float(iops), float(mbps)


def _with_cpu(cpu_pid, fn):
    c0 = cpu_seconds(cpu_pid)
    t0 = time.time()
    r = fn()
    wall = time.time() - t0
    return r, cpu_seconds(cpu_pid) - c0, wall


def _cpu_figures(s, cpu_s, wall_s):
    ios = s["ios"]
    s["wall_s"] = round(wall_s, 3)
    s["server_cpu_s"] = round(cpu_s, 3)
    s["server_cpu_us_per_io"] = round(cpu_s / ios * 1e6, 3) if ios else None
    s["server_cores"] = round(cpu_s / wall_s, 3) if wall_s else None
    return s


def _keep(workdir, name, cmd, r):
    with open(os.path.join(workdir, name), "w") as f:
        f.write(" ".join(cmd) + f"\n(exit {r.returncode})\n\n{r.stdout or ''}\n{r.stderr or ''}")


def iscsi_perf(url, block_bytes, io_bytes, in_flight, runtime_s, random, cpu_pid, tag, workdir):
    """One iscsi-perf run: READ16 of `io_bytes` with `in_flight` outstanding for
    `runtime_s`; a summary like lib/fio's (latency from Little's law, no p99). The
    server's CPU is counted over the whole command (login and logout too: a few ms)."""
    if io_bytes % block_bytes:
        raise BenchError(f"{tag}: {io_bytes} bytes is not a whole number of {block_bytes}-byte blocks")
    cmd = ["iscsi-perf", "-t", str(runtime_s), "-m", str(in_flight),
           "-b", str(io_bytes // block_bytes)] + (["-r"] if random else []) + [url]
    r, cpu_s, wall = _with_cpu(cpu_pid, lambda: run(cmd, check=False, timeout=runtime_s + 120))
    _keep(workdir, f"iscsi-perf-{tag}.txt", cmd, r)
    got = parse_iscsi_perf(r.stdout)
    if r.returncode != 0 or got is None:
        said = ((r.stdout or "") + (r.stderr or "")).replace("\r", "\n").strip().splitlines()
        raise BenchError(f"iscsi-perf {tag} failed ({r.returncode}): {said[-1] if said else ''}")
    iops, _ = got
    # iscsi-perf prints its average (completions / time since its first command) at
    # the first completion once `runtime_s` whole seconds have passed, then sends no
    # more and waits for those in flight: the server did average x run time + in flight
    ios = int(round(iops * runtime_s)) + in_flight
    s = {"tag": tag, "client": "iscsi-perf", "ios": ios, "iops": iops,
         "MBps": round(iops * io_bytes / 1e6, 2),
         "lat_mean_us": round(in_flight / iops * 1e6, 2) if iops else None,
         "lat_p99_us": None, "runtime_s": runtime_s}
    return _cpu_figures(s, cpu_s, wall)


def parse_qemu_bench(text):
    """Seconds of qemu-img bench's "Run completed in S seconds", or None."""
    m = _QEMU_DONE.search(text or "")
    return float(m.group(1)) if m else None


def qemu_img_bench(url, count, io_bytes, depth, flush_interval, cpu_pid, tag, workdir,
                   write=True, pattern="0xa5"):
    """`qemu-img bench -f raw [-w] -t none -c COUNT -d DEPTH -s SIZE --flush-interval N`
    (a non-zero `pattern` so no layer can skip the writes as zeros); its requests are
    sequential, wrapping at the end of the image."""
    cmd = ["qemu-img", "bench", "-f", "raw", "-t", "none", "-c", str(count), "-d", str(depth),
           "-s", str(io_bytes)]
    if write:
        cmd += ["-w", f"--pattern={pattern}"]
        if flush_interval:
            cmd += [f"--flush-interval={flush_interval}"]
    cmd.append(url)
    r, cpu_s, wall = _with_cpu(cpu_pid, lambda: run(cmd, check=False, timeout=1800))
    _keep(workdir, f"qemu-img-bench-{tag}.txt", cmd, r)
    secs = parse_qemu_bench(r.stdout)
    if r.returncode != 0 or not secs:
        said = ((r.stderr or "") + (r.stdout or "")).strip().splitlines()
        raise BenchError(f"qemu-img bench {tag} failed ({r.returncode}): {said[-1] if said else ''}")
    iops = count / secs
    s = {"tag": tag, "client": "qemu-img bench", "ios": count, "iops": round(iops, 1),
         "MBps": round(iops * io_bytes / 1e6, 2),
         "lat_mean_us": round(depth / iops * 1e6, 2), "lat_p99_us": None,
         "runtime_s": secs}
    return _cpu_figures(s, cpu_s, wall)


def parse_test_cu(text):
    """What one iscsi-test-cu run printed: the CUnit summary's tests line and, per test,
    its outcome and whether it was skipped. Counts are None when there is no summary
    (the run did not get that far)."""
    out = {"tests_total": None, "tests_run": None, "passed": None, "failed": None,
           "inactive": None, "skipped": None, "passed_minus_skipped": None,
           "failed_tests": [], "skipped_tests": []}
    text = text or ""
    marks = list(_CU_MARK.finditer(text))
    suite = None
    skipped = 0
    for i, m in enumerate(marks):
        if m.group("suite") is not None:
            suite = m.group("suite").strip()
            continue
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        summary_at = text.find("Run Summary:", m.end(), end)
        seg = text[m.end() - 3:summary_at if summary_at >= 0 else end]
        outcome = _CU_OUTCOME.search(seg)
        name = f"{suite}.{m.group('test')}" if suite else m.group("test")
        if outcome is None:
            continue
        if outcome.group(1) == "FAILED":
            out["failed_tests"].append(name)
        elif "[SKIPPED]" in seg[:outcome.start()]:
            out["skipped_tests"].append(name)
            skipped += 1
    counts = _CU_TESTS.findall(text)
    if counts:
        total, ran, passed, failed, inactive = (int(x) for x in counts[-1])
        out.update(tests_total=total, tests_run=ran, passed=passed, failed=failed,
                   inactive=inactive, skipped=skipped, passed_minus_skipped=passed - skipped)
    return out


def run_test_cu(urls, family, logpath, dataloss=True, timeout_s=1200):
    """iscsi-test-cu --dataloss --test=FAMILY URL [URL2] with its output in `logpath`;
    returns parse_test_cu's record plus the exit code and the command."""
    cmd = ["iscsi-test-cu"] + (["--dataloss"] if dataloss else []) + [f"--test={family}"] + list(urls)
    t0 = time.time()
    try:
        r = run(cmd, check=False, timeout=timeout_s)
        text, rc = (r.stdout or "") + (r.stderr or ""), r.returncode
    except Exception as e:    # subprocess.TimeoutExpired: keep what it printed
        said = getattr(e, "stdout", None) or b""
        text = said.decode(errors="replace") if isinstance(said, bytes) else said
        text += f"\n(bench: iscsi-test-cu stopped after {timeout_s}s)\n"
        rc = None
    with open(logpath, "w") as f:
        f.write(" ".join(cmd) + "\n\n" + text)
    out = parse_test_cu(text)
    out.update(exit_code=rc, command=" ".join(cmd), duration_s=round(time.time() - t0, 1))
    return out
