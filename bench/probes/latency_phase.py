#!/usr/bin/env python3
"""Fold fio per-write latency logs (LATLOG=1 of bench/probes/throttle.sh) by
completion time mod PERIOD ms: a periodic stall shows as one crowded phase.

    bench/probes/latency_phase.py [DIR] [PERIOD_MS] [SLOW_US]
"""
import collections
import glob
import os
import sys

d = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PROBE_DIR", "/tmp/zilla-probe-throttle")
period = int(sys.argv[2]) if len(sys.argv) > 2 else 100
slow_us = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
phases, n, slow = collections.Counter(), 0, 0
for f in glob.glob(os.path.join(d, "lat_clat.*.log")):
    for line in open(f):
        parts = [x.strip() for x in line.split(",")]
        t_ms, lat_ns = int(parts[0]), int(parts[1])
        n += 1
        if lat_ns > slow_us * 1000:
            slow += 1
            phases[(t_ms % period) // 5 * 5] += 1
print(f"writes {n}, over {slow_us} us: {slow}")
print(f"completion ms mod {period} (5 ms phases), most crowded first:",
      sorted(phases.items(), key=lambda kv: -kv[1])[:6])
