"""Debian packages the benchmarks need, from the list the tests use.

Theory of operation: tests/packages.txt is the one list of Debian packages for tests
and benches: lines `PACKAGE COMMAND`, `#` comments. tests/run installs every package
whose command is missing; a scenario asks for the commands it runs (`ensure_tools`)
and the packages that provide the missing ones are installed the same way (apt-get as
root, or with `sudo -n`; otherwise it fails and names what to install).
"""

import os
import shutil

from .proc import ROOT, BenchError, log, run

PACKAGE_LIST = os.path.join(ROOT, "tests", "packages.txt")


def package_table(path=PACKAGE_LIST):
    """{command: package} from the shared list."""
    table = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise BenchError(f"{path}:{n}: expected 'PACKAGE COMMAND', got {line!r}")
            table[parts[1]] = parts[0]
    return table


def ensure_tools(commands):
    """Install the packages providing any of `commands` that are not on PATH."""
    missing = [c for c in commands if shutil.which(c) is None]
    if not missing:
        return
    table = package_table()
    unknown = [c for c in missing if c not in table]
    if unknown:
        raise BenchError(f"missing {', '.join(unknown)}, which {PACKAGE_LIST} does not list")
    pkgs = sorted({table[c] for c in missing})
    if shutil.which("apt-get") is None:
        raise BenchError(f"missing {', '.join(missing)} and no apt-get: install {' '.join(pkgs)}")
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None:
        raise BenchError(f"missing {', '.join(missing)}: run as root or "
                         f"apt-get install {' '.join(pkgs)}")
    log(f"installing {' '.join(pkgs)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(prefix + ["apt-get", "update", "-qq"], env=env)
    run(prefix + ["apt-get", "install", "-y", "-qq"] + pkgs, env=env)
    still = [c for c in commands if shutil.which(c) is None]
    if still:
        raise BenchError(f"still missing after apt-get: {', '.join(still)}")
