"""Scenario iscsi-compliance: libiscsi's iscsi-test-cu against Zilla's target and tgtd.

Theory of operation: tgtd (lib/daemon.Tgtd: foreground, own management socket and
portal) serves two file LUs of VOLUME_BYTES: LUN 1 fully provisioned, LUN 2 with
thin_provisioning=1; a Zilla daemon (`serve --iscsi 127.0.0.1:PORT`) serves a thick
volume (bench/thick) and a sparse one (`-s`, bench/sparse) on a pool of two 2-way
mirrors of sparse files. Each system gets the same three runs, one after another:
`iscsi-test-cu --dataloss --test=ALL` on the thick LU, the same on the thin / sparse LU,
and `--test=ALL.MultipathIO` with the thick LU's URL given twice (two sessions to one
LU: the "multipath" the suite tests). Every run's full output is kept (the workdir,
kept with BENCH_KEEP=1, and gzipped in bench/results/iscsi-compliance/); its CUnit
summary gives tests run, passed and failed, and a test that printed [SKIPPED] before
its "passed" counts as skipped (CUnit counts it as passed: an unimplemented command or
a precondition such as "fully provisioned" skips it). The score is passed minus
skipped.

Goals: no failure in any of Zilla's three runs, and Zilla's passed-minus-skipped above
tgt's on the thick LU and on the thin / sparse LU (measured as the difference, >= 1).
A build that does not serve iSCSI (no `--iscsi` flag, nothing on the port, login or
READ CAPACITY failing) gets tgt's runs only, and its goals are not measured (null, not
met) with the reason in `zilla_iscsi` and in the log.
"""

import gzip
import os
import shutil

from lib import iscsi
from lib.daemon import Tgtd, Zilla
from lib.goals import goal
from lib.packages import ensure_tools, package_versions
from lib.proc import ROOT, BenchError, log, make_workdir
from lib.tables import fmt, table

NAME = "iscsi-compliance"
DESCRIPTION = ("iscsi-test-cu --dataloss: ALL on a thick and a thin/sparse LU, MultipathIO with "
               "two sessions: Zilla's target vs tgtd (passed minus skipped, failures)")
MiB, GiB = 1 << 20, 1 << 30
VOLUME_BYTES = 256 * MiB
# (run name, family, LU kind, sessions)
RUNS = [("thick", "ALL", "thick", 1), ("thin", "ALL", "thin", 1),
        ("multipath", "ALL.MultipathIO", "thick", 2)]
LOG_DIR = os.path.join(ROOT, "bench", "results", "iscsi-compliance")
SYSTEMS = ("zilla", "tgtd")


def run_scenario(ctx):
    ensure_tools(["tgtd", "tgtadm", "iscsi-test-cu", "iscsi-readcapacity16"])
    if ctx.old is not None:
        log("iscsi-compliance runs this tree's build and tgtd; the old build is not run")
    if ctx.quick:
        log("--quick makes the same runs: the whole suite takes about a minute per system")
    wd = make_workdir()
    log(f"workdir {wd}; LUs of {VOLUME_BYTES // MiB} MiB")
    tgt = Tgtd(wd)
    for lun, name, thin in ((1, "tgt-thick.img", False), (2, "tgt-thin.img", True)):
        path = os.path.join(wd, name)
        with open(path, "wb") as f:
            f.truncate(VOLUME_BYTES)
        tgt.add_lun(lun, path, thin=thin)
    urls = {"tgtd": {"thick": tgt.url(1), "thin": tgt.url(2)}}
    lu = iscsi.probe(urls["tgtd"]["thick"], tgt.port)
    if not lu["served"]:
        raise BenchError(f"tgtd does not serve its LUN 1: {lu['reason']}; see {tgt.logpath}")

    z = Zilla(ctx.new, wd)
    make_pool(z, wd)
    zilla_lu = zilla_iscsi(z)
    if zilla_lu["served"]:
        urls["zilla"] = {"thick": z.iscsi_url("bench/thick"), "thin": z.iscsi_url("bench/sparse")}

    os.makedirs(LOG_DIR, exist_ok=True)
    runs = {s: {} for s in SYSTEMS}
    for system in ("tgtd", "zilla"):
        if system not in urls:
            for name, *_ in RUNS:
                runs[system][name] = None
            continue
        for name, family, kind, sessions in RUNS:
            runs[system][name] = one_run(system, name, family, [urls[system][kind]] * sessions, wd)
    print_table(runs, zilla_lu)
    tgt.stop()
    z.stop()
    return {"config": {"lu_bytes": VOLUME_BYTES,
                       "runs": [{"name": n, "test": f, "lu": k, "sessions": s} for n, f, k, s in RUNS],
                       "tgtd": "LUN 1: file, fully provisioned; LUN 2: file, thin_provisioning=1; "
                               "rdwr backing store",
                       "zilla": "bench/thick (volume create -V), bench/sparse (volume create -s -V) "
                                "on mirror d0 d1 mirror d2 d3 (sparse files)",
                       "score": "passed minus skipped (a test that printed [SKIPPED] before its "
                                "'passed')",
                       "logs": os.path.relpath(LOG_DIR, ROOT),
                       "quick": "the same runs as a full run (they take about a minute)",
                       "packages": package_versions(("tgt", "libiscsi-bin"))},
            "zilla_iscsi": zilla_lu, "runs": runs, "goals": goals(runs)}


def make_pool(z, wd):
    z.create_mirror_pool(wd, 2 * VOLUME_BYTES + 2 * GiB)
    z.cli("volume", "create", "-V", str(VOLUME_BYTES), "bench/thick")
    z.cli("volume", "create", "-s", "-V", str(VOLUME_BYTES), "bench/sparse")


def zilla_iscsi(z):
    url = z.iscsi_url("bench/thick")
    if url is None:
        lu = {"served": False, "block_bytes": None, "size_bytes": None,
              "reason": "this build's `serve` has no --iscsi flag"}
    else:
        lu = iscsi.probe(url, z.iscsi_port)
        if lu["served"]:
            s = iscsi.probe(z.iscsi_url("bench/sparse"), z.iscsi_port, wait_s=1)
            if not s["served"]:
                lu.update(served=False, reason=f"bench/sparse: {s['reason']}")
    lu["url"] = url
    if lu["served"]:
        log(f"zilla serves iSCSI at {url} ({lu['block_bytes']}-byte blocks)")
    else:
        log(f"zilla does not serve iSCSI ({lu['reason']}): only tgtd's runs are made, and "
            "Zilla's goals are not measured")
    return lu


def one_run(system, name, family, urls, wd):
    path = os.path.join(wd, f"{system}-{name}.log")
    log(f"{system} {name}: iscsi-test-cu --dataloss --test={family} ({len(urls)} session(s))")
    r = iscsi.run_test_cu(urls, family, path)
    kept = os.path.join(LOG_DIR, f"{system}-{name}.log.gz")
    with open(path, "rb") as src, gzip.open(kept, "wb") as dst:
        shutil.copyfileobj(src, dst)
    r["log"] = os.path.relpath(kept, ROOT)
    if r["tests_run"] is None:
        log(f"{system} {name}: no CUnit summary (exit {r['exit_code']}); see {path}")
    else:
        log(f"{system} {name}: {r['tests_run']} run, {r['passed']} passed, {r['failed']} failed, "
            f"{r['skipped']} skipped: {r['passed_minus_skipped']} passed minus skipped"
            + (f"; failed: {', '.join(r['failed_tests'])}" if r["failed_tests"] else ""))
    return r


def print_table(runs, zilla_lu):
    rows = []
    for system in SYSTEMS:
        for name, family, *_ in RUNS:
            r = runs[system][name]
            if r is None:
                rows.append([f"{system} {name}", family] + ["-"] * 5)
                continue
            rows.append([f"{system} {name}", family, fmt(r["tests_run"]), fmt(r["passed"]),
                         fmt(r["failed"]), fmt(r["skipped"]), fmt(r["passed_minus_skipped"])])
    print(table(["run", "test", "run", "passed", "failed", "skipped", "passed - skipped"], rows))
    if not zilla_lu["served"]:
        print(f"zilla iSCSI: not measured ({zilla_lu['reason']})")


def _field(run, key):
    return None if run is None else run.get(key)


def goals(runs):
    z, t = runs["zilla"], runs["tgtd"]
    g = [goal(f"iscsi-test-cu failures, Zilla {what}", "<=", 0, _field(z[name], "failed"), "tests")
         for name, what in (("thick", "thick volume, ALL"), ("thin", "sparse volume, ALL"),
                            ("multipath", "MultipathIO, two sessions"))]
    for name, what in (("thick", "thick volume - tgt file LU"),
                       ("thin", "sparse volume - tgt thin LU")):
        zs, ts = _field(z[name], "passed_minus_skipped"), _field(t[name], "passed_minus_skipped")
        diff = zs - ts if zs is not None and ts is not None else None
        g.append(goal(f"iscsi-test-cu ALL passed minus skipped, Zilla {what}", ">=", 1, diff,
                      "tests"))
    return g
