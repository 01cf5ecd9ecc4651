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
    iscsi_abuse.py HOST:PORT TARGET reinstate-targets OTHER USER SECRET DENY ALLOW
        # a CHAP session to TARGET survives logins with its name and ISID to OTHER, to
        # TARGET with a wrong secret, and to TARGET while the shell command DENY has taken
        # the name off its list; after ALLOW a right login to TARGET reinstates it
    iscsi_abuse.py HOST:PORT TARGET redeclare OTHER_NAME   # InitiatorName, SessionType changed
                                                    # in the operational stage: refused
    iscsi_abuse.py HOST:PORT TARGET numeric         # numeric keys out of range or not numbers
    iscsi_abuse.py HOST:PORT TARGET stray-data-out  # a Data-Out for no command: Reject
    iscsi_abuse.py HOST:PORT TARGET bidi LBA        # a WRITE(10) with R and W: INVALID FIELD IN CDB
    iscsi_abuse.py HOST:PORT TARGET stall LBA SECONDS   # a WRITE whose Data-Out stops while the
                                                    # connection stays: closed within SECONDS

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
from iscsi_client import BLOCK, OPERATIONAL, Initiator, read  # noqa: E402


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


def alive(i):
    """The session answers a TEST UNIT READY (False: the target closed it)."""
    try:
        i.command(bytes(10))
        return True
    except (SystemExit, OSError):
        return False


def reinstate_targets(portal, target, args):
    import subprocess
    other, user, secret, deny, allow = args[:5]
    victim = Initiator(portal, target, login=False)
    if victim.chap_login(target, user, secret) != (0, 0):
        raise SystemExit("reinstate-targets: the victim's CHAP login failed")
    if not alive(victim):
        raise SystemExit("reinstate-targets: the victim's session does not serve")
    # the victim's initiator name and ISID, another target (no CHAP)
    elsewhere = Initiator(portal, other)
    if not alive(elsewhere):
        raise SystemExit("reinstate-targets: the session to the other target does not serve")
    time.sleep(0.5)
    if not alive(victim):
        raise SystemExit("reinstate-targets: a login to another target with the victim's initiator name and ISID "
                         "ended the victim's session")
    # its target, a wrong secret
    wrong = Initiator(portal, target, login=False)
    status = wrong.chap_login(target, user, "Not-The-Secret-99")
    if status != (2, 1):
        raise SystemExit(f"reinstate-targets: a login with a wrong secret got status {status}, not (2, 1)")
    time.sleep(0.5)
    if not alive(victim):
        raise SystemExit("reinstate-targets: a login that failed CHAP ended the victim's session")
    # its target, the name taken off the target's list
    subprocess.run(deny, shell=True, check=True, stdout=subprocess.DEVNULL)
    refused = Initiator(portal, target, login=False)
    status = refused.chap_login(target, user, secret)
    if status != (2, 2):
        raise SystemExit(f"reinstate-targets: a login off the initiator list got status {status}, not (2, 2)")
    time.sleep(0.5)
    if not alive(victim):
        raise SystemExit("reinstate-targets: a login refused by the initiator list ended the victim's session")
    # back on the list, the right secret: reinstated
    subprocess.run(allow, shell=True, check=True, stdout=subprocess.DEVNULL)
    again = Initiator(portal, target, login=False)
    if again.chap_login(target, user, secret) != (0, 0):
        raise SystemExit("reinstate-targets: the second CHAP login failed")
    if not closed_within(victim.sock, 10):
        raise SystemExit("reinstate-targets: a successful login to the same target did not reinstate the session")
    if not alive(again) or not alive(elsewhere):
        raise SystemExit("reinstate-targets: the new session or the other target's session stopped serving")
    print("reinstate-targets: only a successful login to the same target ended the session")


def redeclare(portal, target, args):
    other_name = args[0]
    first = [("InitiatorName", None), ("TargetName", target), ("SessionType", "Normal"), ("AuthMethod", "None")]
    cases = [
        ("InitiatorName changed", [("InitiatorName", other_name)], (2, 0)),
        ("SessionType changed", [("SessionType", "Discovery")], (2, 0)),
        ("TargetName changed", [("TargetName", target + "x")], (2, 0)),
        ("identity repeated unchanged", [("InitiatorName", None), ("TargetName", target), ("SessionType", "Normal")], (0, 0)),
    ]
    for what, again, expected in cases:
        i = Initiator(portal, target, login=False)
        fill = [(k, v or i.initiator) for k, v in first]
        status = i.login_request(0, 1, True, fill)[:2]
        if status != (0, 0):
            raise SystemExit(f"redeclare: the first login request got status {status}")
        status = i.login_request(1, 3, True, [(k, v or i.initiator) for k, v in again] + OPERATIONAL)[:2]
        if status != expected:
            raise SystemExit(f"redeclare: {what} in the operational stage: status {status}, expected {expected}")
        if expected == (0, 0) and not alive(i):
            raise SystemExit(f"redeclare: {what}: the session does not serve")
        i.sock.close()
    print("redeclare: identity keys changed after the first request were refused, repeated ones taken")


def numeric(portal, target, _args):
    cases = [
        ([("MaxRecvDataSegmentLength", "12")], (2, 0)),
        ([("MaxRecvDataSegmentLength", "abc")], (2, 0)),
        ([("MaxRecvDataSegmentLength", "0x1000000")], (2, 0)),
        ([("MaxRecvDataSegmentLength", "+8192")], (2, 0)),
        ([("MaxBurstLength", "65536"), ("FirstBurstLength", "131072")], (2, 0)),
        ([("MaxRecvDataSegmentLength", "512")], (0, 0)),
    ]
    for extra, expected in cases:
        i = Initiator(portal, target, login=False)
        keys = [("InitiatorName", i.initiator), ("TargetName", target), ("SessionType", "Normal")]
        keys += [(k, v) for k, v in OPERATIONAL if k not in dict(extra)] + extra
        status = i.login_request(1, 3, True, keys)[:2]
        if status != expected:
            raise SystemExit(f"numeric: {extra}: status {status}, expected {expected}")
        i.sock.close()
    # a negotiated key out of range is answered Reject (RFC 7143 §6.2.2) and the login goes on
    i = Initiator(portal, target, login=False)
    keys = [("InitiatorName", i.initiator), ("TargetName", target), ("SessionType", "Normal"), ("MaxBurstLength", "100"),
            ("ErrorRecoveryLevel", "7")]
    status_class, detail, _, answers = i.login_request(1, 3, True, keys)
    if (status_class, detail) != (0, 0) or answers.get("MaxBurstLength") != "Reject" or answers.get("ErrorRecoveryLevel") != "Reject":
        raise SystemExit(f"numeric: MaxBurstLength=100: status {(status_class, detail)}, answers {answers}")
    print("numeric: bad receive limits and a first burst above the max burst refused, bad offers answered Reject")


def stray_data_out(portal, target, _args):
    i = Initiator(portal, target)
    out = bytearray(48)
    out[0] = 0x05
    out[1] = 0x80
    struct.pack_into(">I", out, 16, 0x7777)                # a tag no command has
    struct.pack_into(">I", out, 20, 0xffffffff)
    i.send(out, b"\xab" * BLOCK)
    i.sock.settimeout(5)
    try:
        reply, data = i.recv()
    except socket.timeout:
        raise SystemExit("stray-data-out: a Data-Out for no command got no answer (no Reject within 5 s)")
    i.sock.settimeout(30)
    if reply[0] & 0x3f != 0x3f or reply[2] != 0x09:
        raise SystemExit(f"stray-data-out: answered with opcode {reply[0] & 0x3f:#x} reason {reply[2]:#x}, not Reject 0x09")
    if struct.unpack_from(">I", data, 16)[0] != 0x7777:
        raise SystemExit("stray-data-out: the Reject does not carry the rejected header")
    if not alive(i):
        raise SystemExit("stray-data-out: the session ended after the Reject")
    print("stray-data-out: Reject (invalid PDU field), the session goes on")


def bidi(portal, target, args):
    lba = int(args[0])
    i = Initiator(portal, target)
    before = read(i, lba, 1)
    i.itt += 1
    bhs = bytearray(48)
    bhs[0] = 0x01
    bhs[1] = 0x80 | 0x40 | 0x20 | 0x01                # F, R and W, SIMPLE
    struct.pack_into(">IIII", bhs, 16, i.itt, BLOCK, i.cmd_sn, i.stat_sn + 1)
    bhs[32:42] = struct.pack(">BBIBHB", 0x2a, 0, lba, 0, 1, 0)
    i.cmd_sn += 1
    i.send(bhs, b"\x5a" * BLOCK)
    reply, data = i.recv()
    if reply[0] & 0x3f != 0x21:
        raise SystemExit(f"bidi: answered with opcode {reply[0] & 0x3f:#x}")
    sense = data[2:]
    got = (reply[3], sense[2] & 0x0f if len(sense) > 13 else None, sense[12:14].hex() if len(sense) > 13 else None)
    if got != (0x02, 0x05, "2400"):
        raise SystemExit(f"bidi: a bidirectional WRITE(10) got status/key/asc {got}, not CHECK CONDITION, "
                         "ILLEGAL REQUEST, INVALID FIELD IN CDB")
    if read(i, lba, 1) != before:
        raise SystemExit("bidi: the refused bidirectional WRITE wrote")
    print("bidi: CHECK CONDITION, ILLEGAL REQUEST, INVALID FIELD IN CDB; nothing written")


def stall(portal, target, args):
    lba, bound_s = int(args[0]), float(args[1])
    i = Initiator(portal, target)
    total = 1 << 20
    i.itt += 1
    bhs = bytearray(48)
    bhs[0] = 0x01
    bhs[1] = 0x80 | 0x20 | 0x01                       # F: no unsolicited Data-Out follows
    struct.pack_into(">IIII", bhs, 16, i.itt, total, i.cmd_sn, i.stat_sn + 1)
    bhs[32:42] = struct.pack(">BBIBHB", 0x2a, 0, lba, 0, total // BLOCK, 0)
    i.cmd_sn += 1
    i.send(bhs, b"\xab" * (32 << 10))
    reply, _ = i.recv()
    if reply[0] & 0x3f != 0x31:
        raise SystemExit(f"stall: expected an R2T, got opcode {reply[0] & 0x3f:#x}")
    ttt = struct.unpack_from(">I", reply, 20)[0]
    offset, length = struct.unpack_from(">II", reply, 40)
    out = bytearray(48)
    out[0] = 0x05                                      # not final: more was asked for
    struct.pack_into(">IIII", out, 16, i.itt, ttt, 0, 0)
    struct.pack_into(">I", out, 40, offset)
    i.send(out, b"\xab" * min(length // 2, 64 << 10))
    started = time.monotonic()
    if not closed_within(i.sock, bound_s + 5):
        raise SystemExit(f"stall: the connection is still open {bound_s + 5:.0f} s after its Data-Out stopped")
    waited = time.monotonic() - started
    if waited < bound_s * 0.5 or waited > bound_s + 3:
        raise SystemExit(f"stall: closed after {waited:.1f} s, not about {bound_s} s")
    print(f"stall: the connection closed {waited:.1f} s after the Data-Out stopped")


def main(argv):
    if len(argv) < 4:
        raise SystemExit(__doc__)
    ops = {"garbage": garbage, "keys": keys, "half-write": half_write, "flood": flood, "window": window,
           "login-flood": login_flood, "reinstate": reinstate, "reinstate-targets": reinstate_targets,
           "redeclare": redeclare, "numeric": numeric, "stray-data-out": stray_data_out, "bidi": bidi, "stall": stall}
    if argv[3] not in ops:
        raise SystemExit(f"unknown operation {argv[3]}")
    ops[argv[3]](argv[1], argv[2], argv[4:])


if __name__ == "__main__":
    main(sys.argv)
