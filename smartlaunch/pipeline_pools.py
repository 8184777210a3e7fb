"""Warm processes for a cold decision (issue 15, item 7): started when the dry run starts,
used by the all-reduce benchmark's ranks and the first trial's, closed on every path.

Each warm process is a python that imports torch (~3 s of a rank's start on 2x H200,
2026-11-23) while the dry run's script sets itself up, then waits for its go (warm.py); none
touches a GPU before it. They are started only when the decision will use them: a dry run is
due (auto, at least 2 usable GPUs) and, for the group of the largest scaled candidate (the
first N usable GPUs, N = the GPU cap):
- comm: its all-reduce curve is not cached (profile.comm's ranks; gloo ranks on a fake topology).
  They get their go at once and join their group; `EarlySweep` measures every size before the
  dry run's first step instead of 2.3-3.1 s after it (2x H200, 2026-11-23), and caches the curve;
- trial: trials are on, the script is Python, and its DDP trial is not cached (the spawner and
  its ranks start inside the trial's sandbox: profile/trial.py TrialSetup). They get their go
  at once too (`start_early`): the script sets itself up in them beside the dry run's and stops
  at a gate before its first forward until the decision asks (a 1.0B GPT's DDP x2 trial: 31.6 s
  after the dry run when started then, 4.2-4.7 s so; bench/results/cold-decision-2026-11-23-
  2xH200-trial-beside.md). Killed first when the job's memory runs low (`memory_low`).
and only on cores to spare: each costs about one core for the seconds of its import, which a
2-core machine would take from the dry run itself (hence `cores`, counted from this process's
CPU affinity unless given).

Order, kept by `Gate`: the trial's set-up (a DDP broadcast of every parameter), then the sweep's
sizes (its curve is reused by every later decision on the node), then the dry run's first
forward: nothing of ours runs beside its measured steps. A dry run out of GPU memory beside the
trial's ranks is run again alone (pipeline.py).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from smartlaunch import proc
from smartlaunch.profile import gate as gates

SPARE_CORES = 2          # left to the dry run's script and smartlaunch itself
READY_POLL_S = 0.02
READY_LIMIT_S = 15.0     # the least the dry run waits at its gate for the early trial
# The early trial builds the model in N more processes beside the dry run's (a 1.0B GPT: ~4 GB
# of host memory each while it is built on the CPU). Below this share of the job's memory left
# it is killed, before the kernel's OOM killer picks the dry run (or us) instead.
LOW_MEMORY = 0.10


@dataclass
class Pools:
    comm: "EarlySweep | None" = None    # the all-reduce sweep on warm benchmark ranks
    trial: object | None = None         # profile.trial.TrialSetup with warm ranks
    keeper: "Gate | None" = None        # opens the dry run's gate

    @property
    def gate(self) -> str | None:
        """The file the dry run's first forward waits for; None: no warm process, no gate."""
        return self.keeper.path if self.keeper is not None else None

    def drop_early_trial(self) -> bool:
        """Kill a trial started early (its ranks hold GPU memory); False: there was none."""
        if getattr(self.trial, "early", None) is None:
            return False
        self.trial.close()
        self.trial = None
        return True

    def close(self) -> None:
        for pool in (self.keeper, self.comm, self.trial):
            if pool is not None:
                pool.close()
        self.keeper = self.comm = self.trial = None


class Gate:
    """The dry run's gate: `path`, created by a thread of ours once the early trial's ranks
    wait at their own gate (or it died, or was killed: `_wait_trial`), then the early sweep,
    released, has ended (measured, failed, timed out or cancelled). where: a directory the dry
    run's sandbox shares (the early dry-run process's result dir); None: one of its own, which
    runner shares."""

    def __init__(self, pools: Pools, where: str | None = None):
        self.cancel, self.thread, self.owned = threading.Event(), None, where is None
        self.done = threading.Event()   # no dry run will come to the gate (a cache hit)
        self.dropped: str | None = None  # why the early trial was killed
        self.dir = tempfile.mkdtemp(prefix="smartlaunch-gate-") if where is None else where
        if self.owned:
            proc.remove_on_exit(self.dir)
        self.path = os.path.join(self.dir, "gate")
        try:
            self.thread = threading.Thread(target=self._run, args=(pools,), daemon=True,
                                           name="smartlaunch-gate")
            self.thread.start()
        except BaseException:
            self.close()
            raise

    def _run(self, pools: Pools) -> None:
        t_go = time.monotonic()
        sweep, trial = pools.comm, pools.trial      # read once: the pipeline may drop the trial
        try:
            # The sweep's ranks import torch and join their group meanwhile, but measure only
            # once the trial has set itself up (a DDP broadcast of every parameter on the same
            # GPUs): its curve is reused by every later decision on the node.
            if getattr(trial, "early", None) is not None:
                self._wait_trial(trial, t_go)
            if sweep is not None:
                sweep.release()
            while sweep is not None and sweep.thread.is_alive() and not self.cancel.is_set():
                sweep.thread.join(0.05)
        finally:
            if sweep is not None:
                sweep.release()         # nothing may wait on a hold nobody will open
            try:
                open(self.path, "x").close()
            except OSError:             # closed meanwhile: no dry run is waiting any more
                pass

    def _wait_trial(self, trial, t_go: float) -> None:
        """Until the early trial's ranks all wait at their own gate, or it died. Once the dry
        run waits at this gate, at most as long as the dry run took to get there (at least
        READY_LIMIT_S): a trial started again later costs about that much. Past it the trial
        is killed: nothing of ours may run beside the measured steps."""
        came = None
        while not (self.cancel.is_set() or trial.arrived() or not trial.alive):
            now = time.monotonic()
            if came is None and (self.done.is_set() or os.path.exists(gates.marker(self.path, 0))):
                came = now
            if came is not None and now - came > max(READY_LIMIT_S, came - t_go):
                self.dropped = "its set-up outlasted the dry run's wait"
                trial.close()
                break
            if memory_low():
                self.dropped = "host memory ran low"
                trial.close()
                break
            time.sleep(READY_POLL_S)

    def close(self) -> None:
        self.cancel.set()
        if self.thread is not None and self.thread.ident is not None:
            self.thread.join()
        if self.owned and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            proc.remove_on_exit(self.dir, done=True)
        self.dir = ""


class EarlySweep:
    """The all-reduce curve of `group` over every size, measured by a thread of ours on the
    warm `pool` from now on and cached as comm_curve caches it. `curve(group)` waits for it;
    `close` cancels it (its ranks are killed): nothing is left on any path. hold: its ranks
    join their group, then wait for `release` before the first size (a trial setting itself
    up on the same GPUs meanwhile: Gate)."""

    def __init__(self, pool, topology, group: tuple[int, ...], policy, environ, *,
                 hold: bool = False):
        self.group, self.result, self.error, self.seconds = group, None, None, None
        self.hold_dir = tempfile.mkdtemp(prefix="smartlaunch-sweep-") if hold else None
        self.hold = os.path.join(self.hold_dir, "go") if hold else None
        if hold:
            proc.remove_on_exit(self.hold_dir)
        self.at: tuple[int, int, int] | None = None     # (size, k, n) the ranks are at
        self.cancel, self.thread = threading.Event(), None
        # The dry run waits at its gate at most this long; half its time limit is left to it.
        from smartlaunch.profile.comm import TIME_LIMIT_S
        limit = min(TIME_LIMIT_S, float(policy.dryrun.time_limit_s) / 2)
        if hold:                        # a held sweep waits at most about a dry run's time
            limit += float(policy.dryrun.time_limit_s)
        try:
            self.thread = threading.Thread(
                target=self._run, args=(pool, topology, policy, dict(environ), limit),
                name="smartlaunch-early-allreduce", daemon=True)
            self.thread.start()             # from here on the thread owns the pool
        except BaseException:
            if self.thread is None or self.thread.ident is None:
                pool.close()
            self.close()
            raise

    def _run(self, pool, topology, policy, environ, limit: float) -> None:
        from smartlaunch.profile.cache import comm_key, store_comm
        from smartlaunch.profile.comm import backend_for, device_for, measure_allreduce
        t0 = time.perf_counter()
        try:
            device = device_for(topology)
            curve = measure_allreduce(self.group, device=device, environ=environ, pool=pool,
                                      time_limit_s=limit, cancel=self.cancel, gate=self.hold,
                                      progress=lambda *at: setattr(self, "at", at))
            store_comm(policy, comm_key(topology, self.group, backend_for(device), environ),
                       curve, environ)
            self.result = curve
        except Exception as exc:        # the decision measures again, as without the sweep
            self.error = exc
        finally:
            pool.close()
            self.seconds = time.perf_counter() - t0

    def curve(self, group, progress=None):
        """The measured curve when it is `group`'s; None: failed, or another group (the
        sweep has ended either way: no benchmark runs beside it). progress(size, k, n): as
        measure_allreduce's, called from this thread while it waits (a cached profile: no
        dry run held the sweep's start)."""
        shown = None
        while self.thread.is_alive():
            self.thread.join(0.1)
            if progress is not None and self.at is not None and self.at != shown:
                shown = self.at
                progress(*shown)
        return self.result if tuple(group) == self.group else None

    def release(self) -> None:
        if self.hold is not None:
            gates.open_gate(self.hold)

    def close(self) -> None:
        self.cancel.set()
        if self.thread is not None and self.thread.ident is not None:
            self.thread.join()
        if self.hold_dir:
            shutil.rmtree(self.hold_dir, ignore_errors=True)
            proc.remove_on_exit(self.hold_dir, done=True)
            self.hold_dir = None


def start(request, policy, topology, environ, first, *, cores: int | None = None,
          gate_dir: str | None = None, early_trial=None) -> Pools:
    """first: the decision's probe (decide.probe.Probe). gate_dir: where the gate goes (Gate).
    early_trial: the trial's warm ranks spawned before the parse (profile/early.py), adopted
    when they are the trial this decision would start, else killed; ours either way."""
    try:
        pools = _start(request, policy, topology, environ, first, cores, gate_dir, early_trial)
    except BaseException:
        if early_trial is not None:
            early_trial.close()
        raise
    if early_trial is not None and pools.trial is not early_trial:
        early_trial.close()
    return pools


def _start(request, policy, topology, environ, first, cores, gate_dir, early_trial) -> Pools:
    pools = Pools()
    if first.profile_gpu is None or not first.measure or not policy.decision.prestart:
        return pools
    usable = [g.index for g in topology.gpus if g.index not in first.unavailable
              and not g.busy and topology.healthy(g.index)]
    from smartlaunch.vocab import Strategy
    n = policy.decision.early_group(len(usable), request.max_gpus,
                                    request.strategy == Strategy.DDP.value)
    if n < 2:
        return pools
    group = tuple(usable[:n])
    budget = (len(os.sched_getaffinity(0)) if cores is None else cores) - SPARE_CORES
    comm = budget >= n and not _comm_cached(topology, group, policy, environ)
    isolated, trial = False, budget - n * comm >= n and _trial_wanted(
        request, policy, topology, environ, group)
    if trial:
        from smartlaunch.profile.runner import isolation_check
        isolated = isolation_check(request, policy, environ)[0]
        trial = isolated or policy.dryrun.isolation != "require"
    try:
        if comm:
            from smartlaunch.profile.comm import device_for, rank_base_env
            from smartlaunch.warm import WarmPool
            pool = WarmPool(n, rank_base_env(environ, device_for(topology)))
            pools.comm = EarlySweep(pool, topology, group, policy, environ, hold=trial)
        if trial:
            from smartlaunch.profile.trial import TrialSetup
            pools.trial = early_trial.bind(request, policy) if early_trial is not None and \
                early_trial.same(n, isolated, environ, group) else \
                TrialSetup(request, policy, environ, isolated, warm=n, gpus=group)
            pools.trial.start_early(group, environ)
        if pools.comm is not None or pools.trial is not None:
            pools.keeper = Gate(pools, gate_dir)
    except BaseException:
        pools.close()
        raise
    return pools


def _comm_cached(topology, group, policy, environ) -> bool:
    from smartlaunch.profile.cache import cached_comm
    from smartlaunch.profile.comm import backend_for, device_for
    return cached_comm(policy, topology, tuple(group), backend_for(device_for(topology)), environ,
                       need_bytes=0) is not None


def _trial_wanted(request, policy, topology, environ, group) -> bool:
    if not policy.decision.trials or request.no_python or not request.script:
        return False
    from smartlaunch.profile.cache import cached_trial
    from smartlaunch.vocab import Strategy
    return cached_trial(request, policy, topology=topology, environ=environ,
                        strategy=Strategy.DDP, gpus=group) is None



def memory_low(share: float | None = None) -> bool:
    """Is less than LOW_MEMORY of the memory this job may use left? The job's cgroup (v2:
    memory.max, a Slurm job's limit) when it sets one, else the host's."""
    import psutil
    share = LOW_MEMORY if share is None else share
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
    except (OSError, StopIteration):
        path = "/"
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), 0, -1):        # this cgroup and each parent with a limit
        base = "/sys/fs/cgroup/" + "/".join(parts[:depth])
        try:
            with open(f"{base}/memory.max") as f:
                limit = f.read().strip()
            if limit == "max":
                continue
            with open(f"{base}/memory.current") as f:
                if int(limit) - int(f.read()) < share * int(limit):
                    return True
        except (OSError, ValueError):
            continue
    m = psutil.virtual_memory()
    return m.available < share * m.total
