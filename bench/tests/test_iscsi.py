"""Unit tests of the iSCSI scenarios' parsing and goals: iscsi-perf, iscsi-readcapacity16,
qemu-img bench and iscsi-test-cu output read from fixtures (real outputs of libiscsi
1.19, qemu-img 7.2, tgt 1.0.85 and Zilla, kept in bench/tests/fixtures; ports replaced
by 3260), and the goals built from them (no daemon, no client). Run with the other
harness tests: `python3 -m unittest discover -s bench/tests -t bench`."""

import gzip
import os
import unittest

from lib import iscsi, packages
from lib.daemon import Zilla

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture(name):
    path = os.path.join(FIXTURES, name)
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return f.read()
    with open(path) as f:
        return f.read()


class IscsiPerf(unittest.TestCase):
    def test_final_average_of_a_run(self):
        self.assertEqual(iscsi.parse_iscsi_perf(fixture("iscsi-perf-tgt.txt")), (38518.0, 150.0))

    def test_progress_lines_on_a_terminal_are_separated_by_cr(self):
        # on a tty every progress line ends in \r; the per-tick "iops average" inside
        # a progress line is not the run's average
        text = fixture("iscsi-perf-tgt.txt").replace("        \n00:", "        \r00:")
        self.assertEqual(iscsi.parse_iscsi_perf(text), (38518.0, 150.0))
        only_progress = ("00:00:02 - lba 75208, iops current 36718 (143 MB/s), "
                         "iops average 36718 (143 MB/s), in_flight 8, busy 0\r")
        self.assertIsNone(iscsi.parse_iscsi_perf(only_progress))

    def test_run_summary_counts_the_drained_commands_and_the_server_cpu(self):
        class Done:
            returncode, stdout, stderr = 0, fixture("iscsi-perf-tgt.txt"), ""
        cpu = iter([10.0, 10.5])
        saved = iscsi.run, iscsi.cpu_seconds
        iscsi.run, iscsi.cpu_seconds = (lambda cmd, **kw: Done()), (lambda pid: next(cpu))
        try:
            import tempfile
            with tempfile.TemporaryDirectory() as wd:
                s = iscsi.iscsi_perf("iscsi://x/y/1", 512, 4096, 8, 3, True, 1, "t", wd)
                self.assertTrue(os.path.exists(os.path.join(wd, "iscsi-perf-t.txt")))
        finally:
            iscsi.run, iscsi.cpu_seconds = saved
        self.assertEqual(s["ios"], 38518 * 3 + 8)
        self.assertEqual(s["server_cpu_s"], 0.5)
        self.assertEqual(s["server_cpu_us_per_io"], round(0.5 / (38518 * 3 + 8) * 1e6, 3))
        self.assertEqual(s["lat_mean_us"], round(8 / 38518 * 1e6, 2))
        with self.assertRaises(Exception):
            iscsi.iscsi_perf("iscsi://x/y/1", 4096, 6144, 8, 3, True, 1, "t", "/nonexistent")

    def test_a_failed_login_has_no_figure(self):
        said = ("iscsi-perf version 0.1 - (c) 2014-2015 by Peter Lieven\n\n"
                "Failed to login to target: iscsi_service failed with : Failed to log in to "
                "target. Status: Target not found(515)\n")
        self.assertIsNone(iscsi.parse_iscsi_perf(said))
        self.assertIsNone(iscsi.parse_iscsi_perf(None))


class ReadCapacityAndQemu(unittest.TestCase):
    def test_block_and_size_of_read_capacity_16(self):
        self.assertEqual(iscsi.parse_readcapacity(fixture("iscsi-readcapacity16-tgt.txt")),
                         (512, 67108864))
        self.assertEqual(iscsi.parse_readcapacity("iscsi_connect failed\n"), (None, None))

    def test_seconds_of_qemu_img_bench(self):
        self.assertEqual(iscsi.parse_qemu_bench(fixture("qemu-img-bench-write.txt")),
                         QEMU_BENCH_SECONDS)
        self.assertIsNone(iscsi.parse_qemu_bench("qemu-img: Could not open 'iscsi://...'"))


# the "Run completed" figure of fixtures/qemu-img-bench-write.txt
QEMU_BENCH_SECONDS = 1.942


class TestCu(unittest.TestCase):
    def test_full_run_on_zilla_counts_skipped_tests_among_the_passed(self):
        r = iscsi.parse_test_cu(fixture("iscsi-test-cu-zilla-thick.log.gz"))
        self.assertEqual((r["tests_total"], r["tests_run"], r["passed"], r["failed"],
                          r["inactive"]), (230, 230, 230, 0, 0))
        self.assertEqual(r["skipped"], 115)
        self.assertEqual(r["passed_minus_skipped"], 115)
        self.assertEqual(len(r["skipped_tests"]), 115)
        self.assertIn("CompareAndWrite.Simple", r["skipped_tests"])
        # "Test: Async ...passed    [SKIPPED] PERSISTENT RESERVE IN ...": the message is
        # the suite's clean-up, printed after the test passed; the test ran
        self.assertNotIn("Read10.Async", r["skipped_tests"])
        self.assertEqual(r["failed_tests"], [])

    def test_full_run_on_tgt_names_its_failures(self):
        r = iscsi.parse_test_cu(fixture("iscsi-test-cu-tgtd-thick.log.gz"))
        self.assertEqual((r["tests_run"], r["passed"], r["failed"], r["skipped"],
                          r["passed_minus_skipped"]), (230, 222, 8, 62, 160))
        self.assertEqual(len(r["failed_tests"]), 8)
        self.assertIn("Reserve6.2Initiators", r["failed_tests"])
        self.assertIn("iSCSIdatasn.iSCSIDataSnInvalid", r["failed_tests"])
        self.assertFalse(set(r["failed_tests"]) & set(r["skipped_tests"]))

    def test_multipath_runs(self):
        z = iscsi.parse_test_cu(fixture("iscsi-test-cu-zilla-multipath.log"))
        self.assertEqual((z["tests_run"], z["passed"], z["failed"], z["skipped"]), (4, 3, 1, 1))
        self.assertEqual(z["failed_tests"], ["MultipathIO.Reset"])
        self.assertEqual(z["skipped_tests"], ["MultipathIO.CompareAndWriteAsync"])
        t = iscsi.parse_test_cu(fixture("iscsi-test-cu-tgtd-multipath.log"))
        self.assertEqual(t["failed_tests"], ["MultipathIO.CompareAndWriteAsync"])
        self.assertEqual(t["skipped_tests"], ["MultipathIO.CompareAndWrite"])
        self.assertEqual(t["passed_minus_skipped"], 2)

    def test_a_run_cut_short_has_no_counts(self):
        text = fixture("iscsi-test-cu-zilla-multipath.log")
        cut = text[:text.index("Run Summary")]
        r = iscsi.parse_test_cu(cut)
        for k in ("tests_total", "tests_run", "passed", "failed", "skipped",
                  "passed_minus_skipped"):
            self.assertIsNone(r[k], k)
        # the tests it did get through are still named
        self.assertEqual(r["failed_tests"], ["MultipathIO.Reset"])


class ComplianceGoals(unittest.TestCase):
    def setUp(self):
        from scenarios import iscsi_compliance
        self.c = iscsi_compliance

    def runs(self, zilla_thick="iscsi-test-cu-zilla-thick.log.gz"):
        z = iscsi.parse_test_cu(fixture(zilla_thick)) if zilla_thick else None
        t = iscsi.parse_test_cu(fixture("iscsi-test-cu-tgtd-thick.log.gz"))
        zm = iscsi.parse_test_cu(fixture("iscsi-test-cu-zilla-multipath.log")) if z else None
        tm = iscsi.parse_test_cu(fixture("iscsi-test-cu-tgtd-multipath.log"))
        return {"zilla": {"thick": z, "thin": z, "multipath": zm},
                "tgtd": {"thick": t, "thin": t, "multipath": tm}}

    def test_failures_and_honest_passes_against_tgt(self):
        from tests.test_goals import by_name
        g = self.c.goals(self.runs())
        self.assertTrue(by_name(g, "iscsi-test-cu failures, Zilla thick")["met"])
        mp = by_name(g, "iscsi-test-cu failures, Zilla MultipathIO")
        self.assertEqual((mp["measured"], mp["met"]), (1, False))
        honest = by_name(g, "iscsi-test-cu ALL passed minus skipped, Zilla thick")
        self.assertEqual((honest["measured"], honest["met"]), (115 - 160, False))

    def test_zilla_not_served_is_not_measured(self):
        g = self.c.goals(self.runs(zilla_thick=None))
        self.assertEqual(len(g), 5)
        for x in g:
            self.assertIsNone(x["measured"], x["goal"])
            self.assertFalse(x["met"])


class VsTgtGoals(unittest.TestCase):
    def setUp(self):
        from scenarios import iscsi_vs_tgt
        self.v = iscsi_vs_tgt

    def samples(self, zilla_iops, zilla_cpu_us, served=True):
        s = {}
        for label, *_ in self.v.TESTS:
            s[label] = {"zilla": [{"iops": zilla_iops, "server_cpu_us_per_io": zilla_cpu_us}]
                        if served else [],
                        "zilla_nbd": [{"iops": 60000.0, "server_cpu_us_per_io": 8.0}],
                        "tgtd": [{"iops": 40000.0, "server_cpu_us_per_io": 25.0}]}
        return s

    def test_ratios_and_goals(self):
        from tests.test_goals import by_name
        res = self.v.summarise(self.samples(97500.0, 5.0), 1)
        seed = {r["test"]: r for r in res}[self.v.SEED_TEST]
        self.assertEqual(seed["ratio_zilla_over_tgtd"]["iops"], round(97500 / 40000, 3))
        self.assertEqual(seed["zilla"]["iops_per_cpu_s"], 200000.0)
        self.assertEqual(seed["ratio_zilla_over_tgtd"]["iops_per_cpu"], 5.0)
        g = self.v.goals(res)
        same_client = [label for label, *_, client in self.v.TESTS if client == "qemu"]
        self.assertEqual(len(g), 2 + len(same_client), "iSCSI / NBD goals only where one client runs both")
        self.assertTrue(all("Zilla NBD" not in x["goal"] or x["goal"].split(" IOPS")[0] in same_client for x in g))
        self.assertTrue(by_name(g, "8K cache-hit random read at 100 outstanding, IOPS, ")["met"])
        self.assertTrue(by_name(g, "8K cache-hit random read at 100 outstanding, IOPS per")["met"])
        self.assertTrue(by_name(g, "4K seqread QD1, qemu-img IOPS, Zilla iSCSI / Zilla NBD")["met"])
        self.assertTrue(by_name(g, "128K seqread QD32, qemu-img IOPS, Zilla iSCSI / Zilla NBD")["met"])
        # slower than tgtd per CPU and below 0.85 of NBD: not met
        g = self.v.goals(self.v.summarise(self.samples(45000.0, 20.0), 1))
        self.assertFalse(by_name(g, "8K cache-hit random read at 100 outstanding, IOPS, ")["met"])
        self.assertFalse(by_name(g, "8K cache-hit random read at 100 outstanding, IOPS per")["met"])
        self.assertFalse(by_name(g, "4K write QD32, flush every 1000, wce=on IOPS")["met"])

    def test_zilla_not_served_is_not_measured(self):
        g = self.v.goals(self.v.summarise(self.samples(0, 0, served=False), 1))
        for x in g:
            self.assertIsNone(x["measured"], x["goal"])
            self.assertFalse(x["met"])


class Names(unittest.TestCase):
    def test_target_name_of_a_volume_as_the_cli_documents_it(self):
        self.assertEqual(Zilla.iqn("tank/Data_1"), "iqn.2026-11.io.zilla:tank.data-1")
        self.assertEqual(Zilla.iqn("bench/vol"), "iqn.2026-11.io.zilla:bench.vol")

    def test_bench_only_packages_stay_out_of_the_test_list(self):
        both = packages.packages_by_command()
        self.assertEqual(both["tgtd"], ["tgt"])
        self.assertEqual(both["iscsi-perf"], ["libiscsi-bin"])
        self.assertEqual(both["qemu-img"], ["qemu-utils", "qemu-block-extra"])
        tests_only = packages.packages_by_command(packages.PACKAGE_LIST)
        self.assertNotIn("tgtd", tests_only)
        # the system tests run qemu-img over iscsi:// too (25_iscsi)
        self.assertEqual(tests_only["qemu-img"], ["qemu-utils", "qemu-block-extra"])


if __name__ == "__main__":
    unittest.main()
