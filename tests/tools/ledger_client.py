#!/usr/bin/env python3
"""An NBD client that keeps a ledger of acknowledged writes, for power-loss tests.

  ledger_client.py init   LEDGER BLOCKS SALT
  ledger_client.py write  LEDGER SOCKET EXPORT [SECONDS]
  ledger_client.py verify LEDGER SOCKET EXPORT

The export is seen as BLOCKS 4 KiB blocks. Every block written carries a header
(magic, salt, block, version) and bytes derived from (salt, block, version), so any
block read back names the write it came from. Versions come from one counter that only
grows, across rounds, so a version is never written twice.

write: until the connection dies (the daemon is killed) or SECONDS pass, send batches
of 16 (sometimes 128) pipelined 4 KiB writes to distinct random blocks (requests in
flight together are unordered) followed by a FLUSH, alternating with
single FUA writes. A write is *durable* once its FUA write is acknowledged, or once a
FLUSH sent after its acknowledgement is acknowledged. The ledger (a JSON file, kept
outside the file system under test, replaced atomically after every durable batch)
holds per block the newest durable version and the newest version sent.

verify: read every block. A block must hold its durable version or a version sent
after it (an unacknowledged write may or may not have landed), byte for byte; a block
never made durable may also read as zeros. Anything else (an older version, foreign or
torn bytes, a read error) is a lost acknowledged write: print up to 10 and exit 1.
On success the ledger is rebased on what was read (that is now the pool's state).
"""
import json, os, random, socket, struct, sys, time

REQ_MAGIC, REPLY_MAGIC = 0x25609513, 0x67446698
IHAVEOPT, OPT_GO, REP_ACK = 0x49484156454F5054, 7, 1
CMD_READ, CMD_WRITE, CMD_FLUSH = 0, 1, 3
FLAG_FUA = 1
BLOCK = 4096
HDR = struct.Struct(">QQQQ")
BLOCK_MAGIC = 0x7A696C6C616C6467  # "zillaldg"
BATCH = 16


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("server closed the connection")
        buf += chunk
    return bytes(buf)


def open_export(path, export):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(path)
    recv_exact(s, 18)  # NBDMAGIC IHAVEOPT handshake flags
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
            raise RuntimeError("NBD_OPT_GO refused: %#x" % rtype)


def request(cmd, cookie, offset, length, flags=0):
    return struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, offset, length)


def reply(s, cookie):
    return replies(s, [cookie])


def replies(s, cookies):
    """Read one simple reply per cookie, in any order (NBD replies out of order);
    returns the first nonzero error, else 0."""
    want, first_error = set(cookies), 0
    while want:
        magic, error, got = struct.unpack(">IIQ", recv_exact(s, 16))
        if magic != REPLY_MAGIC or got not in want:
            raise RuntimeError("bad reply: magic %#x cookie %d" % (magic, got))
        want.discard(got)
        first_error = first_error or error
    return first_error


def content(salt, block, version):
    body = random.Random((salt << 64) | (block << 32) | version).randbytes(BLOCK - HDR.size)
    return HDR.pack(BLOCK_MAGIC, salt, block, version) + body


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, ledger):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ledger, f)
    os.replace(tmp, path)


def init(path, blocks, salt):
    save(path, {"salt": salt, "blocks": blocks, "next_version": 1,
                "durable": [0] * blocks, "sent": [0] * blocks, "how": [""] * blocks, "acked_writes": 0})


def send_write(s, ledger, cookie, block, flags=0):
    version = ledger["next_version"]
    ledger["next_version"] += 1
    ledger["sent"][block] = version
    s.sendall(request(CMD_WRITE, cookie, block * BLOCK, BLOCK, flags) + content(ledger["salt"], block, version))
    return version


def make_durable(ledger, done, how):
    """Record acknowledged writes; `how` names the acknowledgement (FUA or FLUSH #n)."""
    for block, version in done:
        if version > ledger["durable"][block]:
            ledger["durable"][block] = version
            ledger["how"][block] = how
    ledger["acked_writes"] += len(done)


def write(path, sock, export, seconds):
    ledger = load(path)
    rng = random.Random(ledger["next_version"])
    deadline = time.monotonic() + seconds
    cookie, durable_now = 0, 0
    try:
        s = open_export(sock, export)
        print("writing", flush=True)
        while time.monotonic() < deadline:
            batch = []
            # Distinct blocks: NBD does not order requests in flight together, so two
            # writes to one block in a batch could land in either order.
            for block in rng.sample(range(ledger["blocks"]), rng.choice((BATCH, BATCH, 8 * BATCH))):
                cookie += 1
                batch.append((cookie, block, send_write(s, ledger, cookie, block)))
            if replies(s, [c for c, _, _ in batch]):
                raise RuntimeError("write error")
            cookie += 1
            s.sendall(request(CMD_FLUSH, cookie, 0, 0))
            if reply(s, cookie):
                raise RuntimeError("flush error")
            make_durable(ledger, [(b, v) for _, b, v in batch], "FLUSH cookie %d" % cookie)
            cookie += 1
            block = rng.randrange(ledger["blocks"])
            version = send_write(s, ledger, cookie, block, FLAG_FUA)
            if reply(s, cookie):
                raise RuntimeError("FUA write error")
            make_durable(ledger, [(block, version)], "FUA cookie %d" % cookie)
            durable_now += len(batch) + 1
            save(path, ledger)
            print("durable %d" % durable_now, flush=True)
    except (EOFError, ConnectionError, socket.timeout, OSError, RuntimeError) as e:
        print("writer stopped: %s" % e, flush=True)
    save(path, ledger)
    print("durable writes this run: %d (total %d)" % (durable_now, ledger["acked_writes"]), flush=True)


def classify(ledger, block, data):
    """Return (version read, None) or (None, reason)."""
    durable, sent = ledger["durable"][block], ledger["sent"][block]
    if data == bytes(BLOCK):
        if durable == 0:
            return 0, None
        return None, "zeros, but version %d was acknowledged" % durable
    magic, salt, got_block, version = HDR.unpack_from(data)
    if magic != BLOCK_MAGIC or salt != ledger["salt"] or got_block != block:
        return None, "foreign bytes (magic %#x block %d), acknowledged version %d" % (magic, got_block, durable)
    if version < durable or version > sent:
        return None, "version %d, acknowledged %d (by %s), newest sent %d" % (
            version, durable, ledger["how"][block] or "an earlier run", sent)
    if data != content(ledger["salt"], block, version):
        return None, "version %d header but torn or corrupt body" % version
    return version, None


def verify(path, sock, export):
    ledger = load(path)
    try:
        s = open_export(sock, export)
    except (OSError, EOFError, RuntimeError) as e:
        print("LOST ACKNOWLEDGED WRITES: export %s unavailable after the restart: %s" % (export, e))
        sys.exit(1)
    chunk_blocks = 256
    bad, newer, seen = [], 0, [0] * ledger["blocks"]
    for first in range(0, ledger["blocks"], chunk_blocks):
        n = min(chunk_blocks, ledger["blocks"] - first)
        s.sendall(request(CMD_READ, first + 1, first * BLOCK, n * BLOCK))
        if reply(s, first + 1):
            bad.append("blocks %d..%d: read error" % (first, first + n - 1))
            continue
        data = recv_exact(s, n * BLOCK)
        for i in range(n):
            block = first + i
            version, reason = classify(ledger, block, data[i * BLOCK:(i + 1) * BLOCK])
            if reason:
                bad.append("block %d: %s" % (block, reason))
            else:
                seen[block] = version
                newer += version > ledger["durable"][block]
    if bad:
        print("LOST ACKNOWLEDGED WRITES: %d findings (blocks or unreadable ranges)" % len(bad))
        for line in bad[:10]:
            print("  " + line)
        sys.exit(1)
    ledger["durable"] = seen
    ledger["sent"] = list(seen)
    ledger["how"] = [""] * ledger["blocks"]
    save(path, ledger)
    print("verified %d blocks: every acknowledged write is there (%d blocks hold a newer, "
          "unacknowledged write)" % (ledger["blocks"], newer), flush=True)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "init":
        init(path, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "write":
        write(path, sys.argv[3], sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else 3600)
    elif mode == "verify":
        verify(path, sys.argv[3], sys.argv[4])
    else:
        sys.exit("unknown mode %s\n%s" % (mode, __doc__))


if __name__ == "__main__":
    main()
