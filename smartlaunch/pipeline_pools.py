"""Warm processes for a cold decision (issue 15, item 7): started when the dry run starts,
used by the all-reduce benchmark's ranks and the first trial's, closed on every path.

Each warm process is a python that imports torch (~3 s of a rank's start on 2x H200,
2026-11-23) while the dry run's script sets itself up, then waits for its go (warm.py); none
touches a GPU before it. They are started only when the decision will use them: a dry run is
due (auto, at least 2 usable GPUs) and, for the group of the largest scaled candidate (the
first N usable GPUs, N = the GPU cap):
- comm: its all-reduce curve is not cached (profile.comm's ranks; gloo ranks on a fake topology).
  They get their go at once: `EarlySweep` measures every size while the dry run's script sets
  itself up, instead of 2.3-3.1 s after it (2x H200, 2026-11-23), and caches the curve; the
  dry run's first forward waits at its gate until the sweep has ended, so neither perturbs
  the other (the curve is reused by every later decision on the node);
- trial: trials are on, the script is Python, and its DDP trial is not cached (the spawner and
  its ranks start inside the trial's sandbox: profile/trial.py TrialSetup).
and only on cores to spare: each costs about one core for the seconds of its import, which a
2-core machine would take from the dry run itself (hence `cores`, counted from this process's
CPU affinity unless given).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from smartlaunch import proc

SPARE_CORES = 2          # left to the dry run's script and smartlaunch itself


@dataclass
class Pools:
    comm: "EarlySweep | None" = None    # the all-reduce sweep on warm benchmark ranks
    trial: object | None = None         # profile.trial.TrialSetup with warm ranks

    @property
    def gate(self) -> str | None:
        """The file the dry run's first forward waits for; None: no sweep, no gate."""
        return self.comm.gate if self.comm is not None else None

    def close(self) -> None:
        for pool in (self.comm, self.trial):
            if pool is not None:
                pool.close()
        self.comm = self.trial = None


class EarlySweep:
    """The all-reduce curve of `group` over every size, measured by a thread of ours on the
    warm `pool` from now on and cached as comm_curve caches it. `gate` is created when it ends
    (measured, failed, timed out or cancelled). `curve(group)` waits for it; `close` cancels it
    (its ranks are killed) and removes the gate: nothing is left on any path."""

    def __init__(self, pool, topology, group: tuple[int, ...], policy, environ):
        self.group, self.result, self.error, self.seconds = group, None, None, None
        self.at: tuple[int, int, int] | None = None     # (size, k, n) the ranks are at
        self.cancel, self.thread, self.dir = threading.Event(), None, None
        # The dry run waits at its gate at most this long; half its time limit is left to it.
        from smartlaunch.profile.comm import TIME_LIMIT_S
        limit = min(TIME_LIMIT_S, float(policy.dryrun.time_limit_s) / 2)
        try:
            self.dir = tempfile.mkdtemp(prefix="smartlaunch-gate-")
            proc.remove_on_exit(self.dir)
            self.gate = os.path.join(self.dir, "swept")
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
                                      time_limit_s=limit, cancel=self.cancel,
                                      progress=lambda *at: setattr(self, "at", at))
            store_comm(policy, comm_key(topology, self.group, backend_for(device), environ),
                       curve, environ)
            self.result = curve
        except Exception as exc:        # the decision measures again, as without the sweep
            self.error = exc
        finally:
            pool.close()
            self.seconds = time.perf_counter() - t0
            try:
                open(self.gate, "x").close()
            except OSError:             # closed meanwhile: no dry run is waiting any more
                pass

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

    def close(self) -> None:
        self.cancel.set()
        if self.thread is not None and self.thread.ident is not None:
            self.thread.join()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            proc.remove_on_exit(self.dir, done=True)
            self.dir = None


def start(request, policy, topology, environ, first, *, cores: int | None = None) -> Pools:
    """first: the decision's probe (decide.probe.Probe)."""
    pools = Pools()
    if first.profile_gpu is None or not first.measure or not policy.decision.prestart:
        return pools
    usable = [g.index for g in topology.gpus if g.index not in first.unavailable
              and not g.busy and topology.healthy(g.index)]
    n = min(x for x in (len(usable), request.max_gpus, policy.decision.max_gpus) if x is not None)
    if n < 2:
        return pools
    group = tuple(usable[:n])
    budget = (len(os.sched_getaffinity(0)) if cores is None else cores) - SPARE_CORES
    try:
        if budget >= n and not _comm_cached(topology, group, policy, environ):
            from smartlaunch.profile.comm import device_for, rank_base_env
            from smartlaunch.warm import WarmPool
            pool = WarmPool(n, rank_base_env(environ, device_for(topology)))
            pools.comm = EarlySweep(pool, topology, group, policy, environ)
            budget -= n
        if budget >= n and _trial_wanted(request, policy, topology, environ, group):
            from smartlaunch.profile.runner import isolation_check
            from smartlaunch.profile.trial import TrialSetup
            isolated, _ = isolation_check(request, policy, environ)
            if isolated or policy.dryrun.isolation != "require":
                pools.trial = TrialSetup(request, policy, environ, isolated, warm=n,
                                         gpus=group)
    except BaseException:
        pools.close()
        raise
    return pools


def _comm_cached(topology, group, policy, environ) -> bool:
    from smartlaunch.profile.cache import comm_key, load_comm
    from smartlaunch.profile.comm import backend_for, device_for
    key = comm_key(topology, group, backend_for(device_for(topology)), environ)
    return load_comm(policy, key, environ, need_bytes=0) is not None


def _trial_wanted(request, policy, topology, environ, group) -> bool:
    if not policy.decision.trials or request.no_python or not request.script:
        return False
    from smartlaunch.profile.cache import cached_trial
    from smartlaunch.vocab import Strategy
    return cached_trial(request, policy, topology=topology, environ=environ,
                        strategy=Strategy.DDP, gpus=group) is None
