"""Debian packages the benchmarks need, from the list the tests use.

Theory of operation: tests/packages.txt lists the Debian packages of tests and benches,
bench/packages.txt those only benches need (tgt, qemu-block-extra: the default test run
must not install them); both have lines `PACKAGE COMMAND` and `#` comments, and a
command may have several lines (qemu-img: qemu-utils, and qemu-block-extra for its
iscsi:// driver). tests/run installs every package of its list whose command is missing
or that dpkg does not know; a scenario asks for the commands it runs (`ensure_tools`)
and every package either list gives for a missing one is installed the same way
(tests/tools/apt-install, which never removes a package and installs none of their
recommends, as root or with `sudo -n`; otherwise it fails and names what to install);
`ensure_packages` installs named packages dpkg does not know (a module a present
command loads).
"""

import os
import shutil

from .proc import ROOT, BenchError, log, run

PACKAGE_LIST = os.path.join(ROOT, "tests", "packages.txt")
BENCH_PACKAGE_LIST = os.path.join(ROOT, "bench", "packages.txt")


def package_table(*paths):
    """{command: package} from the lists (the first package listed for it)."""
    return {cmd: pkgs[0] for cmd, pkgs in packages_by_command(*paths).items()}


def packages_by_command(*paths):
    """{command: [packages, in the lists' order]} from `paths` (default: the shared list,
    then the bench-only list)."""
    table = {}
    for path in paths or (PACKAGE_LIST, BENCH_PACKAGE_LIST):
        _read_list(path, table)
    return table


def _read_list(path, table):
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise BenchError(f"{path}:{n}: expected 'PACKAGE COMMAND', got {line!r}")
            pkgs = table.setdefault(parts[1], [])
            if parts[0] not in pkgs:
                pkgs.append(parts[0])


def ensure_tools(commands):
    """Install the packages providing any of `commands` that are not on PATH."""
    missing = [c for c in commands if shutil.which(c) is None]
    if not missing:
        return
    table = packages_by_command()
    unknown = [c for c in missing if c not in table]
    if unknown:
        raise BenchError(f"missing {', '.join(unknown)}, which neither {PACKAGE_LIST} nor "
                         f"{BENCH_PACKAGE_LIST} lists")
    _apt_install(sorted({p for c in missing for p in table[c]}), f"missing {', '.join(missing)}")
    still = [c for c in commands if shutil.which(c) is None]
    if still:
        raise BenchError(f"still missing after apt-get: {', '.join(still)}")


def dpkg_knows(package):
    """Whether dpkg has `package` installed."""
    if shutil.which("dpkg-query") is None:
        return False
    r = run(["dpkg-query", "-W", "-f", "${Status}", package], check=False)
    return r.returncode == 0 and "install ok installed" in (r.stdout or "")


def ensure_packages(packages, why):
    """Install the `packages` dpkg does not know (`why` says what needs them)."""
    missing = [p for p in packages if not dpkg_knows(p)]
    if missing:
        _apt_install(missing, why)


def _apt_install(pkgs, why):
    if shutil.which("apt-get") is None:
        raise BenchError(f"{why} and no apt-get: install {' '.join(pkgs)}")
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None:
        raise BenchError(f"{why}: run as root or apt-get install {' '.join(pkgs)}")
    log(f"installing {' '.join(pkgs)} with tests/tools/apt-install ({why})")
    # the tests' installer: no recommends, never a removal, same-version groups
    run([os.path.join(ROOT, "tests", "tools", "apt-install")] + pkgs)


def package_versions(packages):
    """{package: installed version, or None} as dpkg knows them (all None without dpkg)."""
    out = {p: None for p in packages}
    if shutil.which("dpkg-query") is None:
        return out
    for p in packages:
        r = run(["dpkg-query", "-W", "-f", "${Version}", p], check=False)
        out[p] = (r.stdout or "").strip() or None if r.returncode == 0 else None
    return out
