"""No trace: the dry run and trials run in a private mount namespace where every writable
directory tree is a copy-on-write overlay.

    python -m smartlaunch.sandbox --scratch DIR [--keep DIR]... [--status FILE] -- ARGV...

Before exec'ing ARGV: unshare a mount namespace (and a user namespace when not root, mapping
our own uid/gid only), make every mount private, then mount an overlayfs over
  - every writable mount of a real filesystem (NFS, ext4, xfs, tmpfs /tmp, ...), and
  - each top-level directory of the root filesystem (/home, /root, /tmp, /work, /opt, ...),
except /proc, /sys, /dev (GPU device nodes, /dev/shm for DataLoader and NCCL) and /run.
Mounts below a covered directory (a container's driver libraries, a dataset) are bound back
read-only on top of it, outermost first (_restore).
Writes land in <scratch>/<n>/upper, which the parent deletes afterwards; the real files are
never written. The --keep directories (where the child reports its result, and torch.compile's
cache: compile_caches) are bind-mounted back on top, so they alone are shared. The namespace, and the overlays with it, vanish with
the last process inside.

Limits: directories under /dev, /dev/shm and /run are shared; a filesystem the kernel cannot
use as an overlay lower layer (some FUSE and parallel filesystems) makes the whole isolation
fail, which `dryrun.isolation: require` turns into "no dry run"; network side effects
(uploads, a tracker's server) are not contained, hence the tracker variables in DRYRUN_ENV.

`probe()` does the same set-up in a forked child that exits at once, so smartlaunch can say
before profiling whether isolation is possible on this machine.
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
from collections.abc import Mapping

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


def overlay_targets(mountinfo: str | None = None, root_entries: list[str] | None = None) -> list[str]:
    """Directories to cover, parents before children (module docstring)."""
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
            if name in SHARED_TOP or path in mounts or os.path.islink(path) or not os.path.isdir(path):
                continue
            out.append(path)
    # a mount below a covered path must be covered after it (it reappears through the overlay)
    return sorted(set(out), key=lambda p: (p.count("/"), p))


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


def _opened_any(path: str, fds: list[int]) -> str:
    """An O_PATH handle on a file or directory, as a path that outlives the overlays."""
    fd = os.open(path, os.O_PATH)
    fds.append(fd)
    return f"/proc/self/fd/{fd}"


def _restore(libc, path: str, handle: str) -> None:
    """Bind one mount an overlay hid back onto its own path, read-only: shared with the real
    system as /dev and /proc are (drivers, datasets on their own filesystems are what the job
    reads), and never written (a writable one, such as a container's /etc/hosts or a FUSE
    home, cannot be covered by an overlay). Not recursive: each hidden mount is bound in its
    own turn, so a target below it is covered after it."""
    _check(libc.mount(handle.encode(), path.encode(), None, MS_BIND, None),
           f"restoring the mount at {path}")
    _check(libc.mount(None, path.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None),
           f"making the restored mount at {path} read-only")


def isolate(scratch: str, keep: list[str]) -> list[str]:
    """Enter the namespace and mount the overlays (module docstring); returns what is covered.
    Raises IsolationError naming the first step the kernel refused."""
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
    # Open every lower, upper and kept directory after unshare (layers
    # must belong to this namespace) and before the first overlay hides its path.
    fds = []

    def opened(path: str, nofollow: int = 0) -> str:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | nofollow)
        fds.append(fd)
        return f"/proc/self/fd/{fd}"

    kept = [(os.path.realpath(k), opened(k, os.O_NOFOLLOW)) for k in keep]
    below = [m for m in _mount_points() if m != "/"]
    # Every layer and every mount below a target is opened before the first overlay: an
    # overlay shows its lower filesystem without the mounts on it, so once /usr is covered
    # the path /usr/lib/.../libcuda.so.1 no longer reaches the driver library a container
    # runtime bind-mounted there (the isolated dry run would then run on the CPU without a
    # word), and a nested target opened late would get the empty directory under its own mount.
    lower = {t: opened(t) for t in targets}
    hidden = {}
    for m in below:
        if m not in lower and any(m.startswith(t + "/") for t in targets):
            try:
                hidden[m] = _opened_any(m, fds)
            except OSError:
                pass                      # gone or unreadable: nothing to restore
    # Targets and hidden mounts in one pass, outermost first: an overlay covers its mounts,
    # each is bound back after it, and a target below a restored mount is covered after that.
    queue, covered = sorted([*targets, *hidden], key=_depth), []
    os.makedirs(scratch, exist_ok=True)
    root_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    fds.append(root_fd)

    def scratch_dir(name: str) -> str:
        # relative to an fd opened before the overlays: /tmp may be covered by then, and a
        # copy-up of a directory owned by an unmapped id fails (EOVERFLOW)
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
        # In a user namespace the kernel refuses to mount over a directory with (locked)
        # mounts below it (EINVAL): cover its subdirectories instead. Files right in it stay
        # shared, harmless only when we cannot write there.
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
    """Directories a non-root overlay cannot copy up (owned by an id our user namespace cannot
    map): a write below one fails in the dry run with EOVERFLOW, so isolation is refused."""
    bad = []
    for path in paths:
        path = os.path.realpath(path)
        root = max((t for t in targets if path == t or path.startswith(t + "/")), key=len, default=None)
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


# Probing costs a fork and ~15 overlay mounts (0.17 s here); the dry run and each trial ask.
_probed: dict[tuple, str | None] = {}


def unavailable(paths=()) -> str | None:
    """Why the dry run cannot be isolated here (None: it can). paths: where the job writes
    that we know of (cwd, the script's directory, $HOME)."""
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


def compile_caches(environ: Mapping[str, str]) -> list[str]:
    """torch.compile's caches as the script would use them: TORCHINDUCTOR_CACHE_DIR, else
    torch's default <temp dir>/torchinductor_<user> (inductor keeps its Triton kernels below
    it), and TRITON_CACHE_DIR where set. Kept shared through the sandbox, so that the launch
    and the trials after the dry run find what it compiled instead of compiling again (the
    caches are keyed by the code, the torch build and the device). Only a directory that
    exists already, is ours, is not a link, and no one else can write: one that is not there
    is not made, and the dry run's compile then goes with its overlay."""
    paths = [environ.get("TORCHINDUCTOR_CACHE_DIR") or _inductor_default(environ),
             environ.get("TRITON_CACHE_DIR")]
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
    """argv run inside the sandbox (see main)."""
    opts = ["--scratch", scratch, "--status", status]
    for k in keep:
        opts += ["--keep", k]
    return [python, "-m", "smartlaunch.sandbox", *opts, "--", *argv]


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
    # Opened before the overlays hide where it lives. A new file in the caller's own temp dir
    # (mkdtemp): O_EXCL|O_NOFOLLOW, so nothing there is truncated or written through a link.
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
