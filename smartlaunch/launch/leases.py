"""Per-GPU leases on a shared node: concurrent launches never get the same GPU.

Design:
- A lease IS its holder record, `gpu-<uuid>.<pid>.<random>.holder` (JSON: pid, process start
  time, boot id, uid, user, host, SLURM_JOB_ID, time), created O_EXCL|O_NOFOLLOW under a name
  nobody can predict. It lives while its process lives: a record whose process is gone (pid
  dead or a zombie, pid reused with another start time, another boot) or is not the record's
  account (uid) is stale, ignored, and removed when we may. So a SIGKILLed launcher never
  blocks a GPU, and a file made by someone else can only claim a GPU for a live process of
  that someone: what running a job does anyway, and named in every message.
- Claims are serialised by a flock on the lease DIRECTORY itself (held only for the check and
  the write, milliseconds). No lock file exists at a predictable name, so nothing another user
  pre-creates, hard-links or symlinks (`gpu-*.lock` of older versions included) is ever opened,
  locked, written or trusted: it can neither block nor hijack a GPU. A live process that holds
  the directory's flock delays claims and is named (from /proc/locks) while it does.
  (filelock 4 refuses, by design, a lock file another account owns in a sticky directory: a
  shared 1777 directory of per-GPU lock files would let the first user's file block the rest.)
- The directory is opened once with O_NOFOLLOW and pinned through its fd, so swapping it for a
  symlink after the checks changes nothing. Shared directories are created 1777 (like /tmp),
  private ones 0700; a directory that is a symlink, group/world-writable without the sticky
  bit, or owned by another non-root user is refused.
- Lease dirs are per node (/tmp or /run): another host's record has another boot id: stale.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import secrets
import socket
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import psutil

from smartlaunch.errors import NoFreeGPUError
from smartlaunch.launch.lease_holders import (
    Holder, alive, current_user, fmt_indices, leased_by, summarise,
)
from smartlaunch.launch.lease_dir import (  # noqa: F401  (re-exported: callers use leases.*)
    ENV_LEASE_DIR, LeaseDirError, _is_private_location, boot_id, lease_dir_enforced, lease_dir_for,
    open_lease_dir,
)
from smartlaunch.topology.api import Topology

_RECORD_MAX_BYTES = 64 * 1024
_STATUS_EVERY_S = 30.0
_DESCRIBE_EVERY_S = 2.0         # how often a waiter refreshes its status line
_CLAIM_WAIT_S = 2.0             # longest wait for the directory's flock before naming its holder


def _safe_name(uuid: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", uuid)


class LeaseManager:
    """Leases in one directory. `share=True` (policy jobs.share_gpus): launches that agree to
    share may hold one GPU together; an exclusive lease still excludes them."""

    def __init__(self, lease_dir: str, *, share: bool = False, private: bool | None = None,
                 poll_s: float = 0.1, create: bool = True, enforced: bool = False):
        self.lease_dir = os.path.abspath(os.path.expanduser(lease_dir))
        self.share = share
        self.poll_s = poll_s
        self._private = _is_private_location(self.lease_dir) if private is None else private
        self._dfd = open_lease_dir(self.lease_dir, private=self._private, create=create,
                                   enforced=enforced)
        self._base = f"/proc/self/fd/{self._dfd}" if os.path.isdir("/proc/self/fd") else self.lease_dir
        self._boot = boot_id()
        self._me = psutil.Process(os.getpid())
        self._my_start = self._me.create_time()
        self._claim_mutex = threading.Lock()     # flock is per open file: threads share ours

    @classmethod
    def from_policy(cls, policy) -> "LeaseManager":
        return cls(lease_dir_for(policy), share=policy.jobs.share_gpus,
                   enforced=lease_dir_enforced(policy))

    def close(self) -> None:
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1

    def __enter__(self) -> "LeaseManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- records ------------------------------------------------------------------------
    def holders(self, uuid: str, *, prune: bool = True) -> list[Holder]:
        """Live holders of one GPU (ours included); stale records are removed when we may."""
        prefix = f"gpu-{_safe_name(uuid)}."
        live = []
        for name in os.listdir(self._dfd):
            if not (name.startswith(prefix) and name.endswith(".holder")):
                continue
            h = self._read_record(name)
            if h is None:
                continue
            if alive(h, self._boot):
                live.append(h)
            elif prune:
                self._unlink(name)
        return live

    def _read_record(self, name: str) -> Holder | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._dfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            data = json.loads(os.read(fd, _RECORD_MAX_BYTES))
            h = Holder(**{k: data[k] for k in Holder.__dataclass_fields__ if k in data}, record=name)
        except (OSError, ValueError, TypeError):
            return None
        finally:
            os.close(fd)
        # A record only speaks for the account that wrote it: no forging another user's lease.
        return h if h.uid == st.st_uid else None

    def _write_record(self, uuid: str, index: int) -> str:
        return self._new_record(f"gpu-{_safe_name(uuid)}", "holder",
                                gpu_uuid=uuid, gpu_index=index, shared=self.share)

    # ---- the queue of waiting launches (for "3rd of 18 in the queue"; it orders nothing) ---
    def _write_waiter(self, candidates: Sequence[int]) -> str:
        return self._new_record("queue", "waiter", gpu_uuid="queue:" + fmt_indices(candidates))

    def _new_record(self, prefix: str, kind: str, **fields) -> str:
        """A holder or waiter record: who we are (pid + start time + boot, so a reused pid is
        never taken for us), created exclusively, never through a link."""
        rec = {"pid": os.getpid(), "create_time": self._my_start, "boot_id": self._boot,
               "uid": os.geteuid(), "user": current_user(), "host": socket.gethostname(),
               "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "time": time.time(), **fields}
        name = f"{prefix}.{os.getpid()}.{secrets.token_hex(8)}.{kind}"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=self._dfd)
        try:
            os.write(fd, json.dumps(rec).encode())
        finally:
            os.close(fd)
        return name

    def queue_position(self, mine: str) -> tuple[int, int]:
        """(1-based place of the waiter record `mine` by start of wait, live waiters)."""
        me, times = None, []
        for name in os.listdir(self._dfd):
            if not name.endswith(".waiter"):
                continue
            h = self._read_record(name)
            if h is None:
                continue
            if name == mine:
                me = h.time
            elif alive(h, self._boot):
                times.append(h.time)
            else:
                self._unlink(name)
        if me is None:
            return 0, len(times)
        return 1 + sum(t < me for t in times), 1 + len(times)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._dfd)
        except OSError:
            pass    # another user's record in a sticky dir, or already gone

    def _mine(self, h: Holder) -> bool:
        return h.is_process(os.getpid(), self._my_start)

    # ---- one GPU ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _claim(self):
        """The directory's flock, for one check-and-write; yields None, or (not held) why not."""
        with self._claim_mutex:
            deadline = time.monotonic() + _CLAIM_WAIT_S
            while True:
                try:
                    fcntl.flock(self._dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield f"waiting for the lease directory's lock, held by {self._dir_locker()}"
                        return
                    time.sleep(0.005 + 0.01 * random.random())
            try:
                yield None
            finally:
                fcntl.flock(self._dfd, fcntl.LOCK_UN)

    def _dir_locker(self) -> str:
        """Who holds the directory's flock, from /proc/locks (best effort)."""
        st = os.fstat(self._dfd)
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        try:
            with open("/proc/locks") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == inode:
                        pid = int(parts[4])
                        try:
                            user = psutil.Process(pid).username()
                        except (psutil.Error, KeyError):
                            user = ""
                        return f"pid {pid}" + (f" (user {user})" if user else "")
        except (OSError, ValueError):
            pass
        return "another process"

    def _try_gpu(self, topology: Topology, index: int, describe: bool = True) -> tuple[_Held | None, str]:
        """(held, "") or (None, why the GPU is not available; naming holders only if
        `describe`). The caller holds the claim (`_claim`)."""
        gpu = topology.gpu(index)
        if gpu.busy:
            users = sorted({f"pid {p.pid}" + (f" (user {p.user})" if p.user else "")
                            for p in gpu.processes if not p.ours})
            return None, "in use by " + " and ".join(users) + " (not a smartlaunch lease)"
        blocking = [h for h in self.holders(gpu.uuid) if not (self.share and h.shared)]
        if not blocking:
            return _Held(index, gpu.uuid, self._write_record(gpu.uuid, index)), ""
        if not describe:        # waiters retry often; naming holders is for the status line
            return None, "leased"
        others = [h for h in blocking if not self._mine(h)]
        return None, leased_by(others) if others else "leased by this launch"

    # ---- public -------------------------------------------------------------------------
    def why_taken(self, topology: Topology, candidates: Sequence[int] | None = None) -> dict[int, str]:
        """GPU index -> reason, for GPUs leased by any live launch (this one included) or busy."""
        out = {}
        indices = candidates if candidates is not None else [g.index for g in topology.gpus]
        with self._claim() as refused:
            for i in indices:
                held, why = (None, refused) if refused else self._try_gpu(topology, i)
                if held is not None:
                    self._release(held)
                else:
                    out[i] = why
        return out

    def taken(self, topology: Topology) -> set[int]:
        return set(self.why_taken(topology))

    def try_acquire(self, topology: Topology, candidates: Sequence[int], count: int = 1) -> Lease | None:
        """`count` free GPUs from candidates (in order; with sharing, least-held first), or None.
        Never holds a partial set: what it got is given back when it cannot get all."""
        lease, _ = self._attempt(topology, candidates, count)
        return lease

    def _attempt(self, topology, candidates, count, describe=True) -> tuple[Lease | None, dict[int, str]]:
        order = list(candidates)
        if self.share:
            order.sort(key=lambda i: len(self.holders(topology.gpu(i).uuid, prune=False)))
        got, why = [], {}
        with self._claim() as refused:
            if refused:
                return None, {i: refused for i in order}
            for i in order:
                held, reason = self._try_gpu(topology, i, describe)
                if held is None:
                    why[i] = reason
                    continue
                got.append(held)
                if len(got) == count:
                    return Lease(self, got), {}
            for h in got:
                self._release(h)
        return None, why

    def acquire(self, topology: Topology, candidates: Sequence[int], count: int, *, wait: bool,
                timeout_s: float, status: Callable[[str], None] | None = None,
                refresh: Callable[[], Topology] | None = None,
                cancel: Callable[[], bool] | None = None,
                progress: Callable[[str], None] | None = None) -> Lease:
        """`count` GPUs from candidates. No free GPUs: with wait, poll (calling `status` with a
        one-line message when the situation changes, and every 30 s) until timeout_s; `refresh`
        re-reads the topology so a foreign process leaving is noticed; `cancel() -> True` (a
        signal arrived) ends the wait. `progress`, given instead of status, gets the line every
        couple of seconds with the place in the queue, for a display that redraws or thins it
        (statusline.StatusLine.update). Raises NoFreeGPUError."""
        if count > len(candidates):
            raise NoFreeGPUError(f"asked for {count} GPUs but only {len(candidates)} are allowed "
                                 f"({fmt_indices(candidates)}); lower --nproc-per-node or allow more GPUs")
        start = time.monotonic()
        last_msg, last_time, next_describe = None, 0.0, start
        waiter: str | None = None       # our record in the queue, once we wait
        try:
            while True:
                waited = time.monotonic() - start
                describe = not wait or waited >= timeout_s or bool(
                    (status or progress) and time.monotonic() >= next_describe)
                lease, why = self._attempt(topology, candidates, count, describe)
                if lease is not None:
                    return lease
                summary = summarise(why)
                if not wait:
                    raise NoFreeGPUError(f"{summary}; retry later or drop --no-wait to wait up to {timeout_s:g} s")
                if cancel is not None and cancel():
                    raise NoFreeGPUError(f"interrupted while waiting for {count} free GPU(s): {summary}")
                if waited >= timeout_s:
                    raise NoFreeGPUError(f"waited {waited:.0f} s for {count} free GPU(s) of {fmt_indices(candidates)}: "
                                         f"{summary}; raise jobs.wait_timeout_s or free a GPU")
                if describe and progress:
                    if waiter is None:
                        waiter = self._write_waiter(candidates)
                    place, total = self.queue_position(waiter)
                    progress(f"waiting for {count} GPU(s) of {fmt_indices(candidates)}: "
                             f"{_ordinal(place)} of {total} in the queue; {summary}; waited "
                             f"{waited:.0f} s (at most {timeout_s:g} s)")
                elif describe and status and (summary != last_msg or time.monotonic() - last_time >= _STATUS_EVERY_S):
                    status(f"waiting for {count} free GPU(s) of {fmt_indices(candidates)}: {summary} "
                           f"({waited:.0f} s of {timeout_s:g} s)")
                    last_msg, last_time = summary, time.monotonic()
                if describe:
                    next_describe = time.monotonic() + _DESCRIBE_EVERY_S
                # jitter: fifty waiters must not retry in lockstep
                time.sleep(self.poll_s * (0.5 + random.random()))
                if refresh is not None:
                    topology = refresh()
        finally:
            if waiter is not None:
                self._unlink(waiter)

    def _release(self, held: _Held) -> None:
        self._unlink(held.record)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@dataclass
class _Held:
    index: int
    uuid: str
    record: str


class Lease:
    """GPUs held by this process. Release per GPU (the queue gives back a GPU as soon as no job
    needs it) or all at once; `absorb` adds another lease's GPUs (acquire one more).
    `on_empty(lease)`, when set, is told whenever a release or an absorb leaves it no GPU."""

    def __init__(self, manager: LeaseManager, held: list[_Held]):
        self._manager = manager
        self._held = {h.index: h for h in held}
        self.on_empty: Callable[["Lease"], None] | None = None

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(self._held)

    def absorb(self, other: "Lease") -> None:
        self._held.update(other._held)
        other._held = {}
        other._emptied()

    def release(self, gpu: int | None = None) -> None:
        for i in ([gpu] if gpu is not None else list(self._held)):
            held = self._held.pop(i, None)
            if held is not None:
                self._manager._release(held)
        self._emptied()

    def _emptied(self) -> None:
        if not self._held and self.on_empty is not None:
            self.on_empty(self)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease(gpus={self.gpus}, dir={self._manager.lease_dir!r})"


def release_job(lease_dir: str, job_id: str) -> list[str]:
    """Slurm epilog: remove the holder records of `job_id` (its processes are gone, so their
    flocks are too). Returns the removed paths."""
    mgr = LeaseManager(lease_dir, create=False)
    removed = []
    try:
        for name in os.listdir(mgr._dfd):
            h = mgr._read_record(name) if name.endswith(".holder") else None
            if h is not None and h.slurm_job_id is not None and str(h.slurm_job_id) == str(job_id):
                mgr._unlink(name)
                removed.append(os.path.join(mgr.lease_dir, name))
    finally:
        mgr.close()
    return removed
