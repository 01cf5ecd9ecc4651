#!/usr/bin/env python3
"""Rewrite what a Zilla leaf's labels hold and reseal their embedded checksums, as a
crafted disk image would (docs/on-disk-format.md sections 2 and 4).

  craft_label.py config FILE PATH VALUE   set PATH in the JSON config of all four labels
                                          (PATH: dot-separated keys, '*' = every list
                                          element, e.g. config.tops.*.ashift; VALUE is
                                          JSON: 255, '"name"')
  craft_label.py txg FILE VALUE           set the txg of the newest uberblock in every
                                          label (every slot holding it)
"""
import json
import struct
import sys

LABEL = 256 << 10
CONFIG = 128 << 10
TRAILER_MAGIC = 0x0210DA7AB10C7A11
LABEL_MAGIC = 0x5A494C4C414C424C
UB_MAGIC = 0x00BAB10C
HEARTBEAT_MAGIC = 0x4D4D504845415254
M64 = (1 << 64) - 1


def fletcher4(b):
    a = b_ = c = d = 0
    for w in struct.unpack("<%dI" % (len(b) // 4), b):
        a = (a + w) & M64
        b_ = (b_ + a) & M64
        c = (c + b_) & M64
        d = (d + c) & M64
    return a, b_, c, d


def checksum_with_verifier(block, offset):
    n = len(block)
    tmp = bytearray(block)
    tmp[n - 32:] = struct.pack("<Q", offset) + bytes(24)
    return struct.pack("<4Q", *fletcher4(bytes(tmp)))


def seal(block, offset):
    n = len(block)
    block[n - 40:n - 32] = struct.pack("<Q", TRAILER_MAGIC)
    block[n - 32:] = checksum_with_verifier(block, offset)


def sealed(block, offset):
    n = len(block)
    return block[n - 40:n - 32] == struct.pack("<Q", TRAILER_MAGIC) and block[n - 32:] == checksum_with_verifier(block, offset)


def label_offsets(size):
    end = size // LABEL * LABEL
    return [0, LABEL, end - 2 * LABEL, end - LABEL]


def set_path(v, keys, value):
    k, rest = keys[0], keys[1:]
    targets = range(len(v)) if k == "*" else [int(k) if isinstance(v, list) else k]
    for t in targets:
        if rest:
            set_path(v[t], rest, value)
        else:
            v[t] = value


def craft_config(f, path, value):
    data = bytearray(f.read())
    done = 0
    for off in label_offsets(len(data)):
        region = data[off:off + CONFIG]
        magic, _ver, _txg, n = struct.unpack_from("<QQQI", region, 0)
        if magic != LABEL_MAGIC or not sealed(region, off):
            continue
        cfg = json.loads(bytes(region[32:32 + n]))
        set_path(cfg, path.split("."), value)
        js = json.dumps(cfg, separators=(",", ":")).encode()
        assert len(js) <= CONFIG - 72, "config too large for its label"
        region[24:28] = struct.pack("<I", len(js))
        region[32:CONFIG - 40] = js + bytes(CONFIG - 72 - len(js))
        seal(region, off)
        data[off:off + CONFIG] = region
        done += 1
    f.seek(0)
    f.write(data)
    return done


def uberblocks(data):
    for base in label_offsets(len(data)):
        for slot in (4096, 8192):
            for so in range(CONFIG, LABEL, slot):
                at = base + so
                b = data[at:at + slot]
                if struct.unpack_from("<Q", b, 0)[0] != UB_MAGIC or not sealed(b, at):
                    continue
                if struct.unpack_from("<Q", b, 1024)[0] == HEARTBEAT_MAGIC:
                    continue
                yield at, slot, struct.unpack_from("<Q", b, 16)[0]


def craft_txg(f, value):
    data = bytearray(f.read())
    found = list(uberblocks(data))
    if not found:
        return 0
    newest = max(t for _, _, t in found)
    n = 0
    for at, slot, t in found:
        if t != newest:
            continue
        b = data[at:at + slot]
        b[16:24] = struct.pack("<Q", value)
        seal(b, at)
        data[at:at + slot] = b
        n += 1
    f.seek(0)
    f.write(data)
    return n


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    what, path = sys.argv[1], sys.argv[2]
    with open(path, "r+b") as f:
        if what == "config" and len(sys.argv) == 5:
            n = craft_config(f, sys.argv[3], json.loads(sys.argv[4]))
        elif what == "txg":
            n = craft_txg(f, int(sys.argv[3], 0))
        else:
            sys.exit(__doc__)
    if n == 0:
        sys.exit(f"{path}: nothing to craft (no valid label or uberblock)")
    print(f"{path}: {n} resealed")


if __name__ == "__main__":
    main()
