"""A disk that forgets what was not fsynced: a FUSE file system (raw kernel protocol over
/dev/fuse, standard library only) holding one regular file, `disk.img`, for a loop device.

Usage: volatile_disk.py STABLE_IMAGE MOUNT_DIR

The file's contents are STABLE_IMAGE (a file on a real disk, whose size is the disk's) with the
writes not yet fsynced laid over it. The daemon keeps the whole current contents in memory and
remembers which 4 KiB pages were written since the last fsync (the overlay):

- WRITE changes memory only and marks the pages dirty;
- FSYNC (the only durability point: the loop driver turns the block layer's flushes and FUA
  writes into an fsync of its backing file) writes the dirty pages into STABLE_IMAGE and fsyncs it;
- READ answers from memory, i.e. the overlay over the stable image;
- FLUSH (sent at every close) is not a durability point and does nothing.

OPEN answers FOPEN_DIRECT_IO, so the kernel keeps no page cache of the file: every write of the
loop device reaches the daemon.

SIGUSR1 is the power cut: the overlay is discarded (its pages read back from STABLE_IMAGE), and
every later WRITE or FSYNC is answered with success and keeps nothing, until the daemon exits.
The daemon prints `cut` once the cut holds, `ready` once the kernel's INIT is answered, and exits
when the file system is unmounted (or on SIGTERM: the kernel then fails the requests in flight).

A stalling disk, for benchmarks (benches/stalling_disk.sh): with VOLATILE_DISK_STALL_MS=N (default
0: no stall), an FSYNC sleeps N ms before doing its work, and as the daemon is single-threaded every
other request (reads and writes too) queues behind it, as behind a device flushing its cache. With
VOLATILE_DISK_STALL_EVERY=K (default 1) only every Kth FSYNC stalls.
"""

import ctypes
import errno
import os
import signal
import stat
import struct
import sys
import time

FUSE_ROOT_ID = 1
FILE_ID = 2
FILE_NAME = b"disk.img"
PAGE = 4096
MAX_WRITE = 1 << 20

# Opcodes (include/uapi/linux/fuse.h).
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
OPEN, READ, WRITE, STATFS, RELEASE = 14, 15, 16, 17, 18
FSYNC, FLUSH, INIT = 20, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 27, 28, 29, 30
INTERRUPT, DESTROY, BATCH_FORGET, FALLOCATE = 36, 38, 42, 43

FOPEN_DIRECT_IO = 1 << 0
FUSE_BIG_WRITES = 1 << 5
FUSE_MAX_PAGES = 1 << 22
FATTR_SIZE = 1 << 3
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # struct fuse_attr

STALL_SECONDS = int(os.environ.get("VOLATILE_DISK_STALL_MS", "0")) / 1000
STALL_EVERY = max(1, int(os.environ.get("VOLATILE_DISK_STALL_EVERY", "1")))


class Disk:
    """The file's contents: memory over the stable image, the dirty pages, the power state."""

    def __init__(self, stable_path):
        self.fd = os.open(stable_path, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.mem = bytearray(self.size)
        view = memoryview(self.mem)
        done = 0
        while done < self.size:
            n = os.preadv(self.fd, [view[done:]], done)
            if n == 0:
                break
            done += n
        self.dirty = set()
        self.size_dirty = False
        self.cut = False
        self.cut_applied = False
        self.fsyncs = 0

    def mark(self, offset, length):
        """Marks the pages of `offset..offset+length` dirty."""
        self.dirty.update(range(offset // PAGE, (offset + length + PAGE - 1) // PAGE))

    def resize(self, size):
        if size < self.size:
            del self.mem[size:]
        else:
            self.mem.extend(bytes(size - self.size))
        self.size = size
        self.size_dirty = True

    def write(self, offset, data):
        if self.cut:
            return
        end = offset + len(data)
        if end > self.size:
            self.resize(end)
        self.mem[offset:end] = data
        self.mark(offset, len(data))

    def zero(self, offset, length):
        if self.cut:
            return
        end = min(offset + length, self.size)
        if end > offset:
            self.mem[offset:end] = bytes(end - offset)
            self.mark(offset, end - offset)

    def runs(self):
        """The dirty pages as (first page, page count) runs, in order."""
        pages = sorted(self.dirty)
        start = prev = None
        for p in pages:
            if start is None:
                start = prev = p
            elif p == prev + 1:
                prev = p
            else:
                yield start, prev - start + 1
                start = prev = p
        if start is not None:
            yield start, prev - start + 1

    def fsync(self):
        """The durability point: the overlay into the stable image, and that fsynced."""
        if self.cut:
            return
        if self.size_dirty:
            os.ftruncate(self.fd, self.size)
            self.size_dirty = False
        view = memoryview(self.mem)
        for first, count in self.runs():
            start = first * PAGE
            end = min((first + count) * PAGE, self.size)
            while start < end:
                start += os.pwrite(self.fd, view[start:end], start)
        self.dirty.clear()
        os.fsync(self.fd)

    def apply_cut(self):
        """Discards the overlay: the dirty pages read back from the stable image."""
        if self.cut_applied:
            return
        self.cut_applied = True
        stable = os.fstat(self.fd).st_size
        for first, count in self.runs():
            start = first * PAGE
            end = min((first + count) * PAGE, self.size)
            old = os.pread(self.fd, end - start, start) if start < stable else b""
            self.mem[start:end] = old.ljust(end - start, b"\0")
        self.dirty.clear()


def attr(nodeid, disk):
    if nodeid == FUSE_ROOT_ID:
        mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
    else:
        mode, size, nlink = stat.S_IFREG | 0o644, disk.size, 1
    blocks = (size + 511) // 512
    return ATTR.pack(nodeid, size, blocks, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, PAGE, 0)


def attr_out(nodeid, disk):
    return struct.pack("<QII", 1, 0, 0) + attr(nodeid, disk)


def entry_out(disk):
    return struct.pack("<QQQQII", FILE_ID, 0, 1, 1, 0, 0) + attr(FILE_ID, disk)


def dirents(offset):
    """READDIR's answer from `offset`: the entries ., .. and the file."""
    out = b""
    entries = [(FUSE_ROOT_ID, b".", 4), (FUSE_ROOT_ID, b"..", 4), (FILE_ID, FILE_NAME, 8)]
    for i, (ino, name, kind) in enumerate(entries):
        if i < offset:
            continue
        one = struct.pack("<QQII", ino, i + 1, len(name), kind) + name
        out += one + b"\0" * (-len(one) % 8)
    return out


def init_out():
    # struct fuse_init_out: major, minor, max_readahead, flags, max_background,
    # congestion_threshold, max_write, time_gran, max_pages, map_alignment, flags2,
    # max_stack_depth, request_timeout, unused[11].
    return struct.pack(
        "<IIIIHHIIHHIIH22x",
        7, 31, 0, FUSE_BIG_WRITES | FUSE_MAX_PAGES, 16, 12, MAX_WRITE, 1, MAX_WRITE // PAGE, 0,
        0, 0, 0,
    )


def handle(disk, opcode, nodeid, body):
    """One request: (errno, reply body), or None for requests answered with nothing."""
    if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
        return None
    if opcode == INIT:
        return 0, init_out()
    if opcode == LOOKUP:
        if nodeid == FUSE_ROOT_ID and bytes(body).rstrip(b"\0") == FILE_NAME:
            return 0, entry_out(disk)
        return errno.ENOENT, b""
    if opcode == GETATTR:
        return 0, attr_out(nodeid, disk)
    if opcode == SETATTR:
        valid = struct.unpack_from("<I", body)[0]
        if valid & FATTR_SIZE and nodeid == FILE_ID:
            if not disk.cut:
                disk.resize(struct.unpack_from("<Q", body, 16)[0])
        return 0, attr_out(nodeid, disk)
    if opcode in (OPEN, OPENDIR):
        flags = FOPEN_DIRECT_IO if opcode == OPEN else 0
        return 0, struct.pack("<QIi", 0, flags, 0)
    if opcode == READ:
        _, offset, size = struct.unpack_from("<QQI", body)
        return 0, memoryview(disk.mem)[offset:min(offset + size, disk.size)]
    if opcode == WRITE:
        _, offset, size = struct.unpack_from("<QQI", body)
        disk.write(offset, body[40:40 + size])
        return 0, struct.pack("<II", size, 0)
    if opcode == FALLOCATE:
        _, offset, length, mode = struct.unpack_from("<QQQI", body)
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            disk.zero(offset, length)
        elif not mode & FALLOC_FL_KEEP_SIZE and offset + length > disk.size and not disk.cut:
            disk.resize(offset + length)
        return 0, b""
    if opcode == FSYNC:
        disk.fsyncs += 1
        if STALL_SECONDS and disk.fsyncs % STALL_EVERY == 0:
            time.sleep(STALL_SECONDS)
        disk.fsync()
        return 0, b""
    if opcode == STATFS:
        blocks = disk.size // PAGE
        return 0, struct.pack("<QQQQQIII28x", blocks, 0, 0, 2, 0, PAGE, 255, PAGE)
    if opcode == READDIR:
        offset = struct.unpack_from("<QQ", body)[1]
        return 0, dirents(offset)
    if opcode in (FLUSH, RELEASE, RELEASEDIR, FSYNCDIR, DESTROY):
        return 0, b""
    return errno.ENOSYS, b""


def mount(fd, target):
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,max_read={MAX_WRITE}"
    if libc.mount(b"volatile", os.fsencode(target), b"fuse", 0, opts.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def say(line):
    os.write(1, (line + "\n").encode())


def main():
    stable_path, target = sys.argv[1], sys.argv[2]
    disk = Disk(stable_path)

    def on_cut(_sig, _frame):
        disk.cut = True
        say("cut")

    signal.signal(signal.SIGUSR1, on_cut)
    fd = os.open("/dev/fuse", os.O_RDWR)
    mount(fd, target)
    while True:
        try:
            request = os.read(fd, MAX_WRITE + 64 * 1024)
        except OSError as e:
            if e.errno == errno.ENOENT:  # the request was interrupted before it was read
                continue
            if e.errno == errno.ENODEV:  # unmounted
                return
            raise
        if disk.cut:
            disk.apply_cut()
        _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(request)
        answer = handle(disk, opcode, nodeid, memoryview(request)[IN_HEADER.size:])
        if answer is not None:
            error, body = answer
            if error:
                body = b""
            header = OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique)
            try:
                os.writev(fd, [header, body])
            except OSError as e:
                if e.errno != errno.ENOENT:  # ENOENT: the request was interrupted meanwhile
                    raise
            # A READ's answer is a view of the memory, which must not be held across a resize.
            answer = body = None
        if opcode == INIT:
            say("ready")
        if opcode == DESTROY:
            return


if __name__ == "__main__":
    main()
