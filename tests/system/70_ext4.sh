#!/usr/bin/env bash
# Goal: a real file system lives on a volume and survives a daemon restart.
# Method: nbdfuse exposes the volume as MOUNTDIR/nbd, a loop device turns it into a
# block device; mkfs.ext4, mount, write a few hundred files of random sizes, record
# sha256sums, umount, fsck -fn clean; SIGTERM the daemon, start it again, mount
# again, same checksums. Loop device and FUSE mount are released even on failure.
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || skip "needs root for losetup and mount"
[ -e /dev/fuse ] || skip "no /dev/fuse"
command -v nbdfuse >/dev/null || fail "nbdfuse not installed"
losetup -f >/dev/null 2>&1 || skip "no free loop device"

start_daemon
make_pool tank 512M
make_volume tank/fs 256M
FUSE=$T/fuse MNT=$T/mnt
mkdir -p "$FUSE" "$MNT"
LOOP=

attach() {
    nbdfuse -P "$T/nbdfuse.pid" "$FUSE" "$(nbd_unix_uri tank/fs)" &
    local i
    for ((i = 0; i < 100; i++)); do [ -e "$FUSE/nbd" ] && break; sleep 0.1; done
    [ -e "$FUSE/nbd" ] || fail "nbdfuse did not expose $FUSE/nbd"
    LOOP=$(losetup -f --show "$FUSE/nbd")
    log "loop device $LOOP on $FUSE/nbd"
}
detach() {
    if mountpoint -q "$MNT"; then umount "$MNT"; fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP"; LOOP=; fi
    if mountpoint -q "$FUSE"; then fusermount3 -u "$FUSE" || umount -l "$FUSE"; fi
    sleep 0.2
}
on_exit 'umount -l "$MNT"; [ -n "$LOOP" ] && losetup -d "$LOOP"; fusermount3 -u "$FUSE" || umount -l "$FUSE"'

attach
mkfs.ext4 -q -F "$LOOP"
mount "$LOOP" "$MNT"
# A tree of files of random sizes (0..256K), some nested.
python3 - "$MNT" <<'PY'
import os, random, sys
root = sys.argv[1]
rnd = random.Random(1234)
for i in range(300):
    d = os.path.join(root, f"dir{i % 17}", f"sub{i % 5}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"file{i}.bin"), "wb") as f:
        f.write(os.urandom(rnd.choice([0, 1, 100, 4096, rnd.randrange(1, 256 << 10)])))
PY
(cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$T/sums"
[ "$(wc -l <"$T/sums")" -eq 300 ] || fail "expected 300 files"
umount "$MNT"
fsck.ext4 -fn "$LOOP" || fail "fsck after first mount"
detach

stop_daemon
start_daemon
attach
fsck.ext4 -fn "$LOOP" || fail "fsck after restart"
mount "$LOOP" "$MNT"
(cd "$MNT" && sha256sum --quiet -c "$T/sums") || fail "checksums differ after restart"
detach
stop_daemon
log "ext4 OK"
