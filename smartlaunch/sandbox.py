"""No trace: the dry run and trials run in a private mount namespace where every writable
directory tree is a copy-on-write overlay.

    python -m smartlaunch.sandbox --scratch DIR [--keep DIR]... [--status FILE] -- ARGV...

Before exec'ing ARGV: unshare a mount namespace (and a user namespace mapping only our ids
when not root), then overlay every writable real mount and each top-level directory except
/proc, /sys, /dev and /run. Mounts below a covered directory are bound back read-only; writes
land under <scratch>; the --keep directories alone stay shared. Network side effects are not
contained, hence the tracker variables in DRYRUN_ENV.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import pwd
import re
import stat
import sys
from collections.abc import Callable, Mapping

from smartlaunch.proc import python_m

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
SHARED_TOP = ("proc", "sys", "dev", "run")
PSEUDO_FS = {"proc", "sysfs", "devtmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "securityfs",
             "debugfs", "tracefs", "bpf", "pstore", "hugetlbfs", "autofs", "fusectl", "configfs",
             "binfmt_misc", "nsfs", "efivarfs", "rpc_pipefs", "overlay", "squashfs", "iso9660"}
# Trackers that would otherwise record the dry run as a real experiment (or upload it).
DRYRUN_ENV = {
    "WANDB_MODE": "disabled", "WANDB_DISABLED": "true",        # wandb; HF Trainer reads both
    "DISABLE_MLFLOW_INTEGRATION": "TRUE",                      # HF Trainer's MLflow callback
    "COMET_MODE": "DISABLED", "NEPTUNE_MODE": "debug", "CLEARML_OFFLINE_MODE": "1",
    "DVCLIVE_OPEN": "false", "TENSORBOARD_LOGGING_DISABLED": "1",
}


class IsolationError(OSError):
    pass


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [_unescape(line.split()[4]) for line in f if len(line.split()) > 4]


def overlay_targets(mountinfo: str | None = None,
                    root_entries: list[str] | None = None) -> list[str]:
    """Directories to cover, parents before children."""
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    mounts: dict[str, bool] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 6 or len(rest) < 3:
            continue
        point, opts, fstype, super_opts = _unescape(fields[4]), fields[5], rest[0], rest[2]
        mounts[point] = ("rw" in opts.split(",") and "ro" not in super_opts.split(",")
                         and fstype not in PSEUDO_FS and not fstype.startswith("fuse."))
    out = []
    for point, writable in mounts.items():
        top = point.strip("/").split("/")[0]
        if point != "/" and writable and top not in SHARED_TOP and os.path.isdir(point):
            out.append(point)
    if mounts.get("/"):
        entries = os.listdir("/") if root_entries is None else root_entries
        for name in entries:
            path = "/" + name
            if name in SHARED_TOP or path in mounts or os.path.islink(path) \
                    or not os.path.isdir(path):
                continue
            out.append(path)
    return sorted(set(out), key=_depth)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise IsolationError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _depth(path: str) -> tuple[int, str]:
    return path.count("/"), path


def _restore(libc, path: str, handle: str) -> None:
    """Bind one mount an overlay hid back onto its own path, read-only (not recursive)."""
    _check(libc.mount(handle.encode(), path.encode(), None, MS_BIND, None),
           f"restoring the mount at {path}")
    _check(libc.mount(None, path.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None),
           f"making the restored mount at {path} read-only")


def isolate(scratch: str, keep: list[str]) -> list[str]:
    """Enter the namespace and mount the overlays; returns what is covered. IsolationError
    names the first step the kernel refused."""
    libc = _libc()
    targets = overlay_targets()
    cwd = os.getcwd()
    scratch = os.path.realpath(scratch)
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    else:
        _check(libc.unshare(CLONE_NEWNS | CLONE_NEWUSER), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    # Layers are opened after unshare and before the first overlay hides their paths.
    fds = []

    def opened(path: str, flags: int = os.O_DIRECTORY) -> str:
        """An O_PATH handle, as a path that outlives the overlays."""
        fd = os.open(path, os.O_PATH | flags)
        fds.append(fd)
        return f"/proc/self/fd/{fd}"

    kept = [(os.path.realpath(k), opened(k, os.O_DIRECTORY | os.O_NOFOLLOW)) for k in keep]
    below = [m for m in _mount_points() if m != "/"]
    # Mounts below a target are opened now too: an overlay hides them (a container's driver
    # libraries, bind-mounted under /usr, would be lost).
    lower = {t: opened(t) for t in targets}
    hidden = {}
    for m in below:
        if m not in lower and any(m.startswith(t + "/") for t in targets):
            try:
                hidden[m] = opened(m, 0)
            except OSError:
                pass                      # gone or unreadable: nothing to restore
    # Targets and hidden mounts in one pass, outermost first.
    queue, covered = sorted([*targets, *hidden], key=_depth), []
    os.makedirs(scratch, exist_ok=True)
    root_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    fds.append(root_fd)

    def scratch_dir(name: str) -> str:
        # relative to an fd opened before the overlays: /tmp may be covered by then
        os.mkdir(name, dir_fd=root_fd)
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY, dir_fd=root_fd)
        fds.append(fd)
        return f"/proc/self/fd/{fd}"

    while queue:
        target = queue.pop(0)
        if target in hidden:
            if any(target.startswith(c + "/") for c in covered):
                _restore(libc, target, hidden[target])
            continue
        n = len(fds)
        upper, work = scratch_dir(f"{n}-upper"), scratch_dir(f"{n}-work")
        opts = f"lowerdir={lower.get(target) or opened(target)},upperdir={upper},workdir={work}"
        if libc.mount(b"overlay", target.encode(), b"overlay", 0, opts.encode()) == 0:
            covered.append(target)
            continue
        err = ctypes.get_errno()
        # EINVAL over locked mounts in a user namespace: cover the subdirectories instead
        # (files right in it stay shared: only when we cannot write there).
        inner = [m for m in below if m.startswith(target + "/")]
        if err != errno.EINVAL or not inner or os.access(target, os.W_OK):
            raise IsolationError(err, f"overlay over {target}: {os.strerror(err)}")
        for name in sorted(os.listdir(target)):
            child = os.path.join(target, name)
            if child not in below and os.path.isdir(child) and not os.path.islink(child):
                queue.append(child)
        queue.sort(key=_depth)
    for path, fd_path in kept:
        _check(libc.mount(fd_path.encode(), path.encode(), None, MS_BIND, None),
               f"keeping {path} shared")
    for fd in fds:
        os.close(fd)
    # Our cwd still points into the real tree: relative writes would go around the overlay.
    os.chdir(cwd)
    return covered


def probe(scratch_parent: str | None = None) -> str | None:
    """None when isolation works here, else the reason (kernel refusal, no user namespaces)."""
    import shutil
    import tempfile
    scratch = tempfile.mkdtemp(prefix="smartlaunch-probe-", dir=scratch_parent)
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:                       # pragma: no cover - runs in the forked child
            os.close(r)
            try:
                isolate(os.path.join(scratch, "s"), [])
                msg = b""
            except Exception as exc:       # report anything; the child must not return
                msg = str(exc).encode() or type(exc).__name__.encode()
            os.write(w, msg[:4000])
            os._exit(0)
        os.close(w)
        chunks = []
        while data := os.read(r, 4096):
            chunks.append(data)
        os.waitpid(pid, 0)
        why = b"".join(chunks).decode(errors="replace")
        return why or None
    finally:
        os.close(r)
        shutil.rmtree(scratch, ignore_errors=True)


def unmapped_dirs(paths, targets: list[str], uid: int, gid: int) -> list[str]:
    """Directories a non-root overlay cannot copy up (owned by an id it cannot map)."""
    bad = []
    for path in paths:
        path = os.path.realpath(path)
        root = max((t for t in targets if path == t or path.startswith(t + "/")), key=len,
                   default=None)
        if root is None:
            continue
        cur = path
        while cur != root and len(cur) > len(root):
            try:
                st = os.stat(cur)
            except OSError:
                break
            if (st.st_uid, st.st_gid) != (uid, gid) and cur not in bad:
                bad.append(cur)
            cur = os.path.dirname(cur)
    return bad


_probed: dict[tuple, str | None] = {}


def unavailable(paths=()) -> str | None:
    """Why the dry run cannot be isolated here (None: it can); paths: where the job writes."""
    key = (os.getuid(), tuple(paths))
    if key not in _probed:
        why = probe()
        if why is None and os.getuid() != 0:
            bad = unmapped_dirs(paths, overlay_targets(), os.getuid(), os.getgid())
            if bad:
                st = os.stat(bad[0])
                why = (f"{bad[0]} belongs to uid {st.st_uid} gid {st.st_gid}; the user namespace "
                       f"of a non-root overlay maps only yours, so writes below it would fail")
        _probed[key] = why
    return _probed[key]


def compile_caches(environ: Mapping[str, str],
                   made: Callable[[str], None] | None = None) -> list[str]:
    """torch.compile's cache directories as the script would use them, kept shared through
    the sandbox: only those that exist, are ours, are not links and no one else can write.
    made: first make inductor's where it is absent and its parent exists (private, one mkdir,
    which fails on anything already there, a link included), as the script's own first compile
    would make it, so that what an isolated run compiles is there for the runs after it; then
    made(path) (profile.session.Session.made_cache)."""
    inductor = environ.get("TORCHINDUCTOR_CACHE_DIR") or _inductor_default(environ)
    if made is not None and inductor:
        try:
            os.mkdir(os.path.abspath(inductor), 0o700)
        except OSError:
            pass                        # there already (checked below), or no parent to hold it
        else:
            made(os.path.abspath(inductor))
    paths = [inductor, environ.get("TRITON_CACHE_DIR")]
    out = []
    for path in paths:
        if not path:
            continue
        path = os.path.abspath(path)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() \
                and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and path not in out:
            out.append(path)
    return out


def _inductor_default(environ: Mapping[str, str]) -> str:
    """torch._inductor's default cache directory for this user and environment."""
    user = next((environ[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if environ.get(k)),
                None)
    if user is None:
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = f"uid_{os.getuid()}"
    tmp = next((environ[k] for k in ("TMPDIR", "TEMP", "TMP") if environ.get(k)
                and os.path.isdir(environ[k])), "/tmp")
    return os.path.join(tmp, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def wrap(argv: list[str], scratch: str, keep: list[str], status: str,
         python: str = sys.executable) -> list[str]:
    """argv run inside the sandbox."""
    opts = ["--scratch", scratch, "--status", status]
    for k in keep:
        opts += ["--keep", k]
    return [*python_m("smartlaunch.sandbox", python), *opts, "--", *argv]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    scratch, keep, status = "", [], ""
    while argv and argv[0] != "--":
        opt = argv.pop(0)
        val = argv.pop(0) if argv else ""
        if opt == "--scratch":
            scratch = val
        elif opt == "--keep":
            keep.append(val)
        elif opt == "--status":
            status = val
        else:
            sys.exit(f"smartlaunch sandbox: unknown option {opt}")
    cmd = argv[1:]
    if not scratch or not cmd:
        sys.exit("usage: python -m smartlaunch.sandbox --scratch DIR [--keep DIR]... "
                 "[--status FILE] -- ARGV...")
    # Opened before the overlays hide it; O_EXCL|O_NOFOLLOW: never through a link.
    report = os.fdopen(os.open(status, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                               | os.O_CLOEXEC, 0o600) if status else
                       os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), "w")
    try:
        covered, why = isolate(scratch, keep), None
    except (OSError, ValueError) as exc:
        covered, why = [], str(exc)
    with report:
        json.dump({"isolated": why is None, "covered": covered, "why": why}, report)
    if why is not None:
        print(f"smartlaunch: the dry run cannot be isolated: {why}", file=sys.stderr, flush=True)
        os._exit(97)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
