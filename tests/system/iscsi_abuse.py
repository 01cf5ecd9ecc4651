#!/usr/bin/env python3
"""Unfriendly iSCSI clients, each against a target while a well-behaved session works.

    iscsi_abuse.py HOST:PORT TARGET garbage         # random bytes instead of a login
    iscsi_abuse.py HOST:PORT TARGET keys            # a login with thousands of unknown keys
    iscsi_abuse.py HOST:PORT TARGET half-write LBA  # a WRITE whose Data-Out stops halfway, then close
    iscsi_abuse.py HOST:PORT TARGET flood           # immediate commands, replies never read
    iscsi_abuse.py HOST:PORT TARGET window          # commands far outside the CmdSN window
    iscsi_abuse.py HOST:PORT TARGET login-flood N   # N silent connections from 127.0.0.2, then a
                                                    # login from 127.0.0.1 must still succeed
    iscsi_abuse.py HOST:PORT TARGET reinstate       # a second login with the session's initiator
                                                    # name and ISID ends the first session

Each prints one line saying what the target did, and exits 1 when it did something a
target must not (accepted garbage, wrote part of an unfinished WRITE, answered a command
outside the window, ...).
"""

import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from iscsi_client import BLOCK, Initiator  # noqa: E402


def closed_within(sock, seconds):
    """True when the target closes `sock` (EOF or reset) within `seconds`."""
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def garbage(portal, _target, _args):
    host, port = portal.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(os.urandom(48 * 64))
    if not closed_within(s, 15):
        raise SystemExit("the target kept a connection that sent garbage")
    print("garbage: connection closed")


def keys(portal, target, _args):
    host, port = portal.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    text = f"InitiatorName=iqn.2026-11.io.zilla:abuse\0TargetName={target}\0SessionType=Normal\0".encode()
    text += b"".join(f"X-junk-{n}=v\0".encode() for n in range(3000))
    text = text[:60000]
    bhs = bytearray(48)
    bhs[0] = 0x43
    bhs[1] = 0x80 | (1 << 2) | 3
    bhs[5:8] = len(text).to_bytes(3, "big")
    bhs[8:14] = bytes([0x80, 0, 0, 0x11, 0x22, 0x44])
    s.sendall(bytes(bhs) + text + b"\0" * ((-len(text)) % 4))
    s.settimeout(15)
    reply = b""
    while len(reply) < 48:
        part = s.recv(48 - len(reply))
        if not part:
            raise SystemExit("the target closed without a login response")
        reply += part
    status_class, detail = reply[36], reply[37]
    if status_class != 2:
        raise SystemExit(f"login with 3,000 unknown keys: status class {status_class} detail {detail}, not an initiator error")
    print(f"keys: login refused, class {status_class} detail {detail}")


def half_write(portal, target, args):
    lba = int(args[0])
    i = Initiator(portal, target)
    total = 1 << 20
    first = 32 << 10
    i.itt += 1
    bhs = bytearray(48)
    bhs[0] = 0x01
    bhs[1] = 0x80 | 0x20 | 0x01                       # F: no unsolicited Data-Out follows
    struct.pack_into(">IIII", bhs, 16, i.itt, total, i.cmd_sn, i.stat_sn + 1)
    bhs[32:42] = struct.pack(">BBIBHB", 0x2a, 0, lba, 0, total // BLOCK, 0)
    i.cmd_sn += 1
    i.send(bhs, b"\xab" * first)
    reply, _ = i.recv()
    if reply[0] & 0x3f != 0x31:
        raise SystemExit(f"expected an R2T, got opcode {reply[0] & 0x3f:#x}")
    ttt = struct.unpack_from(">I", reply, 20)[0]
    offset, length = struct.unpack_from(">II", reply, 40)
    # half of what the R2T asked for, then the connection goes away
    half = min(length // 2, 64 << 10)
    out = bytearray(48)
    out[0] = 0x05
    struct.pack_into(">I", out, 16, i.itt)
    struct.pack_into(">I", out, 20, ttt)
    struct.pack_into(">I", out, 36, 0)
    struct.pack_into(">I", out, 40, offset)
    i.send(out, b"\xab" * half)
    i.sock.close()
    print(f"half-write: {first + half} of {total} bytes sent, connection closed")


def flood(portal, target, _args):
    i = Initiator(portal, target)
    i.sock.settimeout(2)
    sent = 0
    cap = 1_000_000                                         # 48 MB of headers: beyond any socket buffers
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and sent < cap:
            batch = bytearray()
            for _ in range(256):
                i.itt += 1
                bhs = bytearray(48)
                bhs[0] = 0x41                               # immediate SCSI Command
                bhs[1] = 0x80 | 0x01
                struct.pack_into(">IIII", bhs, 16, i.itt, 0, i.cmd_sn, i.stat_sn + 1)
                batch += bytes(bhs)                         # TEST UNIT READY: CDB all zero
            i.sock.sendall(bytes(batch))
            sent += 256
    except (socket.timeout, BlockingIOError):
        pass                                                # the target stopped reading: bounded
    except (ConnectionResetError, BrokenPipeError):
        print(f"flood: the target closed the connection after {sent} immediate commands")
        return
    if sent >= cap or time.monotonic() >= deadline:
        raise SystemExit(f"flood: the target read {sent} immediate commands whose replies were never read")
    print(f"flood: {sent} immediate commands sent before the target stopped reading")
    i.sock.close()


def window(portal, target, _args):
    i = Initiator(portal, target)
    # CmdSN far ahead of the window: dropped without an answer
    i.itt += 1
    bhs = bytearray(48)
    bhs[0] = 0x01
    bhs[1] = 0x80 | 0x01
    struct.pack_into(">IIII", bhs, 16, i.itt, 0, i.cmd_sn + 100_000, i.stat_sn + 1)
    i.send(bhs)
    i.sock.settimeout(2)
    try:
        reply, _ = i.recv()
        raise SystemExit(f"a command outside the window was answered (opcode {reply[0] & 0x3f:#x})")
    except socket.timeout:
        pass
    i.sock.settimeout(30)
    # the session goes on: an in-window command is answered
    i.command(bytes(10))
    print("window: out-of-window command dropped, session goes on")


def login_flood(portal, target, args):
    import resource
    import subprocess
    count = int(args[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))
    host, port = portal.rsplit(":", 1)
    held = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.2", 0))
        s.settimeout(5)
        try:
            s.connect((host, int(port)))
        except OSError:
            s.close()
            continue
        held.append(s)
    time.sleep(2)
    still_open = 0
    for s in held:
        s.setblocking(False)
        try:
            still_open += 1 if s.recv(1) is None else 0
        except BlockingIOError:
            still_open += 1                                 # nothing to read: open
        except OSError:
            pass
    # a well-behaved initiator on another address logs in while the flood is held
    url = f"iscsi://{portal}/{target}/0"
    r = subprocess.run(["timeout", "10", "iscsi-inq", url], capture_output=True, text=True)
    for s in held:
        s.close()
    if r.returncode != 0:
        raise SystemExit(f"login-flood: with {still_open} silent connections held, a login from another address failed: {r.stderr.strip()}")
    print(f"login-flood: {len(held)} connections made, {still_open} kept by the target; another address logged in")
    return still_open


def reinstate(portal, target, _args):
    first = Initiator(portal, target)
    first.command(bytes(10))                                # TEST UNIT READY: the session works
    second = Initiator(portal, target)                      # same name, same ISID, TSIH 0
    second.command(bytes(10))
    if not closed_within(first.sock, 10):
        raise SystemExit("reinstate: the first session still runs after a login with its initiator name and ISID")
    second.command(bytes(10))
    print("reinstate: the first session ended, the new one serves")


def main(argv):
    if len(argv) < 4:
        raise SystemExit(__doc__)
    ops = {"garbage": garbage, "keys": keys, "half-write": half_write, "flood": flood, "window": window,
           "login-flood": login_flood, "reinstate": reinstate}
    if argv[3] not in ops:
        raise SystemExit(f"unknown operation {argv[3]}")
    ops[argv[3]](argv[1], argv[2], argv[4:])


if __name__ == "__main__":
    main(sys.argv)
