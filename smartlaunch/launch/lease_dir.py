"""The lease directory: where it is, and whether it is safe to trust.

Shared directories are created 1777, private ones 0700; a symlink, a group/world-writable one
without the sticky bit, or one owned by another non-root user is refused (LeaseDirError). It is
opened once with O_NOFOLLOW and used through that fd, so a later swap for a symlink changes
nothing.
"""
from __future__ import annotations

import errno
import os
import stat

from smartlaunch.errors import ExitCode, SmartlaunchError

ENV_LEASE_DIR = "SMARTLAUNCH_LEASE_DIR"


class LeaseDirError(SmartlaunchError):
    """The lease directory is unsafe or unusable; configured by paths.lease_dir."""
    exit_code = ExitCode.POLICY


def lease_dir_for(policy) -> str:
    """The directory to use: SMARTLAUNCH_LEASE_DIR unless the admin enforced paths.lease_dir."""
    env = os.environ.get(ENV_LEASE_DIR)
    return policy.paths.lease_dir if lease_dir_enforced(policy) or not env else env


def absolute_lease_dir(path: str) -> str:
    """path, ~ expanded; LeaseDirError for a relative one: resolved against each launch's own
    directory, it would be another place for every directory a job starts in, and no launch
    would see another's leases."""
    full = os.path.expanduser(path)
    if not os.path.isabs(full):
        raise LeaseDirError(f"lease directory {path!r} is a relative path: launches started "
                            f"in other directories would not see its leases; set paths.lease_dir "
                            f"(or SMARTLAUNCH_LEASE_DIR) to an absolute path")
    return os.path.normpath(full)


def lease_dir_enforced(policy) -> bool:
    return policy.source_of("paths.lease_dir").startswith("enforced")


def boot_id() -> str:
    """This boot's id, "" when unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _is_private_location(path: str) -> bool:
    home = os.path.realpath(os.path.expanduser("~"))
    run_user = f"/run/user/{os.geteuid()}"
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p + os.sep) for p in (home, run_user) if p != "/")


def open_lease_dir(path: str, *, private: bool | None = None, create: bool = True,
                   enforced: bool = False) -> int:
    """Open (creating if asked) and vet the lease directory; return an O_NOFOLLOW dir fd.
    enforced: the admin's policy fixes the path (the user cannot point elsewhere)."""
    path = os.path.abspath(os.path.expanduser(path))
    if private is None:
        private = _is_private_location(path)
    created = False
    if create and not os.path.lexists(path):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mkdir(path, 0o700)       # restrictive until fchmod below: no window at 0777
            created = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise LeaseDirError(f"cannot create lease directory {path}: {exc.strerror}; set "
                                "paths.lease_dir (or SMARTLAUNCH_LEASE_DIR) to a usable "
                                "directory") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):   # O_DIRECTORY says ENOTDIR
            raise LeaseDirError(f"lease directory {path} is a symlink; another user may control its "
                                "target: remove it or set paths.lease_dir to a real directory") from None
        if exc.errno == errno.ENOTDIR:
            raise LeaseDirError(f"lease directory {path} is not a directory; remove it or set "
                                "paths.lease_dir elsewhere") from None
        raise LeaseDirError(f"cannot open lease directory {path}: {exc.strerror}; "
                            "set paths.lease_dir (or SMARTLAUNCH_LEASE_DIR) to a usable directory") from None
    try:
        st = os.fstat(fd)
        if created and st.st_uid == os.geteuid():
            os.fchmod(fd, 0o700 if private else 0o1777)
            st = os.fstat(fd)
        _check_dir(path, st)
        if create and not os.access(f"/proc/self/fd/{fd}", os.W_OK | os.X_OK):
            # without write access a launch would wait for a record it can never create
            raise LeaseDirError(_not_writable(path, st, os.fstatvfs(fd), enforced))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_dir(path: str, st: os.stat_result) -> None:
    if st.st_uid not in (0, os.geteuid()):
        # The owner of a sticky directory may delete anyone's files in it.
        raise LeaseDirError(f"lease directory {path} is owned by uid {st.st_uid}, who could delete other "
                            "users' leases; have root create it with mode 1777 (tmpfiles.d: "
                            f"`d {path} 1777 root root -`) or set paths.lease_dir to a directory you own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise LeaseDirError(f"lease directory {path} is group/world-writable without the sticky bit "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}), so anyone can delete leases; "
                            f"run `chmod 1777 {path}` (shared) or `chmod 700 {path}` (private)")


def _not_writable(path: str, st: os.stat_result, fs: os.statvfs_result, enforced: bool) -> str:
    """Advice the reader can follow: chmod for the owner; anyone else points elsewhere or
    asks the admin."""
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if fs.f_flag & os.ST_RDONLY:
        what, admin = f"lease directory {path} is on a read-only filesystem", \
            "to set paths.lease_dir to a writable directory"
    elif st.st_uid == os.geteuid():
        return (f"lease directory {path} is yours but not writable ({mode}); run "
                f"`chmod 1777 {path}` (shared with other users) or `chmod 700 {path}` (yours only)")
    else:
        what = (f"lease directory {path} is not writable by you (uid {os.geteuid()}; it is "
                f"owned by uid {st.st_uid}, {mode})")
        admin = f"to make it shared (`chmod 1777 {path}`)"
    if enforced:
        return f"{what}, and the admin's policy fixes paths.lease_dir: ask your admin {admin}"
    return (f"{what}; set {ENV_LEASE_DIR} (or paths.lease_dir in your policy) to a directory "
            f"you can write, or ask your admin {admin}")
