"""Counting a daemon's work per I/O: user-space instructions (callgrind) and system calls
(strace), and the slope that turns counted windows into a cost per request.

Theory of operation: wall-clock CPU per I/O on a shared 2-vCPU VM moves by 15-20 %
between identical runs, and the VM has no hardware counters, so a new/old comparison
of CPU per I/O cannot be decided from it. Instructions executed in user space are a
property of the code and the request sequence, not of the machine's load. The daemon
runs under `valgrind --tool=callgrind --instr-atstart=no` (no instrumentation, so
startup, import and warm-up run at valgrind's core speed and are not counted);
`callgrind_control` switches instrumentation on and zeroes the counters just before a
window of requests, and dumps and switches it off after it (lib/countio.py). Each dump
is parsed here (`parse_callgrind`): the total Ir, each function's self cost and the
inclusive cost of every call, so the cost under given functions can be taken out
(`cost_under`). Valgrind runs one thread at a time; the counts are of every thread.

What is taken out (TIMED_WORK): work that runs on a clock or per connection, not per
request. The daemon's analytics collector samples every counter once a second (~0.45 M
instructions a second on a small pool, growing with every client seen) and saves its
history once a minute, and the txg timer syncs a txg every few seconds; over a 5 s
window at 400 reads/s that was 10 % of the count and, depending on where the ticks
fell, +-3 % of the per-read figure. The inclusive cost of the calls into those
functions is subtracted from each window (a build without them subtracts 0; the
amount is reported). What is left besides the requests (the runtime's timers and
parking, the connection's handshake) is ~50 k instructions a second, the cost of ~5
cached reads, and the slope cancels it.

Windows and the slope: the windows of a workload run equally long at fixed low rates,
one request at a time (iodepth 1), so each request finds the daemon idle and takes the
same path (near the rate the daemon manages under valgrind, threads find work before
they park and the path changes); they differ only in the rate, so in the number of
requests. Per I/O is the slope of counted work against requests (two windows: the
difference quotient), which cancels what every window shares: the client's connection
and handshake, and the clock-driven work not taken out. System calls are counted the
same way with `strace -f -c` attached to the daemon running natively
(`parse_strace_summary`): under valgrind its system calls would be valgrind's too.
"""

import re

# Work that runs on a clock or per connection, not per request: the inclusive cost of
# calls into these functions (demangled names; regular expressions that must match the
# whole name) is left out of a window's count:
# - the daemon's analytics collector and store (its module zilla::analytics: the
#   once-a-second sample, its ingest, the once-a-minute history save; the per-request
#   recorder is in the front end and is counted);
# - the txg sync the txg timer starts every few seconds (a read from the ARC dirties
#   nothing; the sync of an otherwise empty txg still writes uberblocks);
# - what the device queues' worker threads do for those writes (take the next I/O,
#   perform it, complete it: a read from the ARC issues no device I/O);
# - the ARC evictor's look at the system's free memory;
# - the NBD listener's task (accept a connection, spawn its task, reap finished ones:
#   per connection, and whether a finished one is reaped inside a window or before it
#   depends on the listener's buffer-trim tick; connections run in their own tasks).
# Flat call edges cannot follow a call through an unmatched function, so a matched
# function reached from inside another matched one's subtree through unmatched ones is
# counted twice: the list names entry points that do not reach each other (the worker
# functions, not the queue's submit, which the sync calls; a sync's synchronous label
# writes reach two of them, ~1 k instructions).
TIMED_WORK = (r"zilla::analytics::.*",
              r".*::spa_sync", r".*::sync_until_done",
              r"zilla_core::vdev::queue::Shared::(finish|perform_req)",
              r"zilla_core::vdev::queue::select::QueueState::next",
              r".*QueueLimits>::from_tunables",
              r"core::ptr::drop_in_place<zilla_core::vdev::queue::IoDone>",
              r"zilla_core::env::Env::memory_available_bytes",
              r"zilla::nbd_glue::spawn::\{\{closure\}\}")


_NAME = re.compile(r"^\((\d+)\)(?: (.*))?$")
_RECURSION = re.compile(r"'\d+$")
# a cost line's first position: a number (decimal or 0x hex), relative (+N, -N) or "*"
_POSITION = re.compile(r"[+-]?(?:0x[0-9a-fA-F]+|\d+)|\*")


class Profile:
    """One callgrind dump: `events` (names), `totals` ({event: count}), `self_cost`
    ({function: {event: count}}), `calls` ({(caller, callee): {event: inclusive}})."""

    def __init__(self, events, totals, self_cost, calls):
        self.events, self.totals, self.self_cost, self.calls = events, totals, self_cost, calls

    def total(self, event="Ir"):
        return self.totals.get(event, 0)

    def cost_under(self, patterns, event="Ir"):
        """Instructions (`event`) under any function matching one of `patterns`
        (regexes, full match; callgrind's recursion suffix 'N ignored): the inclusive
        cost of every call into a matched function from an unmatched caller (a matched
        function calling another is counted once), and for a matched function no
        function calls (a thread's first function), its self cost and its calls to
        unmatched functions."""
        rx = [re.compile(p) for p in patterns]
        match = lambda name: name is not None and any(r.fullmatch(_RECURSION.sub("", name)) for r in rx)
        total, entered = 0, set()
        for (caller, callee), c in self.calls.items():
            if caller != callee:
                entered.add(callee)
            if match(callee) and not match(caller):
                total += c.get(event, 0)
        for f in self.self_cost:
            if match(f) and f not in entered:
                total += self.self_cost[f].get(event, 0)
                total += sum(c.get(event, 0) for (caller, callee), c in self.calls.items()
                             if caller == f and not match(callee))
        return total

    def functions(self, event="Ir"):
        """{function: self cost of `event`}."""
        return {f: c.get(event, 0) for f, c in self.self_cost.items()}


def _resolve(table, value):
    """Callgrind name compression: "(id) name" defines id, "(id)" refers to it."""
    m = _NAME.match(value.strip())
    if not m:
        return value.strip()
    if m.group(2) is not None:
        table[m.group(1)] = m.group(2)
        return m.group(2)
    return table.get(m.group(1), f"({m.group(1)})")


def parse_callgrind(text):
    """Parse callgrind's output format (one part; `positions: line` or `instr line`)."""
    events, totals, summary = [], None, None
    npos = 1
    names = {"fn": {}, "fl": {}, "ob": {}}
    fn = None
    callee = None
    pending_call = False
    self_cost, calls = {}, {}

    def costs(fields):
        vals = [int(x) for x in fields[npos:npos + len(events)]]
        return dict(zip(events, vals + [0] * (len(events) - len(vals))))

    def add(d, key, c):
        t = d.setdefault(key, {})
        for k, v in c.items():
            t[k] = t.get(k, 0) + v

    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep and key in ("fn", "cfn", "fl", "fi", "fe", "cfi", "cfl", "ob", "cob"):
            table = "fn" if key in ("fn", "cfn") else "ob" if key in ("ob", "cob") else "fl"
            name = _resolve(names[table], value)
            if key == "fn":
                fn, callee = name, None
            elif key == "cfn":
                callee = name
            continue
        if sep and key == "calls":
            pending_call = True
            continue
        if sep and key in ("jump", "jcnd"):
            continue
        head, colon, rest = line.partition(":")
        if colon and re.fullmatch(r"[a-z]+", head):
            rest = rest.strip()
            if head == "events":
                events = rest.split()
            elif head == "positions":
                npos = len(rest.split())
            elif head == "totals":
                totals = dict(zip(events, (int(x) for x in rest.split())))
            elif head == "summary":
                summary = dict(zip(events, (int(x) for x in rest.split())))
            continue
        fields = line.split()
        if not fields or not _POSITION.fullmatch(fields[0]):
            continue
        c = costs(fields)
        if pending_call:
            add(calls, (fn, callee if callee is not None else fn), c)
            pending_call, callee = False, None
        else:
            add(self_cost, fn, c)
    if totals is None:
        totals = summary
    if totals is None:   # no totals line: the sum of every function's self cost
        totals = {e: sum(c.get(e, 0) for c in self_cost.values()) for e in events}
    return Profile(events, totals, self_cost, calls)


_STRACE_ROW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+)\s+(\d+)\s+(?:(\d+)\s+)?(\S+)\s*$")


def parse_strace_summary(text):
    """`strace -c` (or `-c -f`) summary table: {"calls": {syscall: count}, "errors":
    {syscall: count}, "total": count}. Accepts both the classic columns (% time,
    seconds, usecs/call, calls, errors, syscall) and the newer with `-w`."""
    calls, errors, total = {}, {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("%", "-")):
            continue
        m = _STRACE_ROW.match(line)
        if not m:
            continue
        name, n, err = m.group(6), int(m.group(4)), int(m.group(5) or 0)
        if name == "total":
            total = n
            continue
        calls[name] = calls.get(name, 0) + n
        if err:
            errors[name] = errors.get(name, 0) + err
    if total is None:
        total = sum(calls.values())
    return {"calls": calls, "errors": errors, "total": total}


def slope(points):
    """Least-squares slope of [(n, count), ...] (two points: the difference quotient);
    None with fewer than two distinct n."""
    pts = [(float(n), float(c)) for n, c in points if n is not None and c is not None]
    if len({n for n, _ in pts}) < 2:
        return None
    mn = sum(n for n, _ in pts) / len(pts)
    mc = sum(c for _, c in pts) / len(pts)
    num = sum((n - mn) * (c - mc) for n, c in pts)
    den = sum((n - mn) ** 2 for n, _ in pts)
    return num / den
