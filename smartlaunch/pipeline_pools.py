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
READY_POLL_S = 0.02
READY_LIMIT_S = 15.0     # an import that slow is a machine too loaded to wait on


@dataclass
class Pools:
    comm: object | None = None          # warm.WarmPool of benchmark ranks
    trial: object | None = None         # profile.trial.TrialSetup with warm ranks

    def take_comm(self):
        pool, self.comm = self.comm, None
        return pool

    def pids(self) -> list[int]:
        """The warm processes' leaders (each one's session holds its ranks, if any)."""
        out = [child.pid for child, _ in getattr(self.comm, "free", ())]
        child = getattr(self.trial, "child", None)
        return out + ([child.pid] if child is not None else [])

    def wait_ready(self, limit_s: float = READY_LIMIT_S) -> float:
        """Block until every warm process (and the ranks below a trial's spawner) waits on its
        go pipe, at most limit_s; the seconds waited. Called before the dry run's first step:
        they start with it and import torch while its script sets itself up, and must not
        share the CPU with its measured steps (a starved importer is not idle: hence the
        kernel's wait channel, not CPU time)."""
        import time
        t0 = time.monotonic()
        while not all(_waiting_on_pipe(pid) for pid in _tree(self.pids())):
            if time.monotonic() - t0 >= limit_s:
                break
            time.sleep(READY_POLL_S)
        return time.monotonic() - t0

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



def _tree(pids: list[int]) -> list[int]:
    import psutil
    out = []
    for pid in pids:
        try:
            out += [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
        except psutil.Error:
            continue
    return out


def _waiting_on_pipe(pid: int) -> bool:
    """Asleep in a pipe read (the go), or gone. Where the kernel hides wait channels ("0"),
    any sleep counts."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        return True
    return state in ("Z", "X") or (state == "S" and ("pipe" in wchan or wchan in ("", "0")))
