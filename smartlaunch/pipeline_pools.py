"""Warm processes for a cold decision (issue 15, item 7): started when the dry run starts,
used by the all-reduce benchmark's ranks and the first trial's, closed on every path.

Each warm process is a python that imports torch (~3 s of a rank's start on 2x H200,
2026-11-23) while the dry run's script sets itself up, then waits for its go (warm.py); none
touches a GPU before it. They are started only when the decision will use them: a dry run is
due (auto, at least 2 usable GPUs) and, for the group of the largest scaled candidate (the
first N usable GPUs, N = the GPU cap):
- comm: its all-reduce curve is not cached (profile.comm's ranks; gloo ranks on a fake topology);
- trial: trials are on, the script is Python, and its DDP trial is not cached (the spawner and
  its ranks start inside the trial's sandbox: profile/trial.py TrialSetup).
and only on cores to spare: each costs about one core for the seconds of its import, which a
2-core machine would take from the dry run itself (hence `cores`, counted from this process's
CPU affinity unless given).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

SPARE_CORES = 2          # left to the dry run's script and smartlaunch itself


@dataclass
class Pools:
    comm: object | None = None          # warm.WarmPool of benchmark ranks
    trial: object | None = None         # profile.trial.TrialSetup with warm ranks

    def take_comm(self):
        pool, self.comm = self.comm, None
        return pool

    def close(self) -> None:
        for pool in (self.comm, self.trial):
            if pool is not None:
                pool.close()
        self.comm = self.trial = None


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
            pools.comm = WarmPool(n, rank_base_env(environ, device_for(topology)))
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
