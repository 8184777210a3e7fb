"""The cache store every layer writes through: one JSON file per key under the policy's
cache directory, and the file helpers for directories others may reach.

Directories are created 0o700 and refused when they are links, not ours, or writable by
others; files are read O_NOFOLLOW and written whole (a temp file + os.replace). A cache that
cannot be written is said once and the launch measures without it; a bad record read back
(BadRecord) is said once and treated as absent.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from smartlaunch import wire
from smartlaunch.errors import BadValue, PolicyError

DEFAULT_CACHE_DIR = "~/.cache/smartlaunch"
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
MIN_FREE_BYTES = 1 << 20        # free space needed before we write logs or mapped records
MAX_RECORD_BYTES = 4 << 20      # a record is a few KiB; a larger file is not one we wrote
MAX_SECONDS = 1e7               # ~4 months: no step, window, dry run or trial lasts longer
MAX_TEXT = 64 << 10             # a note, an error tail, a device name
MAX_ITEMS = 4096                # GPUs of a group, points of a curve, entries of a map


class BadRecord(BadValue, ValueError):
    """A stored record that is not what its reader expects; str(): "field: why"."""

    def __init__(self, field: str, why: str):
        super().__init__(field, why, f"{field}: {why}")

    @staticmethod
    def shown(v) -> str:
        if isinstance(v, dict):
            return "an object"
        if isinstance(v, (list, tuple)):
            return "a list"
        if isinstance(v, str):
            return f"the string {v[:40]!r}"
        if v is None or isinstance(v, bool):
            return json.dumps(v)
        return f"{v!r}"[:40]


# The cache's readers (wire.py): a bad field is a BadRecord; strings kept as written.
CACHE = wire.Reader(BadRecord, max_text=MAX_TEXT, max_items=MAX_ITEMS, printable=False)
integer, number, flag, text = CACHE.integer, CACHE.number, CACHE.flag, CACHE.text
items, obj, required, optional, within = (CACHE.items, CACHE.obj, CACHE.required,
                                          CACHE.optional, CACHE.within)


class CacheUnwritable(PolicyError):
    """A cache directory that cannot take a write (`directory`, `strerror`)."""

    def __init__(self, directory, strerror: str):
        super().__init__(f"cache directory {directory} is not writable ({strerror}); set "
                         f"paths.cache_dir in your policy to a writable directory")
        self.directory, self.strerror = directory, strerror


def _home(environ) -> str:
    return environ.get("HOME") or os.path.expanduser("~")


def _expand_home(raw: str, environ) -> str:
    """`raw` with a leading "~" as environ's HOME."""
    return _home(environ) + raw[1:] if raw == "~" or raw.startswith("~/") else raw


def cache_root(policy, environ) -> Path:
    raw = policy.paths.cache_dir
    xdg = environ.get("XDG_CACHE_HOME")
    if raw == DEFAULT_CACHE_DIR and xdg:
        raw = os.path.join(xdg, "smartlaunch")
    return Path(_expand_home(raw, environ))


def log_root(policy, environ) -> Path:
    """launch.log_dir, where every launch makes its run directory ("": logs/ in the cache)."""
    if not policy.launch.log_dir:
        return cache_root(policy, environ) / "logs"
    return Path(_expand_home(policy.launch.log_dir, environ))


def missing_home(path: str, environ) -> str | None:
    """HOME, when `path` lies under it and it does not exist (a mistake to name, not a
    directory to make)."""
    home = _home(environ)
    if not home or os.path.isdir(home):
        return None
    full, home = os.path.abspath(path), os.path.abspath(home)
    return home if full == home or full.startswith(home.rstrip(os.sep) + os.sep) else None


def private_dir(path: Path) -> Path:
    """Create (0o700) or verify a directory we may trust; PolicyError otherwise
    (CacheUnwritable where it cannot be created, or would make a HOME that does not exist)."""
    home = missing_home(os.fspath(path), os.environ)
    if home:        # a service account's HOME=/nonexistent: root would make it at the root
        raise CacheUnwritable(path, f"HOME={home} does not exist, and smartlaunch does not "
                                    f"create it")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            raise CacheUnwritable(path, exc.strerror) from exc
        raise PolicyError(f"cannot create cache directory {path}: {exc.strerror}; "
                          "set paths.cache_dir in your policy to a writable directory") from exc
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != os.getuid():
        why = f"is owned by uid {st.st_uid}, not by you"
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        why = "is group- or world-writable without the sticky bit"
    if why:
        raise PolicyError(f"refusing cache directory {path}: it {why}; "
                          "remove it or set paths.cache_dir in your policy to a private directory")
    return path


def read_json(path: Path) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None  # absent, or a symlink planted in our place
    try:
        with os.fdopen(fd) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def free_bytes(path) -> int | None:
    """Bytes an unprivileged user may still write on the file system of `path` (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def write_json(path: Path, data: dict, mode: int | None = None) -> None:
    """Whole or not at all; mode: its permissions (else 0o600). CacheUnwritable when the
    directory cannot take it."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            raise CacheUnwritable(path.parent, exc.strerror) from exc
        raise
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno in UNWRITABLE:
            raise CacheUnwritable(path.parent, exc.strerror) from exc
        raise


_SAID: set[str] = set()     # lines said by this process: a record read twice is said once
_UNWRITABLE: set[str] = set()   # cache directories found unwritable by this process


def say_once(line: str) -> None:
    """`smartlaunch: <line>` on stderr, the first time this process says it."""
    if line not in _SAID:
        _SAID.add(line)
        try:    # a terminal's status line (statusline.py) is erased first; its next tick redraws
            erase = "\r\x1b[K" if sys.stderr.isatty() else ""
        except (AttributeError, ValueError):
            erase = ""
        print(f"{erase}smartlaunch: {line}", file=sys.stderr, flush=True)


def say_unwritable(root: Path, exc: OSError | CacheUnwritable) -> None:
    """The one line for a cache directory the launch measures without."""
    _UNWRITABLE.add(str(root))
    say_once(f"cache directory {root} is not writable ({exc.strerror}): measuring without "
             f"caching")


def uncached() -> bool:
    """Whether this process measures without caching (say_unwritable was called)."""
    return bool(_UNWRITABLE)


def cache_folder(root: Path, name: str) -> Path:
    """<root>/<name>, created or verified (private_dir); where it cannot be created, said
    once and returned as is."""
    try:
        return private_dir(private_dir(root) / name)
    except CacheUnwritable as exc:
        say_unwritable(root, exc)
        return root / name


def keep(root: Path, path: Path, data: dict, mode: int | None = None) -> bool:
    """write_json for a cache entry: False, said once, when the cache cannot take it."""
    try:
        write_json(path, data, mode)
        return True
    except CacheUnwritable as exc:
        say_unwritable(root, exc)
    except FileNotFoundError:
        pass
    return False


def load(path: Path, parse, what: str, *, then: str = "measuring again", read=None):
    """parse(the JSON at path), or None: absent, unreadable, or a bad record (said once).
    read: how the file is read (default read_record)."""
    try:
        data = read_record(path) if read is None else read(path)
        return None if data is None else parse(data)
    except BadRecord as exc:
        say_once(f"ignoring the cached {what} at {path} ({exc}); {then}")
        return None


def read_regular(path, limit: int, trusted: Callable[[os.stat_result], bool] | None = None):
    """At most limit + 1 bytes of the regular file at `path` (no link followed, no FIFO waited
    on; its stat accepted by `trusted` if given), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # absent, or a symlink planted in our place
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or (trusted is not None and not trusted(st)):
                return None
            return f.read(limit + 1)
        except OSError:
            return None


def read_record(path: Path, trusted: Callable[[os.stat_result], bool] | None = None):
    """The JSON value of the regular file at `path` (read_regular), or None; BadRecord when not
    JSON or too large."""
    raw = read_regular(path, MAX_RECORD_BYTES, trusted)
    return None if raw is None else CACHE.loads(raw, MAX_RECORD_BYTES, "the file")


def mapped_record(path, size: int, mode: int = 0o644):
    """A new zero-filled file of `size` bytes mapped into memory, created O_EXCL|O_NOFOLLOW
    (a name already there is unlinked first, never followed). OSError when it cannot be made."""
    import mmap
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", mode=0o700, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, flags, mode)
    try:
        zeros = memoryview(bytes(size))     # written, not ftruncate'd: a full disk or a quota
        while zeros:                        # fails here, not as SIGBUS at a later store
            zeros = zeros[os.write(fd, zeros):]
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def open_private(path, mode: str = "a", *, buffering: int = -1, encoding: str | None = None):
    """A file object for writing `path` ("a": appended; "w": emptied), opened O_NOFOLLOW,
    new files 0o600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    fd = os.open(path, flags, 0o600)
    try:
        return os.fdopen(fd, mode, buffering=buffering, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise


def owner_name(uid: int) -> str:
    """'nobody' for 65534: the name to print beside a uid."""
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def dir_problem(st: os.stat_result) -> str | None:
    """Why a directory we create files in (lstat'ed) is not safe, or None: it must be a
    directory, owned by us or root, and sticky if others may write it."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {st.st_uid} ({owner_name(st.st_uid)}), not by you or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (f"is group/world-writable (mode {stat.S_IMODE(st.st_mode):04o}) without the "
                f"sticky bit")
    return None


def unsafe_dir_message(where: str, path: str, why: str, key: str) -> str:
    """The one line refusing a directory `dir_problem` found unsafe."""
    if why == "is a symbolic link":
        fix = f"set {key} to the directory it points to ({os.path.realpath(path)})"
        return (f"{where}: {path} {why}: smartlaunch follows no link to a directory it writes "
                f"in, as another user could swap it; refusing it. Fix: {fix}")
    return (f"{where}: {path} {why}: another user could read or replace what the launch "
            f"writes there; refusing it. Fix: set {key} to a directory you own")


def flock_holder(fd: int) -> str:
    """Who holds a flock on the file open at `fd`: 'pid N (user U)', or 'another process'."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()      # "1: FLOCK ADVISORY WRITE 1234 00:2f:99 0 EOF"
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == inode:
                    pid = int(parts[4])
                    try:
                        user = f" (user {owner_name(os.stat(f'/proc/{pid}').st_uid)})"
                    except OSError:
                        user = ""
                    return f"pid {pid}{user}"
    except (OSError, ValueError):
        pass
    return "another process"


def own_file(st: os.stat_result) -> bool:
    """A regular file of this user's (lstat or fstat): what another user cannot have planted."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def read_own(path: str, limit: int) -> bytes | None:
    """The bytes of this user's regular file at `path` (read_regular), or None: absent,
    another's, not a regular file, or over `limit` bytes."""
    data = read_regular(path, limit, own_file)
    return data if data is not None and len(data) <= limit else None


def read_capped(path: str, limit: int) -> bytes | None:
    """The file's bytes, or None when it holds more than `limit` (read no further)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def trusted_json(path: Path, top: Path):
    """read_record of `path` if nobody but root or this user could have written it (the file
    and every directory from `top` down to it), else None."""
    me = os.getuid()

    def ok(st) -> bool:
        return st.st_uid in (0, me) and not st.st_mode & 0o022
    try:
        rel = path.relative_to(top)
    except ValueError:
        return None
    d = top
    for part in (None, *rel.parts[:-1]):
        d = d / part if part else d
        try:
            st = os.lstat(d)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or not ok(st):
            return None
    return read_record(path, ok)


def write_public_json(path: Path, data: dict) -> None:
    """write_json for a file every user may read (0o644)."""
    write_json(path, data, 0o644)
