"""Facts about the machine and the processes being measured.

Theory of operation: every result carries the machine it ran on (cores, kernel, CPU
model, memory) and the load average, because the machine is shared and a ratio means
little without them. Server CPU is read from /proc/PID/stat (utime + stime of all
threads) before and after a run; memory from /proc/PID/status. What the rest of the
machine did over a run (steal time: the hypervisor running someone else on our vCPUs;
idle) comes from /proc/stat's `cpu` line, summed over every CPU.
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


CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def system_cpu():
    """The machine's CPU time so far by state (/proc/stat `cpu` line: every CPU summed),
    in seconds; guest time is already inside user."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return parse_cpu_line(fields)


def parse_cpu_line(fields):
    """{state: seconds} of a /proc/stat `cpu` line split on blanks (older kernels may
    have fewer columns: the missing ones are 0)."""
    vals = [int(x) for x in fields[1:1 + len(CPU_STATES)]]
    vals += [0] * (len(CPU_STATES) - len(vals))
    return {n: v / CLK_TCK for n, v in zip(CPU_STATES, vals)}


def machine_cpu_delta(before, after, cpus=None):
    """What the machine's CPUs did between two `system_cpu()` readings: seconds and
    percent of all CPUs' time for steal and idle, and the number of CPUs busy on
    average with anything (user, system, interrupts) and stolen."""
    d = {k: max(0.0, after[k] - before[k]) for k in CPU_STATES}
    total = sum(d.values())
    cpus = cpus or os.cpu_count() or 1
    wall = total / cpus
    pct = (lambda x: round(100 * x / total, 1)) if total else (lambda x: None)
    busy = total - d["idle"] - d["iowait"] - d["steal"]
    return {"cpus": cpus, "wall_s": round(wall, 3),
            "steal_s": round(d["steal"], 3), "steal_pct": pct(d["steal"]),
            "steal_cores": round(d["steal"] / wall, 3) if wall else None,
            "idle_pct": pct(d["idle"] + d["iowait"]),
            "busy_cores": round(busy / wall, 3) if wall else None}


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
