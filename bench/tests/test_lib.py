"""Unit tests of the harness itself (no daemon, no fio): run by tests/run, or
`python3 -m unittest discover -s bench/tests -t bench`."""

import importlib.machinery
import importlib.util
import os
import tempfile
import unittest

from lib import admin, goals, packages, summary, tables

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def leaf(name, classes):
    return {"name": name, "children": [], "stats": {"classes": classes, "flushes": 0}}


class FakeAdmin(admin.AdminClient):
    def __init__(self, snapshot):
        super().__init__("/nonexistent")
        self.snapshot = snapshot

    def iostat(self, pool):
        return self.snapshot


class StatsByName(unittest.TestCase):
    def test_every_class_counted_by_direction_scrub_included(self):
        a = leaf("d0", {"sync_read": {"direction": "read", "bytes": 100, "ops": 1},
                        "scrub": {"direction": "read", "bytes": 1000, "ops": 2},
                        "async_write": {"direction": "write", "bytes": 7, "ops": 3}})
        b = leaf("d1", {"trim": {"direction": "write", "bytes": 5, "ops": 4,
                                 "queued": 2, "active": 1}})
        snap = {"vdevs": [{"name": "mirror-0", "children": [a, b], "stats": {}}]}
        c = FakeAdmin(snap)
        self.assertEqual(c.device_bytes("p"), {"read": 1100, "write": 12, "read_ops": 3,
                                               "write_ops": 7, "leaves": 2})
        self.assertEqual(c.leaf_queues("p"), {"d0": (0, 0), "d1": (2, 1)})

    def test_legacy_arrays_decode_through_the_old_class_order(self):
        st = {"ops": [1, 2, 3, 4, 5], "bytes": [10, 20, 30, 40, 50],
              "queued": [0, 0, 0, 6, 0], "active": [0, 0, 0, 0, 9]}
        cl = admin.class_stats(st)
        self.assertEqual(cl["scrub"], {"direction": "read", "ops": 5, "bytes": 50,
                                       "errors": 0, "queued": 0, "active": 9})
        self.assertEqual(cl["async_write"]["queued"], 6)
        c = FakeAdmin({"vdevs": [{"name": "f0", "children": [], "stats": st}]})
        self.assertEqual(c.device_bytes("p")["read"], 10 + 30 + 50)
        self.assertEqual(c.device_bytes("p")["write"], 20 + 40)


class Goals(unittest.TestCase):
    def test_goal_record(self):
        self.assertEqual(goals.goal("x", ">=", 0.95, 0.951),
                         {"goal": "x", "target": ">= 0.95", "measured": 0.951, "unit": "x",
                          "met": True})
        self.assertFalse(goals.new_over_old("y", 0.94, "204d980")["met"])
        self.assertFalse(goals.goal("z", ">=", 1.0, None)["met"])

    def test_ratio_of_missing_is_none(self):
        self.assertIsNone(tables.ratio(None, 2))
        self.assertIsNone(tables.ratio(1, 0))
        self.assertEqual(tables.ratio(1, 3), 0.333)


class PackageList(unittest.TestCase):
    def test_shared_list_names_what_the_scenarios_run(self):
        t = packages.package_table()
        for cmd in ("fio", "nbdkit", "nbdcopy"):
            self.assertIn(cmd, t)
        self.assertEqual(t["nbdcopy"], "libnbd-bin")

    def test_malformed_line_is_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("fio fio\njustonefield\n")
        try:
            with self.assertRaises(Exception) as e:
                packages.package_table(f.name)
            self.assertIn(":2:", str(e.exception))
        finally:
            os.unlink(f.name)


class Arguments(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        loader = importlib.machinery.SourceFileLoader("bench_run", os.path.join(BENCH, "run"))
        spec = importlib.util.spec_from_loader("bench_run", loader)
        cls.runner = importlib.util.module_from_spec(spec)
        loader.exec_module(cls.runner)

    def test_compare_old_forms(self):
        p = self.runner.parse_args
        os.environ.pop("BENCH_COMPARE_OLD", None)
        self.assertEqual(p(["pool-vs-direct"]), ("pool-vs-direct", False, None))
        self.assertEqual(p(["--compare-old", "nbd-vs-nbdkit", "--quick"]),
                         ("nbd-vs-nbdkit", True, "204d980"))
        self.assertEqual(p(["nbd-vs-nbdkit", "--compare-old", "abc123"]),
                         ("nbd-vs-nbdkit", False, "abc123"))
        self.assertEqual(p(["nbd-vs-nbdkit", "--compare-old=HEAD~3"]),
                         ("nbd-vs-nbdkit", False, "HEAD~3"))
        for bad in (["nope"], ["nbd-vs-nbdkit", "--fast"], [], ["nbd-vs-nbdkit", "--compare-old="]):
            with self.assertRaises(ValueError):
                p(bad)


if __name__ == "__main__":
    unittest.main()


class PicketFenceIntervals(unittest.TestCase):
    """The picket-fence figure: per-100 ms p99 of a read latency log."""

    def setUp(self):
        from scenarios import picket_fence
        self.pf = picket_fence

    def test_a_slow_interval_stands_out_and_sparse_intervals_are_left_out(self):
        samples = [(t, 10_000.0) for t in range(0, 1000, 10)]            # 10 reads per 100 ms
        samples += [(t, 120_000.0) for t in range(500, 600, 20)]           # a stall in 500..600
        samples += [(1200, 5.0)]                                            # 1 read: left out
        r = self.pf.summarise_reads(sorted(samples), 1.3)
        self.assertEqual(r["intervals"], 10)
        self.assertEqual(r["interval_p99_min_us"], 10_000.0)
        self.assertEqual(r["interval_p99_max_us"], 120_000.0)
        self.assertEqual(r["interval_p99_ratio"], 12.0)
        self.assertEqual([s[0] for s in r["series"]][5], 0.5)

    def test_the_latency_log_keeps_reads_only(self):
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "rd")
            with open(prefix + "_lat.1.log", "w") as f:
                f.write("5, 2000000, 0, 4096, 0\n7, 9000000, 1, 4096, 0\n")
            self.assertEqual(self.pf.read_lat_log(prefix), [(5, 2000.0)])


class MemdirCleanup(unittest.TestCase):
    """Device images in /dev/shm hold RAM: removed at exit even with BENCH_KEEP=1."""

    def test_a_memdir_is_removed_with_bench_keep_and_a_workdir_is_kept(self):
        from lib import proc
        with tempfile.TemporaryDirectory() as base:
            old = {k: os.environ.get(k) for k in ("BENCH_KEEP", "BENCH_TMPDIR", "BENCH_MEMDIR")}
            try:
                os.environ.update(BENCH_KEEP="1", BENCH_TMPDIR=base)
                os.environ.pop("BENCH_MEMDIR", None)
                wd = proc.make_workdir()
                md = proc.make_memdir(need_bytes=1)
                img = os.path.join(md, "d0.img")
                with open(img, "wb") as f:
                    f.write(b"x" * 8192)
                self.assertGreaterEqual(proc.allocated_bytes([img]), 8192)
                self.assertEqual(proc.is_memdir(md), md.startswith("/dev/shm/"))
                proc.cleanup()
                self.assertTrue(os.path.isdir(wd))
                self.assertEqual(os.path.isdir(md), not md.startswith("/dev/shm/"))
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

    def test_picket_fence_records_where_its_devices_live(self):
        from scenarios import picket_fence as pf
        cfg = pf.settings(True)
        self.assertEqual(pf.backing_worst_case(cfg), 4 * cfg["sim_hdd_bytes"] + 2 * cfg["log_ssd_bytes"])
        self.assertLess(pf.backing_worst_case(cfg), 10 << 30)
        rec = pf.backing_record("/tmp/not-a-memdir", cfg)
        self.assertFalse(rec["in_memory"])
        self.assertEqual(rec["worst_case_bytes"], pf.backing_worst_case(cfg))


class ThrottleWindow(unittest.TestCase):
    """The throttle bench's measured window: two cumulative fio dumps and the ramp's end."""

    def setUp(self):
        from scenarios import throttle
        self.th = throttle

    @staticmethod
    def dump(ts_ms, lats_ns):
        import statistics
        n = len(lats_ns)
        bins = {}
        for x in lats_ns:
            bins[str(x)] = bins.get(str(x), 0) + 1
        lat = {"N": n, "mean": statistics.fmean(lats_ns) if n else 0.0,
               "stddev": statistics.stdev(lats_ns) if n > 1 else 0.0, "bins": bins}
        return {"timestamp_ms": ts_ms,
                "jobs": [{"write": {"total_ios": n, "io_bytes": 8192 * n, "lat_ns": lat}}]}

    def test_the_window_is_the_difference_of_two_dumps(self):
        import statistics
        ramp = [50_000] * 900 + [9_000_000] * 100            # a slow burst before the window
        window = [1_000 * (1 + i % 7) for i in range(2000)] + [40_000]
        r = self.th.window_stats(self.dump(10_000, ramp), self.dump(12_000, ramp + window))
        self.assertEqual(r["ios"], len(window))
        self.assertAlmostEqual(r["seconds"], 2.0)
        self.assertAlmostEqual(r["iops"], len(window) / 2, places=1)
        self.assertAlmostEqual(r["mean_us"], statistics.fmean(window) / 1000, places=1)
        self.assertAlmostEqual(r["stddev_us"], statistics.stdev(window) / 1000, places=1)
        self.assertEqual(r["p50_us"], 4.0)                    # values 1..7 us, equally often
        self.assertEqual(r["p99_us"], 7.0)
        self.assertEqual(r["max_us"], 40.0)                   # the ramp's 9 ms writes are not in it

    def test_the_ramp_ends_when_dirty_data_stops_growing(self):
        rising = [(i * 0.25, 100e6 * i * 0.25) for i in range(40)]         # 100 MB/s
        self.assertFalse(self.th.is_steady(rising, 3, 20e6))
        flat = rising + [(10 + i * 0.25, 1e9 + (i % 8) * 2e6) for i in range(16)]   # a small sawtooth
        self.assertTrue(self.th.is_steady(flat, 3, 20e6))
        falling = flat + [(14 + i * 0.25, 1e9 - 30e6 * i * 0.25) for i in range(16)]
        self.assertFalse(self.th.is_steady(falling, 3, 20e6))
        self.assertFalse(self.th.is_steady(flat[:2], 3, 20e6))             # too few samples

    def test_every_dump_of_a_fio_output_file_is_read(self):
        text = 'w: (g=0)\n{\n "a" : 1\n}\n{\n "a" : {"b" : 2}\n}\nfio: terminating on signal 2\n{"a": 3}\n'
        self.assertEqual([o["a"] for o in self.th.json_objects(text)], [1, {"b": 2}, 3])


class CurrentFigures(unittest.TestCase):
    def result(self, d, name, goals_, quick=False):
        import json
        with open(os.path.join(d, f"{name}.json"), "w") as f:
            json.dump({"scenario": name, "quick": quick, "started_utc": "2026-01-02T03:04:05Z",
                       "git_commit": "abc1234", "machine": {"cores": 2, "cpu_model": "CPU"},
                       "builds": [{"rev": None}, {"rev": "def5678"}], "goals": goals_}, f)

    def test_every_goal_is_a_row_with_its_rerun_command(self):
        with tempfile.TemporaryDirectory() as d:
            self.result(d, "slog", [goals.goal("a (issue 7)", ">=", 12, 22.5),
                                    goals.goal("b", "<=", 100, 159.1, unit="us")])
            self.result(d, "throttle", [goals.goal("c", ">=", 1.0, None)], quick=True)
            block = summary.render(summary.load(d))
        self.assertIn("| slog | a | >= 12x | 22.5x | met |", block)
        self.assertIn("| slog | b | <= 100 us | 159.1 us | **not met** |", block)
        self.assertIn("| throttle | c | >= 1.0x | not measured | **not met** |", block)
        self.assertIn("1 of 3 goals met", block)
        self.assertIn("`bench/run slog --compare-old def5678`", block)
        self.assertIn("`bench/run throttle --quick --compare-old def5678`", block)

    def test_the_block_between_the_markers_is_replaced_and_nothing_else(self):
        with tempfile.TemporaryDirectory() as d:
            doc = os.path.join(d, "B.md")
            with open(doc, "w") as f:
                f.write(f"head\n{summary.BEGIN}\nold\n{summary.END}\ntail\n")
            summary.write_into(doc, f"{summary.BEGIN}\nnew\n{summary.END}")
            with open(doc) as f:
                self.assertEqual(f.read(), f"head\n{summary.BEGIN}\nnew\n{summary.END}\ntail\n")
            with open(doc, "w") as f:
                f.write("no markers\n")
            with self.assertRaises(ValueError):
                summary.write_into(doc, "x")


class HeatmapFigures(unittest.TestCase):
    """The numbers a heat-map picture is checked against, from analytics query answers."""

    # buckets 0..3: [0, 1000), [1000, 2000), [2000, 4000), [4000, open)
    EDGES = {"lower": [0, 1000, 2000, 4000], "upper": [1000, 2000, 4000, None]}

    def query(self):
        return {"times": [10, 11, 12, 13],
                "series": [{"key": "write", "buckets": [[[3, 5]], [[3, 4], [1, 1]], None, [[1, 9]]]},
                           {"key": "other", "buckets": [[[1, 1]], [], [[2, 2]], [[1, 1]]]}]}

    def test_a_range_sums_its_points_and_keys_and_the_median_bucket_is_found(self):
        from lib import heatmap
        q = self.query()
        before = heatmap.summed_buckets(q, 9, 11)                 # times 10, 11
        self.assertEqual(before, {3: 9, 1: 2})
        m = heatmap.median_latency_ns(before, self.EDGES)
        self.assertEqual((m["bucket"], m["lower_ns"], m["upper_ns"], m["events"]), (3, 4000, 8000, 11))
        after = heatmap.summed_buckets(q, 11, 13)                 # times 12, 13
        self.assertEqual(heatmap.median_latency_ns(after, self.EDGES)["bucket"], 1)
        self.assertIsNone(heatmap.median_latency_ns({}, self.EDGES))

    def test_each_second_gets_the_bucket_of_its_p99(self):
        from scenarios import picket_fence
        p99 = picket_fence.per_second_p99_us(self.query(), self.EDGES)
        self.assertEqual(p99, [[10, 8.0], [11, 8.0], [12, 4.0], [13, 2.0]])

    def test_the_worksheet_url_carries_datasets_filters_and_range(self):
        from lib import heatmap
        url = heatmap.worksheet_url(8080, [("io.latency/op", "write"), "disk.latency/device"], 100, 200)
        self.assertEqual(url, "http://127.0.0.1:8080/ui/worksheet#ds=io.latency/op|write"
                              "&ds=disk.latency/device&from=100&to=200")
