"""Facts about the machine and the processes being measured.

Theory of operation: every result carries the machine it ran on (cores, kernel, CPU
model, memory) and the load average, because the machine is shared and a ratio means
little without them. Server CPU is read from /proc/PID/stat (utime + stime of all
threads) before and after a run; memory from /proc/PID/status.
"""

import os
import shutil
import socket
import time

from .proc import run

CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    return {"cores": os.cpu_count(), "kernel": os.uname().release, "cpu_model": cpu,
            "mem_bytes": mem, "hostname": socket.gethostname()}


def loadavg():
    with open("/proc/loadavg") as f:
        a = f.read().split()
    return [float(a[0]), float(a[1]), float(a[2])]


def cpu_seconds(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kib(pid, key):
    """A /proc/PID/status field in KiB (VmRSS, VmHWM), or None."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def wait_idle(pid, limit=0.05, window_s=1.0, timeout_s=60):
    """Wait until the process uses less than `limit` CPU over `window_s` seconds."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        a = cpu_seconds(pid)
        time.sleep(window_s)
        if (cpu_seconds(pid) - a) / window_s < limit:
            return True
    return False


def tool_versions():
    v = {}
    for tool in ("fio", "nbdkit", "nbdcopy"):
        if shutil.which(tool):
            r = run([tool, "--version"], check=False)
            out = (r.stdout or r.stderr or "").strip()
            v[tool] = out.splitlines()[0] if out else ""
    return v


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
