#!/usr/bin/env python3
"""Adversarial iSCSI login and data-phase cases (one report line per case).

    iscsi_attack.py HOST:PORT CASE A_TARGET B_TARGET GOOD_NAME CHAP_USER CHAP_SECRET

A_TARGET has CHAP (CHAP_USER/CHAP_SECRET) and an initiator list holding GOOD_NAME;
B_TARGET is open (loopback) with the same list. Every case prints
"HELD <case>: ..." or "FAILED <case>: ..." and exits 1 on FAILED.

Cases: identity, stage-case, malformed, burst, cross-data-out, abort-data-out,
slow-progress, starve, reject-flood, isid-change
"""

import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from iscsi_client import BLOCK, OPERATIONAL, Initiator  # noqa: E402

NO_TAG = 0xFFFFFFFF
RESULTS = []


def held(case, what):
    print(f"HELD {case}: {what}", flush=True)


def failed(case, what):
    print(f"FAILED {case}: {what}", flush=True)
    RESULTS.append(case)


class Raw(Initiator):
    """An Initiator whose login requests may carry a TSIH and raw text."""

    tsih = 0

    def raw_login(self, csg, nsg, transit, text, cont=False):
        bhs = bytearray(48)
        bhs[0] = 0x43
        bhs[1] = ((0x80 | (csg << 2) | nsg) if transit else csg << 2) | (0x40 if cont else 0)
        bhs[8:14] = self.isid
        struct.pack_into(">H", bhs, 14, self.tsih)
        struct.pack_into(">III", bhs, 16, 0, 0, self.cmd_sn)
        self.send(bhs, text)
        reply, data = self.recv()
        answers = dict(p.decode(errors="replace").split("=", 1) for p in data.split(b"\0") if b"=" in p)
        return reply[36], reply[37], answers, reply

    def nop(self, timeout=5):
        """NOP-Out (immediate, ping): True when a NOP-In with our tag comes back."""
        self.itt += 1
        bhs = bytearray(48)
        bhs[0] = 0x40
        bhs[1] = 0x80
        struct.pack_into(">IIII", bhs, 16, self.itt, NO_TAG, self.cmd_sn, self.stat_sn + 1)
        try:
            self.sock.settimeout(timeout)
            self.send(bhs)
            while True:
                reply, _ = self.recv()
                if reply[0] & 0x3F == 0x20 and struct.unpack_from(">I", reply, 16)[0] == self.itt:
                    return True
        except (SystemExit, OSError):
            return False

    def write_cmd(self, lba, nbytes, immediate=b"", final=True):
        """Send a WRITE(10) of nbytes at lba; returns its ITT."""
        self.itt += 1
        bhs = bytearray(48)
        bhs[0] = 0x01
        bhs[1] = (0x80 if final else 0) | 0x20 | 0x01
        struct.pack_into(">IIII", bhs, 16, self.itt, nbytes, self.cmd_sn, self.stat_sn + 1)
        bhs[32:42] = struct.pack(">BBIBHB", 0x2A, 0, lba, 0, nbytes // BLOCK, 0)
        self.cmd_sn += 1
        self.send(bhs, immediate)
        return self.itt

    def data_out(self, itt, ttt, data_sn, offset, data, final=True):
        bhs = bytearray(48)
        bhs[0] = 0x05
        bhs[1] = 0x80 if final else 0
        struct.pack_into(">II", bhs, 16, itt, ttt)
        struct.pack_into(">I", bhs, 28, self.stat_sn + 1)
        struct.pack_into(">II", bhs, 36, data_sn, offset)
        self.send(bhs, data)

    def next_pdu(self, timeout=5):
        self.sock.settimeout(timeout)
        reply, data = self.recv()
        return reply[0] & 0x3F, reply, data

    def wait_response(self, itt, timeout=10):
        """Skip to the SCSI Response of itt: (status, sense key, asc/ascq)."""
        while True:
            opcode, reply, data = self.next_pdu(timeout)
            if opcode == 0x21 and struct.unpack_from(">I", reply, 16)[0] == itt:
                sense = data[2:]
                key = sense[2] & 0x0F if len(sense) > 2 else None
                asc = sense[12:14].hex() if len(sense) > 13 else None
                return reply[3], key, asc


def r2t_fields(reply):
    itt, ttt = struct.unpack_from(">II", reply, 16)
    offset, length = struct.unpack_from(">II", reply, 40)
    return itt, ttt, offset, length


def kv(pairs):
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in pairs)


def alive(i):
    return i.nop()


def closed(sock, seconds):
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def chap(portal, target, name, user, secret, isid):
    i = Raw(portal, target, login=False, initiator=name, isid=isid)
    return i, i.chap_login(target, user, secret)


# ------------------------------------------------------------------------------------
def identity(portal, a, b, good, user, secret):
    case = "identity"
    isid = bytes([0x80, 0, 0, 0x51, 0x52, 0x53])
    victim, st = chap(portal, a, good, user, secret, isid)
    if st != (0, 0) or not alive(victim):
        return failed(case, f"victim CHAP login to A failed {st}")
    tries = []
    # B in upper case, same name and ISID
    o = Raw(portal, b.upper(), login=False, initiator=good, isid=isid)
    o.login(b.upper())
    tries.append(("login to B (TargetName upper case)", o))
    o2 = Raw(portal, b, login=False, initiator=good.upper(), isid=isid)
    o2.login(b)
    tries.append(("login to B (InitiatorName upper case)", o2))
    w, st = chap(portal, a.upper(), good.upper(), user, "Wrong-Secret-0000", isid)
    tries.append((f"login to A upper with wrong secret -> {st}", w))
    e, st = chap(portal, a, "iqn.2026-11.org.evil:h9", user, secret, isid)
    tries.append((f"EVIL name to A with right secret -> {st}", e))
    # discovery with the victim's identity
    d = Raw(portal, a, login=False, initiator=good, isid=isid)
    sc, sd, ans, _ = d.raw_login(1, 3, True, kv([("InitiatorName", good), ("SessionType", "Discovery")] + OPERATIONAL))
    tries.append((f"discovery login same name/ISID -> {(sc, sd)}", d))
    # discovery naming A as its TargetName
    d2 = Raw(portal, a, login=False, initiator=good, isid=isid)
    sc, sd, ans, _ = d2.raw_login(1, 3, True, kv([("InitiatorName", good), ("SessionType", "Discovery"), ("TargetName", a)] + OPERATIONAL))
    tries.append((f"discovery login with TargetName=A -> {(sc, sd)}", d2))
    # TSIH naming the victim's session (add a connection)
    t = Raw(portal, b, login=False, initiator=good, isid=isid)
    t.tsih = victim_tsih = 0
    # find victim tsih: not kept by Initiator; try a range of small TSIHs on A without CHAP
    for guess in range(1, 40):
        t = Raw(portal, a, login=False, initiator=good, isid=isid)
        t.tsih = guess
        sc, sd, ans, _ = t.raw_login(1, 3, True, kv([("InitiatorName", good), ("TargetName", a)] + OPERATIONAL))
        if sc == 0:
            return failed(case, f"a login with TSIH {guess} and no CHAP was accepted to A")
        t.sock.close()
    tries.append(("39 logins with TSIH 1..39 to A without CHAP (all refused)", None))
    time.sleep(0.5)
    if not alive(victim):
        return failed(case, "victim ended after: " + "; ".join(w for w, _ in tries))
    held(case, "victim survived: " + "; ".join(w for w, _ in tries))
    # the right login, names in other case: reinstates (RFC: iSCSI names compare case-insensitively)
    again, st = chap(portal, a.upper(), good.upper(), user, secret, isid)
    if st != (0, 0):
        return failed(case, f"right CHAP login to A (upper case) refused {st}")
    if not closed(victim.sock, 5):
        return failed(case, "right login with case-variant names did not reinstate the victim")
    if not alive(o2):
        return failed(case, "the B session was ended by A's reinstatement")
    if alive(o):
        return failed(case, "B login with TargetName upper case was not reinstated by the same identity in lower case")
    held(case, "the right login (names upper case) reinstated only A's session; B session kept; "
         "B's two case-variant logins are one identity (the second reinstated the first)")


def stage_case(portal, a, b, good, user, secret):
    case = "stage-case"
    evil = "iqn.2026-11.org.evil:h9"
    variants = [("initiatorname", evil), ("INITIATORNAME", evil), ("InitiatorName ", evil), (" InitiatorName", evil),
                ("Initiatorname", evil), ("TargetName ", a), ("targetname", a)]
    for k, v in variants:
        i = Raw(portal, b, login=False, initiator=good, isid=bytes([0x80, 0, 0, 0x61, 0, 1]))
        sc, sd, ans, _ = i.raw_login(0, 1, True, kv([("InitiatorName", good), ("TargetName", b), ("AuthMethod", "None")]))
        if sc:
            return failed(case, f"plain first request refused {sc}/{sd}")
        sc, sd, ans, _ = i.raw_login(1, 3, True, kv([(k, v)] + OPERATIONAL))
        if sc == 0:
            ok = alive(i)
            print(f"  '{k}={v}' in stage 1: login ok, answered {ans.get(k)!r}, session alive={ok}")
        else:
            print(f"  '{k}={v}' in stage 1: refused {sc}/{sd}")
        i.sock.close()
    # the same key twice in one request with different values, and across requests
    i = Raw(portal, b, login=False, initiator=good)
    sc, sd, _, _ = i.raw_login(0, 1, True, kv([("InitiatorName", evil), ("InitiatorName", good), ("TargetName", b), ("AuthMethod", "None")]))
    print(f"  InitiatorName twice (EVIL then GOOD) in one request: {sc}/{sd}")
    if sc == 0:
        failed(case, "InitiatorName declared twice with different values accepted")
    # EVIL in the first PDU (C bit), GOOD in its continuation: one request
    i = Raw(portal, b, login=False, initiator=good)
    sc, sd, _, _ = i.raw_login(0, 1, True, kv([("InitiatorName", evil)]), cont=True)
    sc, sd, _, _ = i.raw_login(0, 1, True, kv([("InitiatorName", good), ("TargetName", b), ("AuthMethod", "None")]))
    print(f"  InitiatorName EVIL (C bit) then GOOD in the continuation: {sc}/{sd}")
    if sc == 0:
        failed(case, "InitiatorName split over a continuation accepted")
    # AuthMethod=CHAP then AuthMethod=None (downgrade) on A
    i = Raw(portal, a, login=False, initiator=good)
    sc, sd, ans, _ = i.raw_login(0, 0, False, kv([("InitiatorName", good), ("TargetName", a), ("AuthMethod", "CHAP,None")]))
    sc2, sd2, ans2, _ = i.raw_login(0, 1, True, kv([("AuthMethod", "None")]))
    print(f"  A: AuthMethod CHAP then None: {sc}/{sd} {ans} then {sc2}/{sd2}")
    if sc2 == 0:
        sc3, sd3, _, _ = i.raw_login(1, 3, True, kv(OPERATIONAL))
        if sc3 == 0:
            failed(case, "CHAP target entered without CHAP by redeclaring AuthMethod")
    # skip the security stage on A: operational first
    i = Raw(portal, a, login=False, initiator=good)
    sc, sd, _, _ = i.raw_login(1, 3, True, kv([("InitiatorName", good), ("TargetName", a)] + OPERATIONAL))
    print(f"  A: straight to operational stage: {sc}/{sd}")
    if sc == 0:
        failed(case, "CHAP target entered by skipping the security stage")
    held(case, "see lines above; the session listing is checked by the caller")


def malformed(portal, a, b, good, user, secret):
    case = "malformed"
    texts = {
        "no '='": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode() + b"\0JunkWithoutEquals\0",
        "empty key": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode() + b"\0=value\0",
        "0xff bytes": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode() + b"\0\xff\xfe=\xff\0",
        "NUL-only": b"\0" * 4000,
        "no NUL at end": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode(),
        "10k unique tiny keys": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode() + b"\0" +
        b"".join(b"k%d=\0" % n for n in range(10000)),
        "same junk key twice": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode() + b"\0X=1\0X=1\0",
        "TargetName with NUL inside": b"InitiatorName=" + good.encode() + b"\0TargetName=" + b.encode()[:-1] + b"\0" + b.encode()[-1:] + b"\0",
    }
    for what, text in texts.items():
        i = Raw(portal, b, login=False, initiator=good)
        try:
            sc, sd, ans, _ = i.raw_login(1, 3, True, text[:65000] + b"\0" if what != "no NUL at end" else text)
            print(f"  {what}: {sc}/{sd} ({len(ans)} answers)")
            if what in ("no '='", "empty key", "same junk key twice") and sc == 0:
                failed(case, f"{what} accepted")
        except SystemExit as e:
            print(f"  {what}: connection closed ({e})")
    # many continuation PDUs of new keys (over the 64 KiB limit)
    i = Raw(portal, b, login=False, initiator=good)
    n = 0
    try:
        while n < 200:
            sc, sd, _, _ = i.raw_login(1, 3, True, b"".join(b"K%d_%d=v\0" % (n, j) for j in range(500)), cont=True)
            n += 1
            if sc:
                break
        print(f"  continuations: refused {sc}/{sd} after {n} PDUs")
    except SystemExit as e:
        print(f"  continuations: closed after {n} PDUs ({e})")
    # many requests each declaring new keys, without transit (declared map bound)
    i = Raw(portal, b, login=False, initiator=good)
    sc, sd, _, _ = i.raw_login(0, 1, False, kv([("InitiatorName", good), ("TargetName", b), ("AuthMethod", "None")]))
    n = 0
    try:
        while n < 500:
            sc, sd, _, _ = i.raw_login(0, 1, False, b"".join(b"J%d_%d=v\0" % (n, j) for j in range(100)))
            n += 1
            if sc:
                break
        print(f"  many requests of unknown keys: refused {sc}/{sd} after {n} requests")
    except SystemExit as e:
        print(f"  many requests: closed after {n} ({e})")
    j = Raw(portal, b, initiator=good)
    if not alive(j):
        return failed(case, "no session after malformed logins")
    held(case, "a good login still works")


def burst(portal, a, b, good, user, secret):
    case = "burst"
    ops = [kv for kv in OPERATIONAL if kv[0] not in ("FirstBurstLength", "MaxBurstLength")]
    # FBL above MBL across two requests
    i = Raw(portal, b, login=False, initiator=good)
    sc, sd, ans, _ = i.raw_login(1, 1, False, kv([("InitiatorName", good), ("TargetName", b), ("FirstBurstLength", "262144")]))
    sc2, sd2, ans2, _ = i.raw_login(1, 3, True, kv([("MaxBurstLength", "65536")] + ops))
    print(f"  FBL 262144 then MBL 65536 in the next request: {sc}/{sd} then {sc2}/{sd2} {ans2}")
    if sc2 == 0:
        failed(case, "FirstBurstLength above MaxBurstLength (two requests) accepted")
    # tiny bursts: MBL 512, FBL 512, a 64 KiB WRITE with 512 immediate, R2T bursts of 512
    i = Raw(portal, b, login=False, initiator=good)
    sc, sd, ans, _ = i.raw_login(1, 3, True, kv([("InitiatorName", good), ("TargetName", b), ("MaxBurstLength", "512"),
                                                  ("FirstBurstLength", "512"), ("InitialR2T", "Yes"), ("ImmediateData", "Yes"),
                                                  ("MaxRecvDataSegmentLength", "512")]))
    if sc:
        return failed(case, f"tiny burst login refused {sc}/{sd}")
    i.stat_sn = struct.unpack_from(">I", _, 24)[0]
    payload = os.urandom(64 << 10)
    itt = i.write_cmd(200, len(payload), payload[:512])
    sent = 512
    r2ts = 0
    while True:
        opcode, reply, data = i.next_pdu()
        if opcode == 0x31:
            r2ts += 1
            _, ttt, off, length = r2t_fields(reply)
            if length > 512:
                failed(case, f"R2T for {length} bytes above MaxBurstLength 512")
            i.data_out(itt, ttt, 0, off, payload[off:off + length])
            sent += length
        elif opcode == 0x21:
            print(f"  64 KiB WRITE with 512-byte bursts: status {reply[3]}, {r2ts} R2Ts")
            break
        else:
            return failed(case, f"unexpected opcode {opcode:#x}")
    back = Initiator(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x77, 0, 7]))
    from iscsi_client import read
    if read(back, 200, 128) != payload:
        return failed(case, "data written with 512-byte bursts reads back different")
    # a Data-Out bigger than the R2T asked
    itt = i.write_cmd(400, 4096)
    opcode, reply, _ = i.next_pdu()
    _, ttt, off, length = r2t_fields(reply)
    i.data_out(itt, ttt, 0, off, b"\x11" * 1024)
    status = i.wait_response(itt)
    print(f"  Data-Out of 1024 for a 512-byte R2T: {status}")
    if status[0] == 0:
        failed(case, "a Data-Out beyond the R2T was taken")
    held(case, "bursts bounded as negotiated")


def cross_data_out(portal, a, b, good, user, secret):
    case = "cross-data-out"
    owner = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x71, 0, 1]))
    owner.cmd_sn, owner.itt = 1, 0x1000
    itt = owner.write_cmd(600, 8192, b"", final=True)   # InitialR2T=No but F set: R2T for everything
    opcode, reply, _ = owner.next_pdu()
    if opcode != 0x31:
        return failed(case, f"no R2T, opcode {opcode:#x}")
    _, ttt, off, length = r2t_fields(reply)
    other = Raw(portal, b, initiator="iqn.2026-11.org.good:other" if False else good, isid=bytes([0x80, 0, 0, 0x71, 0, 2]))
    other.data_out(itt, ttt, 0, off, b"\xee" * length)
    opcode2, rej, _ = other.next_pdu()
    print(f"  another session's Data-Out with the owner's ITT/TTT: opcode {opcode2:#x} reason {rej[2]:#x}")
    if opcode2 != 0x3F:
        failed(case, "another session's Data-Out was not rejected")
    good_data = os.urandom(length)
    owner.data_out(itt, ttt, 0, off, good_data)
    status = owner.wait_response(itt)
    back = Initiator(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x77, 0, 8]))
    from iscsi_client import read
    got = read(back, 600, 16)
    if status[0] != 0 or got != good_data:
        return failed(case, f"owner's write status {status}, data intact={got == good_data}")
    held(case, "foreign Data-Out rejected, owner's data intact")


def abort_data_out(portal, a, b, good, user, secret):
    case = "abort-data-out"
    from iscsi_client import read
    back = Initiator(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x72, 0, 9]))
    before = read(back, 800, 16)
    i = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x72, 0, 1]))
    itt = i.write_cmd(800, 8192)
    opcode, reply, _ = i.next_pdu()
    _, ttt, off, length = r2t_fields(reply)
    # ABORT TASK
    i.itt += 1
    tmf = bytearray(48)
    tmf[0] = 0x42
    tmf[1] = 0x80 | 1
    struct.pack_into(">IIIII", tmf, 16, i.itt, itt, i.cmd_sn, i.stat_sn + 1, i.cmd_sn - 1)
    i.send(tmf)
    opcode, reply, _ = i.next_pdu()
    print(f"  ABORT TASK: opcode {opcode:#x} response {reply[2]}")
    # Data-Out for the aborted task, whole and repeated
    for n in range(5):
        i.data_out(itt, ttt, n, off, b"\x66" * length)
    if not i.nop():
        return failed(case, "connection gone after Data-Out for an aborted task")
    # the first PDU after must be our NOP-In (nop() skips others; check nothing else came)
    after = read(back, 800, 16)
    if after != before:
        return failed(case, "an aborted WRITE's data was written")
    # reuse the tag for a new command: its Data-Out is its own
    i.itt = itt - 1
    itt2 = i.write_cmd(800, 512, b"")
    opcode, reply, _ = i.next_pdu()
    if opcode == 0x31:
        _, ttt2, off2, len2 = r2t_fields(reply)
        i.data_out(itt2, ttt2, 0, off2, b"\x77" * len2)
        status = i.wait_response(itt2)
        print(f"  tag reused after abort: status {status}")
        if status[0] != 0:
            failed(case, "a reused tag's WRITE failed")
    held(case, "aborted task's Data-Out dropped, nothing written, tag reusable")


def slow_progress(portal, a, b, good, user, secret, timeout_s):
    """One WRITE fed a PDU every 0.6 * timeout: must not be cut."""
    case = "slow-progress"
    i = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x73, 0, 1]))
    itt = i.write_cmd(1000, 8192)
    opcode, reply, _ = i.next_pdu()
    _, ttt, off, length = r2t_fields(reply)
    pieces = length // 512
    t0 = time.monotonic()
    try:
        for n in range(pieces):
            time.sleep(timeout_s * 0.6)
            i.data_out(itt, ttt, n, off + n * 512, b"\x55" * 512, final=(n == pieces - 1))
        status = i.wait_response(itt, timeout=10)
    except (SystemExit, OSError) as e:
        return failed(case, f"cut after {time.monotonic() - t0:.1f} s while sending a PDU every {timeout_s * 0.6:.1f} s: {e}")
    held(case, f"a WRITE fed for {time.monotonic() - t0:.1f} s (one PDU per {timeout_s * 0.6:.1f} s) completed, status {status}")


def starve(portal, a, b, good, user, secret, timeout_s):
    """Two WRITEs with R2Ts out; the initiator feeds the first slowly but steadily, the
    second after it (as initiators serve R2Ts in order). The connection progresses."""
    case = "starve"
    i = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x74, 0, 1]))
    itt1 = i.write_cmd(1100, 8192)
    itt2 = i.write_cmd(1200, 8192)
    r2ts = {}
    while len(r2ts) < 2:
        opcode, reply, _ = i.next_pdu()
        if opcode == 0x31:
            itt, ttt, off, length = r2t_fields(reply)
            r2ts[itt] = (ttt, off, length)
    t0 = time.monotonic()
    try:
        ttt, off, length = r2ts[itt1]
        pieces = length // 512
        for n in range(pieces):
            time.sleep(timeout_s * 0.3)
            i.data_out(itt1, ttt, n, off + n * 512, b"\x56" * 512, final=(n == pieces - 1))
        ttt, off, length = r2ts[itt2]
        i.data_out(itt2, ttt, 0, off, b"\x57" * length)
        s1 = i.wait_response(itt1)
        s2 = i.wait_response(itt2)
    except (SystemExit, OSError) as e:
        return failed(case, f"connection cut after {time.monotonic() - t0:.1f} s although a Data-Out arrived every "
                      f"{timeout_s * 0.3:.1f} s (the second WRITE's R2T waited longer than the timeout): {e}")
    held(case, f"both WRITEs done {s1} {s2}")


def reject_flood(portal, a, b, good, user, secret, pid):
    case = "reject-flood"

    def rss():
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    r0 = rss()
    i = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x75, 0, 1]))
    i.sock.settimeout(3)
    sent = 0
    pdu = bytearray(48)
    pdu[0] = 0x05
    pdu[1] = 0x80
    batch = bytearray()
    for n in range(1024):
        struct.pack_into(">II", pdu, 16, 0x7000_0000 + n, NO_TAG)
        batch += pdu
    t0 = time.monotonic()
    try:
        while sent < 2_000_000 and time.monotonic() - t0 < 20:
            i.sock.sendall(bytes(batch))
            sent += 1024
    except (socket.timeout, BlockingIOError):
        pass
    except OSError as e:
        print(f"  flood: closed after {sent} ({e})")
    r1 = rss()
    print(f"  {sent} bogus Data-Outs sent without reading; RSS {r0} -> {r1} KiB")
    # with data segments too
    j = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x75, 0, 2]))
    j.sock.settimeout(3)
    sent2 = 0
    try:
        body = b"\0" * 65536
        while sent2 < 20000 and time.monotonic() - t0 < 40:
            struct.pack_into(">II", pdu, 16, 0x7100_0000 + sent2, NO_TAG)
            j.send(pdu, body)
            sent2 += 1
    except (socket.timeout, BlockingIOError, OSError):
        pass
    r2 = rss()
    print(f"  {sent2} bogus 64 KiB Data-Outs; RSS -> {r2} KiB")
    i.sock.close()
    j.sock.close()
    time.sleep(1)
    k = Raw(portal, b, initiator=good)
    if not alive(k):
        return failed(case, "no session after the flood")
    if r2 - r0 > 200_000:
        return failed(case, f"RSS grew by {r2 - r0} KiB")
    held(case, f"RSS growth {r2 - r0} KiB; new sessions served")


def isid_change(portal, a, b, good, user, secret):
    """The ISID changes between the login's requests (RFC 7143: it must not)."""
    case = "isid-change"
    victim = Raw(portal, b, initiator=good, isid=bytes([0x80, 0, 0, 0x76, 0, 1]))
    i = Raw(portal, b, login=False, initiator=good, isid=bytes([0x80, 0, 0, 0x76, 0, 2]))
    sc, sd, _, _ = i.raw_login(0, 1, True, kv([("InitiatorName", good), ("TargetName", b), ("AuthMethod", "None")]))
    i.isid = bytes([0x80, 0, 0, 0x76, 0, 1])
    sc2, sd2, _, reply = i.raw_login(1, 3, True, kv(OPERATIONAL))
    print(f"  ISID ...0002 in request 1, ...0001 in request 2: {sc}/{sd} then {sc2}/{sd2}, response ISID {reply[8:14].hex()}")
    gone = not alive(victim)
    if sc2 == 0:
        failed(case, f"a login whose ISID changed mid-login was accepted (victim with the final ISID ended: {gone})")
    else:
        held(case, "refused")


def main(argv):
    portal, case, a, b, good, user, secret = argv[1:8]
    extra = argv[8:]
    fn = {"identity": identity, "stage-case": stage_case, "malformed": malformed, "burst": burst,
          "cross-data-out": cross_data_out, "abort-data-out": abort_data_out, "isid-change": isid_change}.get(case)
    if fn:
        fn(portal, a, b, good, user, secret)
    elif case == "slow-progress":
        slow_progress(portal, a, b, good, user, secret, float(extra[0]))
    elif case == "starve":
        starve(portal, a, b, good, user, secret, float(extra[0]))
    elif case == "reject-flood":
        reject_flood(portal, a, b, good, user, secret, int(extra[0]))
    else:
        raise SystemExit(__doc__)
    sys.exit(1 if RESULTS else 0)


if __name__ == "__main__":
    main(sys.argv)
