"""The servers under test: a zilla daemon, an nbdkit server and a tgtd iSCSI target.

Theory of operation: each server is a child process in its own session with its log in
the scenario's workdir, listening on free loopback TCP ports; the constructor returns
once it accepts connections (and, for zilla, once its admin socket exists), and the
process is stopped at exit even if the scenario fails (proc.spawn). A zilla daemon gets
its own state dir, so an old and a new build can run side by side; a build whose
`serve` takes `--iscsi` gets a free port for it too (never the default 3260, which a
system target or a second daemon may hold), whether or not that build serves iSCSI yet
(lib/iscsi.probe tells). tgtd runs in the foreground with its own management socket
(`-C PORT`) and portal, so it never talks to or clashes with a system tgtd.
"""

import os
import random
import re
import socket
import time
from functools import lru_cache

from .admin import AdminClient
from .machine import free_port
from .proc import BenchError, run, spawn, stop


def wait_port(port, proc, what, timeout_s=30):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"{what} did not listen on port {port} within {timeout_s}s")


@lru_cache(maxsize=None)
def takes_iscsi_flag(binary):
    """Whether `binary serve` accepts `--iscsi ADDR` (builds before the flag refuse it)."""
    r = run([binary, "serve", "--help"], check=False)
    return "--iscsi" in (r.stdout or "")


ISCSI_IQN_PREFIX = "iqn.2026-11.io.zilla"


class Zilla:
    """`zilla serve` of one build (build.Build) with its own state dir in `workdir`."""

    def __init__(self, build, workdir, tunables=(), log_tag="", config=None, wrapper=(), env=None):
        """`tunables` ("name=value" strings) are set with `serve --tunable`, before the
        pools of the state dir are imported (a restart on the same `workdir` re-imports
        them); `log_tag` names a separate log for such a restart; `config` ({key: value})
        is written to a `serve --config` file; `wrapper` is a command the daemon runs
        under (valgrind: its pid is the daemon's, valgrind execs its tool in place);
        `env` adds environment variables."""
        self.build = build
        self.label = build.label
        self.state = os.path.join(workdir, f"{self.label}-state")
        os.makedirs(self.state, exist_ok=True)
        self.nbd_port = free_port()
        self.http_port = free_port()
        # the iSCSI port, or None for a build without the flag
        self.iscsi_port = free_port() if takes_iscsi_flag(build.binary) else None
        self.logpath = os.path.join(workdir, f"{self.label}{'-' + log_tag if log_tag else ''}.log")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"), **(env or {}))
        extra = [x for t in tunables for x in ("--tunable", t)]
        if config:
            path = os.path.join(workdir, f"{self.label}.conf")
            with open(path, "w") as f:
                f.writelines(f"{k} = {v}\n" for k, v in config.items())
            extra += ["--config", path]
        self.proc = spawn(list(wrapper) + [build.binary, "--state-dir", self.state, "serve",
                           "--nbd", f"127.0.0.1:{self.nbd_port}",
                           "--http", f"127.0.0.1:{self.http_port}"]
                          + (["--iscsi", f"127.0.0.1:{self.iscsi_port}"] if self.iscsi_port else [])
                          + extra, self.logpath, env=env)
        self.pid = self.proc.pid
        wait_port(self.nbd_port, self.proc, f"{self.label} serve", timeout_s=120 if wrapper else 30)
        sock = os.path.join(self.state, "zilla.sock")
        deadline = time.time() + 30
        while not os.path.exists(sock):
            if time.time() > deadline or self.proc.poll() is not None:
                raise BenchError(f"{self.label} admin socket {sock} did not appear; "
                                 f"see {self.logpath}")
            time.sleep(0.1)
        self.admin = AdminClient(sock)
        # a sim device's flush costs the model's time only, not the lab disk's
        # fdatasync on top (builds without the tunable flush it either way)
        run([build.binary, "--state-dir", self.state, "tunable", "set",
             "sim_flush_backing=0"], check=False)

    def create_mirror_pool(self, workdir, leaf_bytes, name="bench"):
        """Pool `name` of two 2-way mirrors of sparse files of `leaf_bytes` in `workdir`."""
        leaves = []
        for i in range(4):
            p = os.path.join(workdir, f"zilla-d{i}.img")
            with open(p, "wb") as f:
                f.truncate(leaf_bytes)
            leaves.append(p)
        self.cli("pool", "create", name, "mirror", leaves[0], leaves[1], "mirror", leaves[2], leaves[3])
        return leaves

    def cli(self, *args):
        return run([self.build.binary, "--state-dir", self.state] + list(args)).stdout

    def uri(self, export):
        return f"nbd://127.0.0.1:{self.nbd_port}/{export}"

    @staticmethod
    def iqn(volume):
        """The target name of POOL/VOLUME (docs/cli.md): iqn.2026-11.io.zilla:POOL.VOLUME,
        lowercased, every character but a-z, 0-9, '-' and '.' made '-'."""
        name = volume.lower().replace("/", ".")
        return f"{ISCSI_IQN_PREFIX}:{re.sub(r'[^a-z0-9.-]', '-', name)}"

    def iscsi_url(self, volume, lun=0):
        """iscsi://127.0.0.1:PORT/iqn.2026-11.io.zilla:POOL.VOLUME/0 (None for a build
        without `--iscsi`)."""
        if self.iscsi_port is None:
            return None
        return f"iscsi://127.0.0.1:{self.iscsi_port}/{self.iqn(volume)}/{lun}"

    def stop(self):
        stop(self.proc)

    def kill(self):
        """SIGKILL: no export, no last txg sync (a crash as far as the pool can tell)."""
        self.proc.kill()
        self.proc.wait()
        stop(self.proc)    # forgets it


class Nbdkit:
    """`nbdkit file IMAGE` (page cache, default threads)."""

    label = "nbdkit"

    def __init__(self, workdir, image, plugin=None):
        """`nbdkit file IMAGE`, or with `plugin` (a list such as ["null", "1G"]) that
        plugin instead (`null`: no storage at all, the protocol's own cost)."""
        self.port = free_port()
        self.logpath = os.path.join(workdir, "nbdkit.log")
        args = plugin if plugin else ["file", image]
        self.proc = spawn(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(self.port)] + args,
                          self.logpath)
        self.pid = self.proc.pid
        wait_port(self.port, self.proc, "nbdkit")

    def uri(self):
        return f"nbd://127.0.0.1:{self.port}/"

    def stop(self):
        stop(self.proc)


class Tgtd:
    """`tgtd -f` (the Linux SCSI target framework's user-space iSCSI target) with its own
    management socket and portal on a free loopback port; LUNs on files with the rdwr
    backing store (the page cache), target `iqn.2026-11.io.zilla.bench:tgt`."""

    label = "tgtd"
    iqn = "iqn.2026-11.io.zilla.bench:tgt"
    SOCKET_DIR = "/var/run/tgtd"

    def __init__(self, workdir):
        if os.geteuid() != 0:
            raise BenchError("tgtd needs root (its management socket is in /var/run/tgtd)")
        self.port = free_port()
        self.control_port = self._free_control_port()
        self.logpath = os.path.join(workdir, "tgtd.log")
        self.proc = spawn(["tgtd", "-f", "-C", str(self.control_port),
                           "--iscsi", f"portal=127.0.0.1:{self.port}"], self.logpath)
        self.pid = self.proc.pid
        wait_port(self.port, self.proc, "tgtd")
        self.tgtadm("--op", "new", "--mode", "target", "--tid", "1", "-T", self.iqn)
        self.tgtadm("--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL")
        self.luns = {}

    # tgtd takes a control port of at most 32767 (`-C`); the "port" only names its unix
    # socket /var/run/tgtd/socket.N, so any number no socket there holds will do
    CONTROL_PORTS = range(20000, 32000)

    def _free_control_port(self):
        for _ in range(100):
            n = random.choice(self.CONTROL_PORTS)
            if not os.path.exists(os.path.join(self.SOCKET_DIR, f"socket.{n}")):
                return n
        raise BenchError(f"no free tgtd control port (socket.N in {self.SOCKET_DIR})")

    def tgtadm(self, *args):
        return run(["tgtadm", "-C", str(self.control_port), "--lld", "iscsi"] + list(args)).stdout

    def add_lun(self, lun, path, thin=False):
        """LUN `lun` (1 and up: tgt's LUN 0 is its controller) on the file `path`;
        `thin`: thin_provisioning=1 (UNMAP, WRITE SAME with UNMAP, LBPME=1)."""
        self.tgtadm("--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", str(lun),
                    "-b", path, "--bstype", "rdwr")
        if thin:
            self.tgtadm("--op", "update", "--mode", "logicalunit", "--tid", "1",
                        "--lun", str(lun), "--params", "thin_provisioning=1")
        self.luns[lun] = path

    def url(self, lun):
        return f"iscsi://127.0.0.1:{self.port}/{self.iqn}/{lun}"

    def stop(self):
        """tgtd ignores SIGTERM while it has targets: delete them, then the system."""
        if self.proc.poll() is None:
            run(["tgtadm", "-C", str(self.control_port), "--lld", "iscsi", "--op", "delete",
                 "--force", "--mode", "target", "--tid", "1"], check=False, timeout=30)
            run(["tgtadm", "-C", str(self.control_port), "--op", "delete", "--mode", "system"],
                check=False, timeout=30)
        stop(self.proc, grace_s=10)
        for suffix in ("", ".lock"):
            try:
                os.unlink(os.path.join(self.SOCKET_DIR, f"socket.{self.control_port}{suffix}"))
            except OSError:
                pass
