"""Per-GPU leases on a shared node: concurrent launches never get the same GPU.

A lease IS its holder record `gpu-<uuid>.<pid>.<random>.holder` (lease_records.py: live while
its writer holds an OFD write lock, so a dead launch never blocks a GPU). "Claim, then check":
a launch publishes its locked record, then lists the GPU's live records and backs off on a
conflict; of two claims the later sees the earlier, so both may back off but never both keep a
GPU. Only names of the record forms are ever opened; a record that does not parse leases
nothing and is named once. `queue.<pid>.<random>.waiter` records only tell a waiter its place.
"""
from __future__ import annotations

import os
import random
import re
import socket
import sys
import threading
import time
from typing import Callable, Sequence

import psutil

from smartlaunch.errors import NoFreeGPUError
from smartlaunch.launch.lease_holders import (
    Holder, current_user, fmt_indices, leased_by, summarise,
)
from smartlaunch.launch.lease_dir import (  # noqa: F401  (re-exported: callers use leases.*)
    ENV_LEASE_DIR, LeaseDirError, absolute_lease_dir, boot_id, lease_dir_enforced, lease_dir_for, open_lease_dir,
)
from smartlaunch.launch.lease_records import (
    LockingUnsupported, Published, Record, inspect, publish, withdraw,
)
from smartlaunch.topology.api import Topology

_STATUS_EVERY_S = 30.0
_DESCRIBE_EVERY_S = 2.0         # how often a waiter refreshes its status line
_CLAIM_TRIES = 6                # claims of one GPU that met another before we call it leased
_BACKOFF_S = 0.002              # first backoff after a conflict; doubles with each try
_HOLDER = re.compile(r"gpu-(?P<gpu>[A-Za-z0-9._-]+)\.(?P<pid>[0-9]+)\.[0-9a-f]+\.holder")
_WAITER = re.compile(r"queue\.(?P<pid>[0-9]+)\.[0-9a-f]+\.waiter")

# Bad records already named in this process, by directory; past _NAMED_MAX one line says the
# rest go unnamed (a thousand planted files must not make a thousand lines).
_named: dict[str, set[str]] = {}
_named_lock = threading.Lock()
_NAMED_MAX = 20


def _safe_name(uuid: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", uuid)


def _fits(h: Holder, m: re.Match) -> bool:
    """The record's text is for the GPU (or the queue) and the pid its name says."""
    where = _safe_name(h.gpu_uuid) == m["gpu"] if "gpu" in m.re.groupindex \
        else h.gpu_uuid.startswith("queue:")
    return where and h.pid == int(m["pid"])


def _in_use(gpu) -> str:
    users = sorted({f"pid {p.pid}" + (f" (user {p.user})" if p.user else "")
                    for p in gpu.foreign})
    return "in use by " + " and ".join(users) + " (not a smartlaunch lease)"


def _say(line: str) -> None:
    print(f"smartlaunch: {line}", file=sys.stderr, flush=True)


class LeaseManager:
    """Leases in one directory. share (jobs.share_gpus): sharing launches may hold one GPU
    together. busy_ok (decision.avoid_busy_gpus false): a GPU that runs processes other than
    smartlaunch's may be leased, as the plan may have put the job there. `say` gets one line
    per record that does not parse."""

    def __init__(self, lease_dir: str, *, share: bool = False, private: bool | None = None,
                 poll_s: float = 0.1, create: bool = True, enforced: bool = False,
                 say: Callable[[str], None] | None = None, busy_ok: bool = False):
        self.lease_dir = absolute_lease_dir(lease_dir)
        self.share = share
        self.busy_ok = busy_ok
        self.poll_s = poll_s
        self._say = say or _say
        self._dfd = open_lease_dir(self.lease_dir, private=private, create=create,
                                   enforced=enforced)
        self._boot = boot_id()
        self._my_start = psutil.Process(os.getpid()).create_time()
        self._holding: set[str] = set()     # our holder records not yet given back
        self._closing = False

    @classmethod
    def from_policy(cls, policy, say: Callable[[str], None] | None = None) -> "LeaseManager":
        return cls(lease_dir_for(policy), share=policy.jobs.share_gpus,
                   enforced=lease_dir_enforced(policy), say=say,
                   busy_ok=not policy.decision.avoid_busy_gpus)

    def close(self) -> None:
        """Close the directory, at once or once the last Lease still held is released."""
        self._closing = True
        if self._dfd >= 0 and not self._holding:
            os.close(self._dfd)
            self._dfd = -1

    def __enter__(self) -> "LeaseManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def holders(self, uuid: str, *, prune: bool = True) -> list[Holder]:
        """Live holders of one GPU (ours included); stale records are removed when we may."""
        return self._live(_HOLDER, prune, gpu=_safe_name(uuid))

    def _live(self, pattern: re.Pattern, prune: bool, gpu: str | None = None) -> list[Holder]:
        """Live holders named as `pattern` says (of GPU `gpu`, or all); stale ones pruned."""
        live = []
        for rec in self._scan(pattern, gpu):
            if rec.stale:
                if prune:
                    self._unlink(rec.name)
            elif rec.live and rec.holder is not None:
                live.append(rec.holder)
        return live

    def _scan(self, pattern: re.Pattern, gpu: str | None = None) -> list[Record]:
        """Every entry named as `pattern` says, read; one that does not parse is named once."""
        out = []
        for name in os.listdir(self._dfd):
            m = pattern.fullmatch(name)
            if m is None or (gpu is not None and m["gpu"] != gpu):
                continue
            rec = inspect(self._dfd, name)
            if rec is None:
                continue
            if rec.holder is not None and not _fits(rec.holder, m):
                rec = rec._replace(holder=None, problem="its fields gpu_uuid and pid do not "
                                                        "match its name")
            if rec.problem:
                self._name_once(rec)
            out.append(rec)
        return out

    def _name_once(self, rec: Record) -> None:
        with _named_lock:
            seen = _named.setdefault(self.lease_dir, set())
            if rec.name in seen or len(seen) > _NAMED_MAX:
                return
            seen.add(rec.name)
            more = len(seen) > _NAMED_MAX
        if more:
            self._say(f"ignoring more lease records in {self.lease_dir} that do not parse, "
                      f"without naming them (`ls -la {self.lease_dir}` lists them)")
            return
        owner = "owner unknown" if rec.owner is None else f"owner uid {rec.owner}"
        self._say(f"ignoring lease record {rec.name} in {self.lease_dir} ({owner}): "
                  f"{rec.problem}; it leases nothing")

    def _publish(self, prefix: str, kind: str, **fields) -> Published:
        """Our holder or waiter record, live (locked) from the moment it is listed."""
        rec = {"pid": os.getpid(), "create_time": self._my_start, "boot_id": self._boot or None,
               "uid": os.geteuid(), "user": current_user(), "host": socket.gethostname(),
               "slurm_job_id": os.environ.get("SLURM_JOB_ID") or None, "time": time.time(),
               **fields}
        try:
            return publish(self._dfd, prefix, kind, rec)
        except LockingUnsupported as exc:
            raise LeaseDirError(f"lease directory {self.lease_dir} cannot hold file locks "
                                f"({exc.strerror}); set paths.lease_dir (or {ENV_LEASE_DIR}) "
                                "to a directory on a local filesystem such as /tmp") from None
        except OSError as exc:
            raise LeaseDirError(f"cannot write a lease record in {self.lease_dir}: "
                                f"{exc.strerror}; free space there or set paths.lease_dir (or "
                                f"{ENV_LEASE_DIR}) to a usable directory") from None

    def queue_position(self, mine: str) -> tuple[int, int]:
        """(1-based place of the waiter record `mine` by start of wait, live waiters)."""
        waiters = self._live(_WAITER, prune=True)
        me = next((h.time for h in waiters if h.record == mine), None)
        times = [h.time for h in waiters if h.record != mine]
        if me is None:
            return 0, len(times)
        return 1 + sum(t < me for t in times), 1 + len(times)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._dfd)
        except OSError:
            pass    # another user's record in a sticky dir, or already gone

    def _mine(self, h: Holder) -> bool:
        return h.uid == os.geteuid() and h.pid == os.getpid()

    def _blocking(self, uuid: str) -> list[Holder]:
        """Live records of the GPU a lease of ours may not share it with."""
        return [h for h in self.holders(uuid) if not (self.share and h.shared)]

    def _why(self, blocking: list[Holder], describe: bool) -> str:
        if not describe:        # waiters retry often; naming holders is for the status line
            return "leased"
        others = [h for h in blocking if not self._mine(h)]
        return leased_by(others) if others else "leased by this launch"

    def _try_gpu(self, topology: Topology, index: int,
                 describe: bool = True) -> tuple[Published | None, str]:
        """(our holder record, "") or (None, why not; naming holders only if `describe`)."""
        gpu = topology.gpu(index)
        if gpu.busy and not self.busy_ok:
            return None, _in_use(gpu)
        blocking: list[Holder] = []
        for attempt in range(_CLAIM_TRIES):
            blocking = self._blocking(gpu.uuid)
            if blocking:
                break
            rec = self._publish(f"gpu-{_safe_name(gpu.uuid)}", "holder", gpu_uuid=gpu.uuid,
                                gpu_index=index, shared=self.share)
            blocking = [h for h in self._blocking(gpu.uuid) if h.record != rec.name]
            if not blocking:
                self._holding.add(rec.name)
                return rec, ""
            withdraw(self._dfd, rec)
            time.sleep(_BACKOFF_S * 2 ** attempt * (0.5 + random.random()))
        return None, self._why(blocking, describe)

    def why_taken(self, topology: Topology, candidates: Sequence[int] | None = None) -> dict[int, str]:
        """GPU index -> reason, for GPUs leased by any live launch (ours included) or busy."""
        out = {}
        for i in (candidates if candidates is not None else [g.index for g in topology.gpus]):
            gpu = topology.gpu(i)
            if gpu.busy and not self.busy_ok:
                out[i] = _in_use(gpu)
            elif blocking := self._blocking(gpu.uuid):
                out[i] = self._why(blocking, True)
        return out

    def taken(self, topology: Topology) -> set[int]:
        return set(self.why_taken(topology))

    def try_acquire(self, topology: Topology, candidates: Sequence[int], count: int = 1) -> Lease | None:
        """`count` free GPUs from candidates (in order; with sharing, least-held first), or
        None; never a partial set."""
        return self._attempt(topology, candidates, count)[0]

    def _attempt(self, topology, candidates, count, describe=True) -> tuple[Lease | None, dict[int, str]]:
        order = list(candidates)
        if self.share:
            order.sort(key=lambda i: len(self.holders(topology.gpu(i).uuid, prune=False)))
        got: dict[int, Published] = {}
        why = {}
        try:
            for i in order:
                rec, reason = self._try_gpu(topology, i, describe)
                if rec is None:
                    why[i] = reason
                    continue
                got[i] = rec
                if len(got) == count:
                    lease, got = Lease(self, got), {}
                    return lease, {}
        finally:        # a partial set, or a record we could not write: give back what we got
            for rec in got.values():
                self._release(rec)
        return None, why

    def acquire(self, topology: Topology, candidates: Sequence[int], count: int, *, wait: bool,
                timeout_s: float, status: Callable[[str], None] | None = None,
                refresh: Callable[[], Topology] | None = None,
                cancel: Callable[[], bool] | None = None,
                progress: Callable[[str], None] | None = None) -> Lease:
        """`count` GPUs from candidates. None free: with wait, poll until timeout_s, telling
        `status` when the situation changes (and every 30 s) or `progress` every couple of
        seconds with the place in the queue; `refresh` re-reads the topology; `cancel()` True
        ends the wait. Raises NoFreeGPUError."""
        if count > len(candidates):
            raise NoFreeGPUError(f"asked for {count} GPUs but only {len(candidates)} are allowed "
                                 f"({fmt_indices(candidates)}); lower --nproc-per-node or allow more GPUs")
        start = time.monotonic()
        last_msg, last_time, next_describe = None, 0.0, start
        waiter: Published | None = None       # our record in the queue, once we wait
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
                        waiter = self._publish("queue", "waiter",
                                               gpu_uuid="queue:" + fmt_indices(candidates))
                    place, total = self.queue_position(waiter.name)
                    progress(f"waiting for {count} GPU(s) of {fmt_indices(candidates)}: "
                             f"{_ordinal(place)} of {total} in the queue; {summary}; waited "
                             f"{waited:.0f} s (at most {timeout_s:g} s)")
                elif describe and status and (summary != last_msg or time.monotonic() - last_time >= _STATUS_EVERY_S):
                    status(f"waiting for {count} free GPU(s) of {fmt_indices(candidates)}: {summary} "
                           f"({waited:.0f} s of {timeout_s:g} s)")
                    last_msg, last_time = summary, time.monotonic()
                if describe:
                    next_describe = time.monotonic() + _DESCRIBE_EVERY_S
                time.sleep(self.poll_s * (0.5 + random.random()))
                if refresh is not None:
                    topology = refresh()
        finally:
            if waiter is not None:
                withdraw(self._dfd, waiter)

    def _release(self, rec: Published) -> None:
        withdraw(self._dfd, rec)
        self._holding.discard(rec.name)
        if self._closing:
            self.close()


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class Lease:
    """GPUs held by this process, released per GPU or all at once; `absorb` takes another
    lease's GPUs. `on_empty(lease)` is told whenever a release or an absorb leaves it none."""

    def __init__(self, manager: LeaseManager, held: dict[int, Published]):
        self._manager = manager
        self._held = held           # GPU index -> our holder record
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
            rec = self._held.pop(i, None)
            if rec is not None:
                self._manager._release(rec)
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


def release_job(lease_dir: str, job_id: str, say: Callable[[str], None] | None = None) -> list[str]:
    """Slurm epilog: remove the holder records of `job_id`, live or not, and any stale record
    we may; return the removed paths of the job's records."""
    mgr = LeaseManager(lease_dir, create=False, say=say)
    removed = []
    try:
        for rec in mgr._scan(_HOLDER):
            if rec.holder is not None and rec.holder.slurm_job_id == str(job_id):
                mgr._unlink(rec.name)
                removed.append(os.path.join(mgr.lease_dir, rec.name))
            elif rec.stale:
                mgr._unlink(rec.name)
    finally:
        mgr.close()
    return removed
