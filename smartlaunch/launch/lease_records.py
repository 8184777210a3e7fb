"""Record files in a lease directory: writing one that is live from the moment it appears,
reading any, and telling whether it is live.

A record is live iff a WRITE lock (fcntl OFD) is held on it: only its owner can take one (it is
created 0600, locked, then made 0644), and the lock ends with its holder, SIGKILL included. It
is written and locked under a hidden temp name, then renamed; giving it back is unlink, then
close. A record that is not live is stale: it claims nothing.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import stat
import struct
from typing import NamedTuple

from smartlaunch.launch.lease_holders import Holder, RecordError, parse_record

RECORD_MAX_BYTES = 64 * 1024
TEMP_SUFFIX = ".new"

_FLOCK = "hhqqi0q"          # Linux struct flock, padded to off_t's alignment


def _flock(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)     # the whole file; l_pid must be 0


class Published(NamedTuple):
    name: str       # inside the lease directory
    fd: int         # holds the record's write lock; closing it ends the lease


class Record(NamedTuple):
    """What one directory entry named like a record turned out to be."""
    name: str
    owner: int | None       # st_uid; None when it could not be examined at all
    live: bool              # a write lock is held on it
    stale: bool             # a regular file nobody holds a write lock on: claims nothing
    holder: Holder | None   # None: it did not parse, `problem` says why
    problem: str = ""


class LockingUnsupported(OSError):
    """The lease directory's filesystem refuses fcntl locks (`strerror` says how)."""


def publish(dfd: int, prefix: str, kind: str, rec: dict) -> Published:
    """Create `<prefix>.<pid>.<random>.<kind>` in the directory `dfd` holding `rec` as JSON,
    mode 0644, write-locked before it is visible; nothing left behind on failure. Raises
    OSError (LockingUnsupported when the filesystem has no fcntl locks)."""
    # Two tokens: the final name must not follow from the listed temporary one.
    temp = f".{prefix}.{os.getpid()}.{secrets.token_hex(8)}{TEMP_SUFFIX}"
    name = f"{prefix}.{os.getpid()}.{secrets.token_hex(8)}.{kind}"
    # 0600 until locked: nobody else can open it for a lock of theirs before ours
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    try:
        hold(fd)
        data = json.dumps(rec).encode()
        while data:
            data = data[os.write(fd, data):]
        os.fchmod(fd, 0o644)        # readable by all (they must see the lease), not the umask's
        os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dfd)
        except OSError:
            pass
        os.close(fd)
        raise
    return Published(name, fd)


def hold(fd: int) -> None:
    """Take the write lock that makes the file at `fd` a live record. Raises
    LockingUnsupported where the filesystem has no fcntl locks, OSError where another holds one."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK))
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            raise LockingUnsupported(exc.errno, exc.strerror) from None
        raise


def withdraw(dfd: int, record: Published) -> None:
    """End a lease: its name goes first, then the lock (closing the fd). Never raises."""
    try:
        os.unlink(record.name, dir_fd=dfd)
    except OSError:
        pass
    try:
        os.close(record.fd)
    except OSError:
        pass


def write_locked(fd: int) -> bool:
    """A write lock (OFD or POSIX, any process) is held on the file open at `fd`."""
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_RDLCK))
    except OSError:
        return True         # cannot tell: count it, never lease a GPU twice
    return struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK


def inspect(dfd: int, name: str) -> Record | None:
    """Read the entry `name` of `dfd` without following links or blocking on a FIFO; None
    when it is gone. Never raises for what the entry is or holds."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _unopened(dfd, name, exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Record(name, st.st_uid, False, False, None, f"it is {_kind(st.st_mode)}, "
                          "not a regular file")
        live = write_locked(fd)
        if st.st_size > RECORD_MAX_BYTES:
            return Record(name, st.st_uid, live, not live, None, f"it is {st.st_size} bytes, "
                          f"more than a record's {RECORD_MAX_BYTES}")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(RECORD_MAX_BYTES + 1)     # it may have grown since the fstat
    except OSError as exc:
        return Record(name, None, False, False, None, f"it cannot be read ({exc.strerror})")
    finally:
        os.close(fd)
    if len(data) > RECORD_MAX_BYTES:
        return Record(name, st.st_uid, live, not live, None,
                      f"it is more than a record's {RECORD_MAX_BYTES} bytes")
    try:
        holder = parse_record(data, owner=st.st_uid, record=name)
    except RecordError as exc:
        return Record(name, st.st_uid, live, not live, None, str(exc))
    return Record(name, st.st_uid, live, not live, holder)


def _unopened(dfd: int, name: str, exc: OSError) -> Record | None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError:
        return Record(name, None, False, False, None, f"it cannot be examined ({exc.strerror})")
    if stat.S_ISLNK(st.st_mode):
        why = "it is a symlink"
    elif not stat.S_ISREG(st.st_mode):
        why = f"it is {_kind(st.st_mode)}, not a regular file"
    else:
        why = f"it cannot be read ({exc.strerror})"
    return Record(name, st.st_uid, False, False, None, why)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return what
    return "a special file"
