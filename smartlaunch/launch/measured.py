"""After a GPU launch: keep the slowest rank's measured step rate (profile/feedback.py) and, when
DDP ran below the policy's efficiency, say in one line what the next launch will do instead."""
from __future__ import annotations

import os
import sys

from smartlaunch.decide.plan import strategy_name
from smartlaunch.errors import SmartlaunchError
from smartlaunch.launch.progress import progress_path, read_progress
from smartlaunch.profile import feedback


def slowest_rank(run_dir: str, nproc: int) -> tuple[int, float] | None:
    """(step intervals, seconds) of the slowest rank's steady window (ProgressRecord.window),
    or None when a rank made fewer than two steps or wrote no record."""
    best = None
    for lr in range(nproc):
        rec = read_progress(progress_path(run_dir, lr))
        seen = rec.window() if rec is not None else None
        if seen is None:
            return None
        if best is None or seen[0] / seen[1] < best[0] / best[1]:
            best = seen
    return best


def record_launch(plan, request, policy, topology, run_dir: str | None, *, environ=os.environ,
                  out=None, shared: str | None = None) -> feedback.MeasuredRate | None:
    """Store the launch's rate (too short a launch stores nothing); print the advice line for
    a DDP launch below decision.min_efficiency. shared: the run's GPUs had other processes on
    them (topology.api.shared_text): its rate says as much about them as about the plan, so it
    is not kept, and one line says so. Never raises for a cache it cannot write."""
    if not run_dir or plan.device != "cuda" or not plan.gpus:
        return None
    if shared and slowest_rank(run_dir, plan.nproc_per_node) is not None:
        print(f"smartlaunch: this run shared its GPUs ({shared}): its step rate is not kept "
              f"for the next plan of this job", file=out or sys.stderr, flush=True)
        return None
    try:
        return _record(plan, request, policy, topology, run_dir, environ, out)
    except (OSError, SmartlaunchError):
        return None


def _record(plan, request, policy, topology, run_dir, environ, out):
    n = plan.nproc_per_node
    seen = slowest_rank(run_dir, n)
    if seen is None:
        return None
    profile = plan.profile.to_dict() if plan.profile is not None else {}
    if not profile:   # a forced strategy skipped the dry run; an earlier one may be cached
        from smartlaunch.profile.cache import cached_profile
        cached = cached_profile(request, policy, gpu_model=topology.gpus[0].name, environ=environ)
        profile = cached.to_dict() if cached is not None else {}
    strategy = strategy_name(plan.strategy) if n > 1 else feedback.ONE_RANK
    # the window's step ends: its intervals + 1
    rate = feedback.measured_rate(strategy, plan.gpus[:n], seen[0] + 1, seen[1], profile)
    if rate is None:
        return None
    key = feedback.job_key(request, policy, topology, environ)
    rates = feedback.load_rates(policy, key, environ)
    feedback.store_rate(policy, key, rate, environ)
    if n > 1:
        line = advice(rate, rates, profile, policy.decision.min_efficiency, plan.requested_max,
                      name=strategy_name(plan.strategy).upper())
        if line:
            print(line, file=out or sys.stderr, flush=True)
    return rate


def advice(rate, rates, profile, floor: float, allowed: int, name: str = "DDP") -> str | None:
    """name: what ran, as --explain writes a multi-rank strategy ("DDP" for ddp)."""
    base, source = feedback.one_gpu_rate(rates, profile)
    if not base:
        return None
    n = rate.nproc
    speedup = rate.rank_steps_per_s / base
    if speedup / n >= floor:
        return None
    nxt = "run on one GPU" if allowed <= n else f"not use {name}×{n}"
    assumed = ", assuming each rank did the profiled work" if rate.assumed else ""
    return (f"smartlaunch: {name}×{n} ran at {speedup:.2f}× of one GPU ({speedup / n:.0%} "
            f"efficiency, below the policy's {floor:.0%}; one GPU from {source}{assumed}); "
            f"the next launch of this job will {nxt}")
