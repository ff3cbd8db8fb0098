"""A power-loss file system for mink's tests: a FUSE pass-through that, at a power cut,
keeps only what POSIX promises to keep (in the spirit of Jepsen's LazyFS).

Usage:
  power_loss_fs.py mount STATE MOUNTPOINT   serve STATE at MOUNTPOINT until killed
  power_loss_fs.py cut STATE [--verbose]    after a kill: keep only what was durable

What survives a power cut
-------------------------
- A file's *data* (write, truncate, ftruncate, an O_TRUNC open) is pending until the
  file is fsynced (fsync or fdatasync, on any handle of it). A cut drops every pending
  change: the file is back to its contents and length as of its last fsync.
- A *name* (create, mkdir, symlink, link, rename, unlink, rmdir) is pending until its
  directory is fsynced. A rename touches two directories: each side becomes durable with
  its own directory's fsync (a rename across directories with only the target fsynced
  leaves the file under both names, with only the source fsynced under neither).
- A durable name of a file never fsynced comes back as an empty file; of a directory
  never fsynced, as an empty directory. The mount root is always there.

How
---
STATE/live is what the mount shows now (a pass-through), STATE/durable what a power cut
would keep: `files/<id>` the data of each file as of its last fsync, `dirs/<id>.json`
the entries of each directory as of its last fsync, `{name: [id, kind(, target)]}`.
Every file and directory created gets an id never used before (the backing file system
reuses inode numbers, so they cannot name files across an unlink), the root is id 0.
An fsync copies only the byte ranges written since the file's last fsync; a directory
fsync replaces its record atomically. The record is written as the file system goes, so
killing this process at any instant (SIGKILL is how a power cut ends it) leaves it whole.
`cut` then rebuilds STATE/live from it and trims it to exactly that tree, so the next
`mount` starts from a fully durable state (and refuses a STATE/live that is not).

What it does not model
----------------------
- Torn writes: an fsync that was running when the power went may have copied part of its
  ranges (as a disk may write part of what was pending), but a cut never tears a single
  write inside a synced range, nor keeps a pending write that no fsync covered.
- Reordering among pending changes: a cut drops all of them, never a subset.
- Modes, owners, times and extended attributes (unsupported: ENOTSUP) are not recorded:
  `cut` recreates files 0644 and directories 0755. Special files (FIFOs, devices) are
  refused (EPERM); renameat2 flags (RENAME_NOREPLACE, RENAME_EXCHANGE) fail with EINVAL.
  fallocate is unsupported (EOPNOTSUPP); POSIX and flock locks are the kernel's, local.
- The durable record survives this process being killed, not the host losing power.
"""

import errno
import json
import logging
import os
import shutil
import stat
import sys
import threading

import mfusepy

ROOT = 0  # the id of the mount root
FILE, DIR, SYMLINK = "file", "dir", "symlink"
END = 1 << 63  # the end of a range that runs to the end of the file
COPY_CHUNK = 1 << 20


class Record:
    """The durable record: `files/<id>` and `dirs/<id>.json` under one directory."""

    def __init__(self, path):
        self.files = os.path.join(path, "files")
        self.dirs = os.path.join(path, "dirs")
        os.makedirs(self.files, exist_ok=True)
        os.makedirs(self.dirs, exist_ok=True)

    def file(self, id):
        return os.path.join(self.files, str(id))

    def dir(self, id):
        return os.path.join(self.dirs, f"{id}.json")

    def read_dir(self, id):
        """The durable entries of directory `id`: {name: [id, kind(, target)]}."""
        try:
            with open(self.dir(id)) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def write_dir(self, id, entries):
        """Replaces the record of directory `id`, atomically."""
        path = self.dir(id)
        with open(path + ".tmp", "w") as f:
            json.dump(entries, f)
        os.replace(path + ".tmp", path)

    def ids(self):
        """Every id with a record of its own (file data or directory entries)."""
        names = os.listdir(self.files) + [
            name.removesuffix(".json") for name in os.listdir(self.dirs) if name.endswith(".json")
        ]
        return {int(name) for name in names}

    def tree(self):
        """The tree reachable from the root: its entries in pre-order as (relative path,
        [id, kind(, target)]), and the entries each directory keeps. A directory id met a
        second time (a rename across directories, both sides fsynced at different times)
        is kept at its first path only."""
        items, kept = [], {}

        def walk(dir_id, prefix):
            kept[dir_id] = {}
            for name, entry in sorted(self.read_dir(dir_id).items()):
                id, kind = entry[0], entry[1]
                if kind == DIR and id in kept:
                    continue
                kept[dir_id][name] = entry
                items.append((os.path.join(prefix, name), entry))
                if kind == DIR:
                    walk(id, os.path.join(prefix, name))

        walk(ROOT, "")
        return items, kept


def kind_of(mode):
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIR
    if stat.S_ISLNK(mode):
        return SYMLINK
    raise OSError(errno.EPERM, "only regular files, directories and symlinks are modelled")


def add_range(ranges, start, end):
    """Adds [start, end) to `ranges`, a sorted list of disjoint [start, end) pairs,
    merging the ones it overlaps or touches. Appends cost O(1)."""
    i = len(ranges)
    while i > 0 and ranges[i - 1][1] >= start:
        i -= 1
    j = i
    while j < len(ranges) and ranges[j][0] <= end:
        start, end = min(start, ranges[j][0]), max(end, ranges[j][1])
        j += 1
    ranges[i:j] = [(start, end)]


def copy_range(src, dst, start, end, dst_size):
    """Makes bytes [start, end) of fd `dst` those of fd `src`, skipping `src`'s holes
    (zeroed in `dst` only below `dst_size`, its length before: beyond it they read as
    zeros once `dst` is extended)."""
    pos = start
    while pos < end:
        try:
            data = min(os.lseek(src, pos, os.SEEK_DATA), end)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            data = end
        for zero in range(pos, min(data, dst_size), COPY_CHUNK):
            os.pwrite(dst, bytes(min(COPY_CHUNK, min(data, dst_size) - zero)), zero)
        if data >= end:
            return
        hole = min(os.lseek(src, data, os.SEEK_HOLE), end)
        while data < hole:
            copied = os.copy_file_range(src, dst, hole - data, data, data)
            if copied == 0:
                raise OSError(errno.EIO, "copy_file_range copied nothing")
            data += copied
        pos = hole


class PowerLossFs(mfusepy.Operations):
    """The mounted file system: a pass-through over STATE/live that writes the durable
    record as files and directories are fsynced."""

    use_ns = True

    def __init__(self, state):
        state = os.path.abspath(state)  # libfuse changes the working directory to /
        self.live = os.path.join(state, "live")
        self.record = Record(os.path.join(state, "durable"))
        self.mutex = threading.Lock()
        self.ids = map_live(self.live, self.record)  # live st_ino -> id
        self.next_id = max([ROOT, *self.ids.values(), *self.record.ids()]) + 1
        self.handles = {}  # open file handle (a backing fd) -> id
        self.dirty = {}  # id -> ranges written since its last fsync

    def real(self, path):
        return self.live + path

    def new_id(self, path):
        """Gives the inode just created at `path` a fresh id (call with the lock held)."""
        self.ids[os.lstat(self.real(path)).st_ino] = self.next_id
        self.next_id += 1

    def id_of(self, ino):
        try:
            return self.ids[ino]
        except KeyError:
            logging.error("inode %d has no id: was STATE/live changed outside the mount?", ino)
            raise mfusepy.FuseOSError(errno.EIO) from None

    def init(self, path):
        print("mounted", flush=True)

    # Metadata, passed through.

    def getattr(self, path, fh=None):
        st = os.fstat(fh) if fh is not None else os.lstat(self.real(path))
        keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_blocks", "st_blksize")
        attrs = {key: getattr(st, key) for key in keys}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readlink(self, path):
        return os.readlink(self.real(path))

    def chmod(self, path, mode):
        if path is not None:
            os.chmod(self.real(path), mode, follow_symlinks=False)

    def chown(self, path, uid, gid):
        if path is not None:
            os.chown(self.real(path), uid, gid, follow_symlinks=False)

    def utimens(self, path, times=None):
        # Times are not modelled: UTIME_NOW and UTIME_OMIT arrive as odd numbers, kept.
        if path is not None:
            os.utime(self.real(path), ns=times, follow_symlinks=False)

    def statfs(self, path):
        st = os.statvfs(self.live)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                "f_favail", "f_namemax")
        return {key: getattr(st, key) for key in keys}

    # Names: pending until their directory is fsynced.

    def mknod(self, path, mode, dev):
        if not stat.S_ISREG(mode):
            raise mfusepy.FuseOSError(errno.EPERM)
        with self.mutex:
            os.mknod(self.real(path), mode)
            self.new_id(path)

    def mkdir(self, path, mode):
        with self.mutex:
            os.mkdir(self.real(path), mode)
            self.new_id(path)

    def symlink(self, target, source):
        with self.mutex:
            os.symlink(source, self.real(target))
            self.new_id(target)

    def link(self, target, source):
        os.link(self.real(source), self.real(target))

    def unlink(self, path):
        os.unlink(self.real(path))

    def rmdir(self, path):
        os.rmdir(self.real(path))

    def rename(self, old, new):
        os.rename(self.real(old), self.real(new))

    def opendir(self, path):
        return os.open(self.real(path), os.O_RDONLY | os.O_DIRECTORY)

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(fh)]

    def releasedir(self, path, fh):
        os.close(fh)

    def fsyncdir(self, path, datasync, fh):
        with self.mutex:
            entries = {}
            for name in os.listdir(fh):
                st = os.lstat(name, dir_fd=fh)
                entry = [self.id_of(st.st_ino), kind_of(st.st_mode)]
                if entry[1] == SYMLINK:
                    entry.append(os.readlink(name, dir_fd=fh))
                entries[name] = entry
            self.record.write_dir(self.id_of(os.fstat(fh).st_ino), entries)

    # Data: pending until the file is fsynced.

    def open(self, path, flags):
        return self.open_backing(path, flags, create=False)

    def create(self, path, mode, flags):
        return self.open_backing(path, flags, create=True, mode=mode)

    def open_backing(self, path, flags, create, mode=0o644):
        """Opens the backing file read-write (an fsync reads it, whatever the caller's
        access mode), without O_APPEND (writes come with their offset)."""
        dropped = os.O_ACCMODE | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_DIRECT
        backing = flags & ~dropped | os.O_RDWR
        with self.mutex:
            if create:
                try:
                    fd = os.open(self.real(path), backing | os.O_CREAT | os.O_EXCL, mode)
                    self.new_id(path)
                    self.handles[fd] = self.id_of(os.fstat(fd).st_ino)
                    return fd
                except FileExistsError:
                    if flags & os.O_EXCL:
                        raise
            fd = os.open(self.real(path), backing)
            id = self.handles[fd] = self.id_of(os.fstat(fd).st_ino)
            if flags & os.O_TRUNC:
                add_range(self.dirty.setdefault(id, []), 0, END)
            return fd

    def release(self, path, fh):
        with self.mutex:
            del self.handles[fh]
            os.close(fh)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        with self.mutex:
            written = os.pwrite(fh, data, offset)
            add_range(self.dirty.setdefault(self.handles[fh], []), offset, offset + written)
            return written

    def truncate(self, path, length, fh=None):
        with self.mutex:
            if fh is not None:
                os.ftruncate(fh, length)
                id = self.handles[fh]
            else:
                os.truncate(self.real(path), length)
                id = self.id_of(os.lstat(self.real(path)).st_ino)
            add_range(self.dirty.setdefault(id, []), length, END)

    def fsync(self, path, datasync, fh):
        with self.mutex:
            id = self.handles[fh]
            size = os.fstat(fh).st_size
            durable = os.open(self.record.file(id), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                durable_size = os.fstat(durable).st_size
                for start, end in self.dirty.pop(id, []):
                    copy_range(fh, durable, start, min(end, size), durable_size)
                os.ftruncate(durable, size)
            finally:
                os.close(durable)


class Fuse(mfusepy.FUSE):
    """mfusepy's FUSE, refusing renameat2 flags where mfusepy would drop them."""

    def rename_fuse_3(self, old, new, flags):
        if flags:
            return -errno.EINVAL
        return self.rename_fuse_2(old, new)


def walk_live(live):
    """Every path under `live`, relative, with its lstat."""
    for top, dirs, files in os.walk(live):
        for name in dirs + files:
            path = os.path.join(top, name)
            yield os.path.relpath(path, live), os.lstat(path)


def map_live(live, record):
    """The id of each inode of `live`, which must be exactly the record's tree."""
    ids = {os.lstat(live).st_ino: ROOT}
    items, _ = record.tree()
    expected = dict(items)
    found = dict(walk_live(live))
    for rel in sorted(expected.keys() | found.keys()):
        entry, st = expected.get(rel), found.get(rel)
        durable_size = None
        if entry is not None and entry[1] == FILE:
            path = record.file(entry[0])
            durable_size = os.path.getsize(path) if os.path.exists(path) else 0
        if (
            entry is None
            or st is None
            or kind_of(st.st_mode) != entry[1]
            or durable_size not in (None, st.st_size)
        ):
            sys.exit(f"power_loss_fs: {live} is not the durable tree at {rel!r} (no `cut`?)")
        ids[st.st_ino] = entry[0]
    return ids


def mount(state, mountpoint):
    os.makedirs(os.path.join(state, "live"), exist_ok=True)
    try:
        Fuse(
            PowerLossFs(state),
            mountpoint,
            foreground=True,
            fsname="power_loss_fs",
            hard_remove=True,  # an unlinked open file stays open, not renamed .fuse_hidden*
            entry_timeout=1.0,
            attr_timeout=1.0,
            negative_timeout=0.0,
        )
    except RuntimeError as e:
        sys.exit(f"power_loss_fs: mounting {state} at {mountpoint} failed ({e}; libfuse above)")


def files_differ(a, b):
    if os.path.getsize(a) != os.path.getsize(b):
        return True
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            chunk = fa.read(COPY_CHUNK)
            if chunk != fb.read(COPY_CHUNK):
                return True
            if not chunk:
                return False


def cut(state, verbose):
    """Rebuilds STATE/live from the durable record and trims the record to that tree."""
    live = os.path.join(state, "live")
    record = Record(os.path.join(state, "durable"))
    items, kept = record.tree()
    rebuilt = os.path.join(state, "live.cut")
    shutil.rmtree(rebuilt, ignore_errors=True)
    os.mkdir(rebuilt)
    first_link = {}
    for rel, entry in items:
        path = os.path.join(rebuilt, rel)
        id, kind = entry[0], entry[1]
        if kind == DIR:
            os.mkdir(path)
        elif kind == SYMLINK:
            os.symlink(entry[2], path)
        elif id in first_link:
            os.link(first_link[id], path)
        else:
            first_link[id] = path
            with open(path, "wb") as dst:
                if os.path.exists(record.file(id)):
                    with open(record.file(id), "rb") as src:
                        size = os.fstat(src.fileno()).st_size
                        copy_range(src.fileno(), dst.fileno(), 0, size, 0)
                        dst.truncate(size)

    lost_names, lost_data = [], []
    if os.path.isdir(live):
        for rel, st in walk_live(live):
            path = os.path.join(rebuilt, rel)
            if not os.path.lexists(path):
                lost_names.append(rel)
            elif stat.S_ISREG(st.st_mode) and files_differ(os.path.join(live, rel), path):
                lost_data.append(rel)

    for id, entries in kept.items():
        record.write_dir(id, entries)
    reachable = set(kept) | {entry[0] for _, entry in items}
    for id in record.ids() - reachable:
        for path in (record.file(id), record.dir(id)):
            if os.path.exists(path):
                os.unlink(path)
    shutil.rmtree(live, ignore_errors=True)
    os.rename(rebuilt, live)

    if verbose:
        for rel in lost_names:
            print(f"lost name: {rel}", file=sys.stderr)
        for rel in lost_data:
            print(f"lost data: {rel}", file=sys.stderr)
    print(
        f"power cut: kept {len(first_link)} files and {len(kept) - 1} directories; "
        f"lost {len(lost_names)} names and unsynced data of {len(lost_data)} files",
        file=sys.stderr,
    )


def main():
    logging.basicConfig(format="power_loss_fs: %(levelname)s %(message)s")
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "mount":
        mount(args[1], args[2])
    elif args[:1] == ["cut"] and len(args) in (2, 3) and args[2:] in ([], ["--verbose"]):
        cut(args[1], verbose=len(args) == 3)
    else:
        sys.exit(__doc__.split("\n\n")[1])


if __name__ == "__main__":
    main()
