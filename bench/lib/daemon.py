"""The servers under test: a zilla daemon and an nbdkit server.

Theory of operation: each server is a child process in its own session with its log in
the scenario's workdir, listening on free loopback TCP ports; the constructor returns
once it accepts connections (and, for zilla, once its admin socket exists), and the
process is stopped at exit even if the scenario fails (proc.spawn). A zilla daemon gets
its own state dir, so an old and a new build can run side by side.
"""

import os
import socket
import time

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


class Zilla:
    """`zilla serve` of one build (build.Build) with its own state dir in `workdir`."""

    def __init__(self, build, workdir, tunables=(), log_tag=""):
        """`tunables` ("name=value" strings) are set with `serve --tunable`, before the
        pools of the state dir are imported (a restart on the same `workdir` re-imports
        them); `log_tag` names a separate log for such a restart."""
        self.build = build
        self.label = build.label
        self.state = os.path.join(workdir, f"{self.label}-state")
        os.makedirs(self.state, exist_ok=True)
        self.nbd_port = free_port()
        self.http_port = free_port()
        self.logpath = os.path.join(workdir, f"{self.label}{'-' + log_tag if log_tag else ''}.log")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        extra = [x for t in tunables for x in ("--tunable", t)]
        self.proc = spawn([build.binary, "--state-dir", self.state, "serve",
                           "--nbd", f"127.0.0.1:{self.nbd_port}",
                           "--http", f"127.0.0.1:{self.http_port}"] + extra, self.logpath, env=env)
        self.pid = self.proc.pid
        wait_port(self.nbd_port, self.proc, f"{self.label} serve")
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

    def cli(self, *args):
        return run([self.build.binary, "--state-dir", self.state] + list(args)).stdout

    def uri(self, export):
        return f"nbd://127.0.0.1:{self.nbd_port}/{export}"

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
