#!/usr/bin/env python3
"""A minimal iSCSI initiator for system tests (RFC 7143, one connection, no digests).

It logs in to one target and sends SCSI commands a test needs that libiscsi's command
line tools do not offer in one session: writes with immediate data, SYNCHRONIZE CACHE,
MODE SENSE / MODE SELECT of the caching page, and reads.

    iscsi_client.py HOST:PORT TARGET write LBA FILE       # WRITE(10) FILE at LBA (512-byte blocks)
    iscsi_client.py HOST:PORT TARGET read LBA BLOCKS OUT  # READ(10) into OUT
    iscsi_client.py HOST:PORT TARGET sync                 # SYNCHRONIZE CACHE(10)
    iscsi_client.py HOST:PORT TARGET wce                  # print the caching page's WCE bit
    iscsi_client.py HOST:PORT TARGET set-wce 0|1          # MODE SELECT(10) of the caching page
    iscsi_client.py HOST:PORT TARGET pr-register KEY APTPL      # PR OUT REGISTER AND IGNORE EXISTING KEY
    iscsi_client.py HOST:PORT TARGET pr-unregister KEY          # PR OUT REGISTER to key 0
    iscsi_client.py HOST:PORT TARGET pr-reserve KEY TYPE        # PR OUT RESERVE (TYPE 1 WE, 3 EA, ...)
    iscsi_client.py HOST:PORT TARGET pr-release KEY TYPE        # PR OUT RELEASE
    iscsi_client.py HOST:PORT TARGET pr-keys              # PR IN READ KEYS: one hex key a line
    iscsi_client.py HOST:PORT TARGET pr-reservation       # PR IN READ RESERVATION: "KEY TYPE" or "none"

KEY is hexadecimal. The initiator name is $ISCSI_INITIATOR (default
iqn.2026-11.io.zilla:systest); two names are two I_T nexuses. As a module it also
offers the login one request at a time (`Initiator.login_request`) and a CHAP login
(`Initiator.chap_login`), for tests of the login itself.

Every command must end GOOD; otherwise the status and sense are printed and the exit
status is 1 (RESERVATION CONFLICT prints "status 0x18").
"""

import hashlib
import os
import socket
import struct
import sys

BLOCK = 512
CHUNK = 32 << 10          # immediate data per WRITE (FirstBurstLength is 64 KiB)
ISID = bytes([0x80, 0, 0, 0x11, 0x22, 0x33])
OPERATIONAL = [("HeaderDigest", "None"), ("DataDigest", "None"), ("ImmediateData", "Yes"), ("InitialR2T", "No"),
               ("MaxRecvDataSegmentLength", "65536"), ("FirstBurstLength", "65536"), ("MaxBurstLength", "262144"),
               ("ErrorRecoveryLevel", "0")]


class Initiator:
    def __init__(self, portal, target, login=True, initiator=None, isid=ISID):
        host, port = portal.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.cmd_sn, self.itt, self.stat_sn = 1, 1, 0
        self.initiator = initiator or os.environ.get("ISCSI_INITIATOR", "iqn.2026-11.io.zilla:systest")
        self.isid = isid
        if login:
            self.login(target)

    def send(self, bhs, data=b""):
        bhs = bytearray(bhs)
        bhs[5:8] = len(data).to_bytes(3, "big")
        pad = (-len(data)) % 4
        self.sock.sendall(bytes(bhs) + data + b"\0" * pad)

    def recv_exact(self, n):
        out = bytearray()
        while len(out) < n:
            part = self.sock.recv(n - len(out))
            if not part:
                raise SystemExit("the target closed the connection")
            out += part
        return bytes(out)

    def recv(self):
        bhs = self.recv_exact(48)
        ahs = bhs[4] * 4
        dlen = int.from_bytes(bhs[5:8], "big")
        self.recv_exact(ahs)
        data = self.recv_exact(dlen + (-dlen) % 4)[:dlen]
        return bhs, data

    def login_request(self, csg, nsg, transit, keys):
        """One Login Request in stage `csg` (to `nsg` when `transit`) with `keys`, a list
        of (key, value); returns (status class, status detail, transit, {key: value})."""
        text = b"".join(f"{k}={v}".encode() + b"\0" for k, v in keys)
        bhs = bytearray(48)
        bhs[0] = 0x43                       # Login, immediate
        bhs[1] = (0x80 | (csg << 2) | nsg) if transit else csg << 2
        bhs[8:14] = self.isid
        struct.pack_into(">III", bhs, 16, 0, 0, self.cmd_sn)
        self.send(bhs, text)
        reply, data = self.recv()
        if reply[0] & 0x3f != 0x23:
            raise SystemExit(f"a login request answered with opcode {reply[0] & 0x3f:#x}")
        self.stat_sn = struct.unpack_from(">I", reply, 24)[0]
        answers = dict(pair.decode(errors="replace").split("=", 1) for pair in data.split(b"\0") if b"=" in pair)
        return reply[36], reply[37], bool(reply[1] & 0x80), answers

    def login(self, target):
        keys = [("InitiatorName", self.initiator), ("TargetName", target), ("SessionType", "Normal")] + OPERATIONAL
        status_class, detail, _, answers = self.login_request(1, 3, True, keys)
        if status_class != 0:
            raise SystemExit(f"login refused: class {status_class} detail {detail} {answers!r}")

    def chap_login(self, target, user, secret):
        """A login with CHAP (MD5) to the full-feature phase: (status class, detail) of
        the request that ended it."""
        first = [("InitiatorName", self.initiator), ("TargetName", target), ("SessionType", "Normal"),
                 ("AuthMethod", "CHAP,None")]
        status_class, detail, _, answers = self.login_request(0, 1, True, first)
        if status_class or answers.get("AuthMethod") != "CHAP":
            return status_class, detail
        status_class, detail, _, answers = self.login_request(0, 1, False, [("CHAP_A", "5")])
        if status_class:
            return status_class, detail
        identifier, challenge = int(answers["CHAP_I"]), bytes.fromhex(answers["CHAP_C"][2:])
        response = hashlib.md5(bytes([identifier]) + secret.encode() + challenge).hexdigest()
        status_class, detail, _, _ = self.login_request(0, 1, True, [("CHAP_N", user), ("CHAP_R", "0x" + response)])
        if status_class:
            return status_class, detail
        status_class, detail, _, _ = self.login_request(1, 3, True, OPERATIONAL)
        return status_class, detail

    def command(self, cdb, expected=0, write=None, read=False):
        """A SCSI command with `write` bytes as immediate data; returns the data read."""
        self.itt += 1
        bhs = bytearray(48)
        bhs[0] = 0x01
        bhs[1] = 0x80 | (0x40 if read else 0) | (0x20 if write else 0) | 0x01   # F, R/W, SIMPLE
        struct.pack_into(">IIII", bhs, 16, self.itt, expected, self.cmd_sn, self.stat_sn + 1)
        bhs[32:32 + len(cdb)] = cdb
        self.cmd_sn += 1
        self.send(bhs, write or b"")
        got = bytearray()
        while True:
            reply, data = self.recv()
            opcode = reply[0] & 0x3f
            if opcode == 0x25:                                      # Data-In
                got += data
                if reply[1] & 0x01:                                  # S: status with it
                    if reply[3] != 0:
                        raise SystemExit(f"status {reply[3]:#x}")
                    return bytes(got)
            elif opcode == 0x21:                                    # SCSI Response
                if reply[3] != 0:
                    sense = data[2:] if len(data) > 2 else b""
                    key = sense[2] & 0x0f if len(sense) > 2 else None
                    asc = sense[12:14].hex() if len(sense) > 13 else None
                    raise SystemExit(f"status {reply[3]:#x} sense key {key} asc/ascq {asc}")
                return bytes(got)
            elif opcode == 0x31:                                    # R2T: not expected
                raise SystemExit("unexpected R2T (immediate data was negotiated)")
            elif opcode == 0x3f:
                raise SystemExit(f"reject, reason {reply[2]:#x}")


def write(i, lba, payload):
    for at in range(0, len(payload), CHUNK):
        part = payload[at:at + CHUNK]
        blocks = len(part) // BLOCK
        cdb = struct.pack(">BBIBHB", 0x2a, 0, lba + at // BLOCK, 0, blocks, 0)
        i.command(cdb, expected=len(part), write=part)


def read(i, lba, blocks):
    out = bytearray()
    done = 0
    while done < blocks:
        n = min(blocks - done, 128)
        cdb = struct.pack(">BBIBHB", 0x28, 0, lba + done, 0, n, 0)
        out += i.command(cdb, expected=n * BLOCK, read=True)
        done += n
    return bytes(out)


def caching_page(i):
    # MODE SENSE(10), page 0x08, current values, DBD
    data = i.command(bytes([0x5a, 0x08, 0x08, 0, 0, 0, 0, 0x01, 0x00, 0]), expected=256, read=True)
    desc = struct.unpack_from(">H", data, 6)[0]
    return bytearray(data[8 + desc:])


def pr_out(i, service_action, key, service_action_key=0, kind=0, aptpl=False):
    params = struct.pack(">QQIBBH", key, service_action_key, 0, 0x01 if aptpl else 0, 0, 0)
    cdb = struct.pack(">BBBHIB", 0x5f, service_action, kind, 0, len(params), 0)
    i.command(cdb, expected=len(params), write=params)


def pr_in(i, service_action):
    return i.command(bytes([0x5e, service_action, 0, 0, 0, 0, 0, 0x10, 0, 0]), expected=4096, read=True)


def main(argv):
    if len(argv) < 4:
        raise SystemExit(__doc__)
    portal, target, op = argv[1], argv[2], argv[3]
    i = Initiator(portal, target)
    if op == "write":
        payload = open(argv[5], "rb").read()
        if len(payload) % BLOCK:
            raise SystemExit("FILE must be whole 512-byte blocks")
        write(i, int(argv[4]), payload)
    elif op == "read":
        open(argv[6], "wb").write(read(i, int(argv[4]), int(argv[5])))
    elif op == "sync":
        i.command(bytes([0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]))
    elif op == "wce":
        page = caching_page(i)
        print((page[2] >> 2) & 1)
    elif op == "set-wce":
        page = caching_page(i)
        page[0] &= 0x3f                                  # PS bit cleared for MODE SELECT
        page[2] = (page[2] & ~0x04) | (0x04 if argv[4] == "1" else 0)
        params = bytes(8) + bytes(page[:2 + page[1]])
        cdb = bytes([0x55, 0x10, 0, 0, 0, 0, 0, 0, len(params), 0])   # PF
        i.command(cdb, expected=len(params), write=params)
    elif op == "pr-register":
        pr_out(i, 6, 0, service_action_key=int(argv[4], 16), aptpl=argv[5] == "1")
    elif op == "pr-unregister":
        pr_out(i, 0, int(argv[4], 16), service_action_key=0)
    elif op == "pr-reserve":
        pr_out(i, 1, int(argv[4], 16), kind=int(argv[5]))
    elif op == "pr-release":
        pr_out(i, 2, int(argv[4], 16), kind=int(argv[5]))
    elif op == "pr-keys":
        data = pr_in(i, 0)
        length = struct.unpack_from(">I", data, 4)[0]
        for at in range(8, 8 + length, 8):
            print(f"{struct.unpack_from('>Q', data, at)[0]:016x}")
    elif op == "pr-reservation":
        data = pr_in(i, 1)
        if struct.unpack_from(">I", data, 4)[0] == 0:
            print("none")
        else:
            print(f"{struct.unpack_from('>Q', data, 8)[0]:016x} {data[21] & 0x0f}")
    else:
        raise SystemExit(f"unknown operation {op}")


if __name__ == "__main__":
    main(sys.argv)
