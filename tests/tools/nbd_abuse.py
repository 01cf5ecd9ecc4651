#!/usr/bin/env python3
"""Abusive and probing NBD clients for the system tests (stdlib only).

  nbd_abuse.py stall HOST PORT EXPORT N     N clients: a 16 MiB read, 127 1 GiB TRIMs,
                                            300 invalid requests each; never read
  nbd_abuse.py bigreads HOST PORT EXPORT N  N clients: four 32 MiB reads each; never read
  nbd_abuse.py idle HOST PORT EXPORT N      N clients that finish the handshake, then idle
  nbd_abuse.py writeflush HOST PORT EXPORT  one 4 KiB write + FLUSH; prints seconds taken
  nbd_abuse.py httphalf HOST PORT - N       N HTTP clients that send half a request line
                                            and hold the connection

The abusive modes print "ready" once every connection has sent its requests (or
blocked trying) and then sleep until killed.
"""
import socket, struct, sys, threading, time

IHAVEOPT = 0x49484156454F5054
REQ_MAGIC = 0x25609513
OPT_GO, REP_ACK = 7, 1
CMD_READ, CMD_WRITE, CMD_FLUSH, CMD_TRIM = 0, 1, 3, 4


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("server closed")
        buf += chunk
    return buf


def open_export(host, port, export):
    s = socket.create_connection((host, port), timeout=30)
    recv_exact(s, 18)  # NBDMAGIC IHAVEOPT flags
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    name = export.encode()
    data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(data)) + data)
    while True:
        _magic, _opt, rtype, length = struct.unpack(">QIII", recv_exact(s, 20))
        recv_exact(s, length)
        if rtype == REP_ACK:
            return s
        if rtype & 0x80000000:
            raise RuntimeError("GO refused: %#x" % rtype)


def request(cmd, cookie, offset, length, flags=0):
    return struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, offset, length)


def flood(sock, payload, sent):
    try:
        sock.settimeout(None)
        sock.sendall(payload)
    except OSError:
        pass
    sent.release()


def abusers(host, port, export, n, build):
    socks, sent = [], threading.Semaphore(0)
    for _ in range(n):
        socks.append(open_export(host, port, export))
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        threading.Thread(target=flood, args=(s, build(), sent), daemon=True).start()
    time.sleep(2)  # the floods either finished or block on a server that stopped reading
    print("ready", flush=True)
    while True:
        time.sleep(3600)


def stall_requests():
    out = [request(CMD_READ, 1, 0, 16 << 20)]
    out += [request(CMD_TRIM, 100 + i, 0, 1 << 30) for i in range(127)]
    out += [request(CMD_READ, 1000 + i, 1 << 62, 4096) for i in range(300)]  # out of range
    return b"".join(out)


def bigread_requests():
    return b"".join(request(CMD_READ, i, (i * 32) << 20, 32 << 20) for i in range(4))


def writeflush(host, port, export):
    started = time.monotonic()
    s = open_export(host, port, export)
    s.sendall(request(CMD_WRITE, 1, 0, 4096) + b"\x5a" * 4096)
    s.sendall(request(CMD_FLUSH, 2, 0, 0))
    for cookie in (1, 2):
        magic, error, got = struct.unpack(">IIQ", recv_exact(s, 16))
        if magic != 0x67446698 or error != 0 or got != cookie:
            raise RuntimeError("bad reply magic=%#x error=%d cookie=%d" % (magic, error, got))
    print("%.3f" % (time.monotonic() - started), flush=True)


def idle(host, port, export, n):
    socks = [open_export(host, port, export) for _ in range(n)]
    print("ready %d" % len(socks), flush=True)
    while True:
        time.sleep(3600)


def httphalf(host, port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=30)
        s.sendall(b"GET /metr")
        socks.append(s)
    print("ready %d" % len(socks), flush=True)
    while True:
        time.sleep(3600)


def raise_nofile():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main():
    raise_nofile()
    mode, host, port, export = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if mode == "writeflush":
        writeflush(host, port, export)
    elif mode == "stall":
        abusers(host, port, export, int(sys.argv[5]), stall_requests)
    elif mode == "bigreads":
        abusers(host, port, export, int(sys.argv[5]), bigread_requests)
    elif mode == "httphalf":
        httphalf(host, port, int(sys.argv[5]))
    elif mode == "idle":
        idle(host, port, export, int(sys.argv[5]))
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
