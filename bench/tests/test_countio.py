"""Unit tests of the work-per-I/O counting (lib/valgrind.py, lib/countio.py): parsing
callgrind dumps and strace -c summaries, the slope, the per-I/O records, the ratios
and the goal (no daemon, no valgrind)."""

import os
import unittest

from lib import countio, valgrind

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


class Callgrind(unittest.TestCase):
    def setUp(self):
        self.p = valgrind.parse_callgrind(fixture("callgrind-small.out"))

    def test_totals_and_self_costs(self):
        self.assertEqual(self.p.events, ["Ir"])
        self.assertEqual(self.p.total(), 9000)
        f = self.p.functions()
        # the self costs add up to the totals line
        self.assertEqual(sum(f.values()), 9000)
        # "+2 50" and "* 10" are self cost lines of the current function; the line
        # after "calls=" is the call's inclusive cost, not self cost
        self.assertEqual(f["zilla_nbd::server::serve"], 160)
        # an fi= / fe= change of file keeps the function
        self.assertEqual(f["zilla_core::zvol::Volume::read"], 3400)
        # "(4)" refers back to the name "(4) __memcpy..." defined by a cfn= line
        self.assertEqual(f["__memcpy_avx_unaligned_erms"], 600)

    def test_inclusive_calls(self):
        c = self.p.calls
        self.assertEqual(c[("zilla_nbd::server::serve", "zilla_core::zvol::Volume::read")]["Ir"], 4000)
        self.assertEqual(c[("zilla::analytics::Collector::sample", "zilla::analytics::leaves")]["Ir"], 1800)

    def test_cost_under_counts_nested_matches_once(self):
        # sample (2500 inclusive) calls leaves (1800): both match, counted once
        self.assertEqual(self.p.cost_under([r"zilla::analytics::.*"]), 2500)
        self.assertEqual(self.p.cost_under([r"zilla::analytics::leaves"]), 1800)
        self.assertEqual(self.p.cost_under([r"nothing::matches"]), 0)

    def test_cost_under_a_thread_root_and_a_recursion_suffix(self):
        # spa_sync'2 is called by nobody in the dump (a thread's first function): its
        # self cost plus its call out (1340 + 1000); the 'N suffix is ignored
        self.assertEqual(self.p.cost_under([r".*::spa_sync"]), 2340)
        self.assertEqual(self.p.cost_under(valgrind.TIMED_WORK), 2500 + 2340)

    def test_instr_line_positions_and_missing_totals(self):
        text = ("events: Ir Dr\npositions: instr line\nfn=(1) a\n0x10 3 7 2\n+4 * 1\n"
                "cfn=(2) b\ncalls=1 0x20 9\n0x14 3 50 5\nfn=(2)\n0x20 9 50 5\n")
        p = valgrind.parse_callgrind(text)
        self.assertEqual(p.functions(), {"a": 8, "b": 50})
        self.assertEqual(p.functions("Dr"), {"a": 2, "b": 5})
        # no totals line: the sum of the self costs
        self.assertEqual(p.total(), 58)
        self.assertEqual(p.cost_under(["b"]), 50)


class Strace(unittest.TestCase):
    def test_summary_table(self):
        s = valgrind.parse_strace_summary(fixture("strace-c-f.txt"))
        self.assertEqual(s["total"], 224)
        self.assertEqual(s["calls"]["futex"], 28)
        self.assertEqual(s["calls"]["epoll_wait"], 19)
        self.assertEqual(s["errors"], {"restart_syscall": 2, "futex": 8, "openat": 5})
        self.assertEqual(sum(s["calls"].values()), 224)

    def test_no_total_line_sums_the_rows(self):
        text = ("% time     seconds  usecs/call     calls    errors syscall\n"
                "------ ----------- ----------- --------- --------- ----------------\n"
                " 60.00    0.000600           3       200           sendmsg\n"
                " 40.00    0.000400           2       201         1 recvfrom\n")
        s = valgrind.parse_strace_summary(text)
        self.assertEqual(s["total"], 401)
        self.assertEqual(s["errors"], {"recvfrom": 1})

    def test_empty(self):
        self.assertEqual(valgrind.parse_strace_summary(""), {"calls": {}, "errors": {}, "total": 0})


class Slope(unittest.TestCase):
    def test_two_points_cancel_what_both_windows_share(self):
        # fixed cost 5000 (connection) + 100/s for 3 s of timed work in both windows
        fixed = 5000 + 300
        self.assertEqual(valgrind.slope([(600, fixed + 600 * 11000), (3000, fixed + 3000 * 11000)]), 11000)

    def test_least_squares_over_pairs(self):
        pts = [(600, 6.6e6 + 10), (3000, 33e6 - 10), (600, 6.6e6 - 10), (3000, 33e6 + 10)]
        self.assertAlmostEqual(valgrind.slope(pts), 11000, places=6)

    def test_one_request_count_has_no_slope(self):
        self.assertIsNone(valgrind.slope([(600, 1), (600, 2)]))
        self.assertIsNone(valgrind.slope([(600, None), (3000, 5)]))
        self.assertIsNone(valgrind.slope([]))


def window(ios, instructions, syscalls=None, by_call=None, kept=True):
    w = {"ios": ios, "instructions": instructions, "rate_kept": kept}
    if syscalls is not None:
        w.update({"syscalls": syscalls, "by_call": by_call or {}})
    return w


W4K = countio.Workload("randread4k", "4K random read", "randread", 4096, 256 << 20, (200, 1000))


def build_record(per_io, sys_per_io):
    return {"workloads": {"randread4k": {"instructions_per_io": per_io, "syscalls_per_io": sys_per_io}}}


class PerIo(unittest.TestCase):
    def test_slopes_of_a_workload(self):
        wr = {"windows": [window(600, 9e6), window(3000, 9e6 + 2400 * 10900.5)],
              "syscall_windows": [window(600, None, 2000, {"sendmsg": 600, "futex": 30}),
                                  window(3000, None, 9200, {"sendmsg": 3000, "futex": 31,
                                                            "epoll_wait": 2400})]}
        r = countio.per_io(wr)
        self.assertEqual(r["instructions_per_io"], 10900.5)
        self.assertEqual(r["syscalls_per_io"], 3.0)
        # per call: futex's +1 over 2400 requests is under 0.01 per I/O and left out
        self.assertEqual(r["syscalls_per_io_by_call"], {"epoll_wait": 1.0, "sendmsg": 1.0})
        self.assertTrue(r["rate_kept"])
        wr["windows"][1]["rate_kept"] = False
        self.assertFalse(countio.per_io(wr)["rate_kept"])

    def test_ratios_and_goal(self):
        recs = {"zilla": build_record(10940.0, 3.03), "zilla_old": build_record(13524.0, 3.03)}
        q = countio.ratios(recs, [W4K])
        self.assertEqual(q, {"randread4k": {"instructions_per_io": 0.8089, "syscalls_per_io": 1.0}})
        g = countio.goal_for({"builds": recs, "ratios": q}, W4K, "204d980", wall_ratio=1.082)
        self.assertEqual(g["goal"], "4K random read daemon CPU per I/O, new / old (204d980), "
                                    "by user-space instructions per I/O")
        self.assertEqual((g["target"], g["measured"], g["met"]), ("<= 1.0", 0.8089, True))
        self.assertEqual(g["instructions_per_io"], {"new": 10940.0, "old": 13524.0})
        self.assertEqual(g["wall_cpu_ratio"], 1.082)
        # more instructions than the old build: not met, whatever the wall clock says
        recs["zilla"] = build_record(13700.0, 3.0)
        q = countio.ratios(recs, [W4K])
        self.assertFalse(countio.goal_for({"builds": recs, "ratios": q}, W4K, "x", 0.9)["met"])

    def test_one_build_has_no_ratio(self):
        self.assertEqual(countio.ratios({"zilla": build_record(1.0, 1.0)}, [W4K]), {})
        self.assertIsNone(countio.ratio4(5, 0))
        self.assertEqual(countio.ratio4(10886, 10842), 1.0041)

    def test_settings_quick_and_full(self):
        q, f = countio.settings(True), countio.settings(False)
        self.assertLess(q["window_s"] * q["pairs"], f["window_s"] * f["pairs"])
        self.assertFalse(q["idle_window"])
        self.assertTrue(f["idle_window"])


if __name__ == "__main__":
    unittest.main()
