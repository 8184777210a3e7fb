"""The pipeline the CLI runs: policy -> topology -> profile -> decide -> (explain | launch).

Each stage is its own module with a typed result; this file only wires them, in order, and
is the one place that decides what needs measuring (a dry run only when there is a choice).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping

from smartlaunch.decide.plan import Reason
from smartlaunch.request import Request


def run(request: Request, given: set[str], environ: Mapping[str, str] = os.environ) -> int:
    plan, topology, policy = make_plan(request, given, environ)
    if request.explain == "json":
        print(plan.to_json())
        return 0
    if request.explain:
        from smartlaunch.decide.explain import render_text
        print(render_text(plan))
        return 0
    from smartlaunch.launch import execute
    return execute(plan, request, policy, topology)


def make_plan(request: Request, given: set[str], environ: Mapping[str, str]):
    from smartlaunch.decide import decide
    from smartlaunch.errors import NoFreeGPUError
    from smartlaunch.launch.prepare import prepare
    from smartlaunch.policy.enforce import apply_request
    from smartlaunch.policy.load import load_policy
    from smartlaunch.scheduler import detect
    from smartlaunch.topology import discover

    clock = _Clock()
    policy = apply_request(load_policy(request.policy_path, environ=environ), request)
    notes: list[tuple[str, str]] = []   # (reason, rule) added to the plan's reasons
    slurm = detect(environ)
    if slurm is not None and request.torchrun_args is not None:
        notes += [(n, "slurm allocation")
                  for n in slurm.fill_torchrun_args(request.torchrun_args, given)]
        request = dataclasses.replace(request, nnodes=str(request.torchrun_args.nnodes))

    clock.lap("policy")
    topology = discover(environ)
    clock.lap("topology")
    unavailable = frozenset(_leased_elsewhere(topology, policy))
    clock.lap("leases")
    # The same decision without measurements first: an impossible request (too many GPUs,
    # ddp on one GPU, a forbidden strategy) fails in milliseconds, before any dry run.
    measure = True
    try:
        decide(request, topology, policy, None, comm_for=lambda g: None, unavailable=unavailable)
    except NoFreeGPUError:
        # Every usable GPU is leased by another launch: plan as if they were free and let the
        # launcher wait for its lease (or, with --no-wait, fail naming the holders);
        # measuring on GPUs someone else holds would disturb them, so the policy's fallback
        # decides.
        notes.append(("every usable GPU is leased by another launch: no dry run; the launch "
                      "waits for its GPUs", "jobs.wait_timeout_s"))
        unavailable, measure = frozenset(), False
        decide(request, topology, policy, None, comm_for=lambda g: None, unavailable=unavailable)
    profile = _profile(request, policy, topology, environ, unavailable) if measure else None
    clock.lap("profile")
    trial = _trial_runner(request, policy, environ, topology, profile) if measure else None
    plan = decide(
        request, topology, policy, profile,
        comm_for=clock.timed("allreduce", _comm_for(topology, policy, environ, profile)),
        trial=clock.timed("trials", trial) if trial is not None else None,
        unavailable=unavailable,
    )
    clock.lap("decide")
    plan = prepare(plan, topology, policy, environ)
    clock.lap("prepare")
    if slurm is not None and slurm.gpus and len(plan.gpus) < len(slurm.gpus):
        # Admins read wasted allocations from job logs; say it in their terms.
        notes.append((f"the plan uses {len(plan.gpus)} of the {len(slurm.gpus)} GPUs Slurm "
                      f"allocated on this node; GPUs left free: "
                      f"{', '.join(f'GPU{g}' for g in plan.left_free) or 'none usable'}",
                      "slurm allocation"))
    if notes:
        plan = dataclasses.replace(
            plan, reasons=plan.reasons + tuple(Reason(text, rule) for text, rule in notes))
    return dataclasses.replace(plan, timings=clock.result()), topology, policy


class _Clock:
    """Seconds per stage, so --explain can show what the decision cost and where. Calls
    timed through `timed` (all-reduce benchmarks, trials) run inside decide(); their time is
    kept under their own name, not in decide's lap."""

    def __init__(self):
        self.t = self.t0 = time.perf_counter()
        self.laps: dict[str, float] = {}
        self.nested = 0.0                  # timed() seconds since the last lap

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + max(0.0, now - self.t - self.nested)
        self.t, self.nested = now, 0.0

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t
                self.laps[name] = self.laps.get(name, 0.0) + spent
                self.nested += spent
        return wrapper

    def result(self) -> dict[str, float]:
        out = {k: round(v, 4) for k, v in self.laps.items()}
        out["total"] = round(time.perf_counter() - self.t0, 4)
        import psutil
        try:    # the whole command so far: interpreter start-up and imports included
            out["since_process_start"] = round(time.time() - psutil.Process().create_time(), 3)
        except psutil.Error:
            pass
        return out


def _leased_elsewhere(topology, policy) -> set[int]:
    if not topology.gpus:
        return set()
    from smartlaunch.launch.leases import LeaseManager
    with LeaseManager.from_policy(policy) as leases:
        return leases.taken(topology)


def needs_profile(request: Request, topology, usable: list[int]) -> bool:
    """A dry run only pays off when auto has a real choice to make."""
    if request.strategy != "auto" or request.no_python or request.multi_node:
        return False
    if not topology.gpus:
        return False
    limit = request.max_gpus or len(usable)
    return min(limit, len(usable)) > 1 and not request.variants


def _profile(request, policy, topology, environ, unavailable):
    usable = [g.index for g in topology.gpus
              if g.index not in unavailable and not g.busy and topology.healthy(g.index)]
    if not needs_profile(request, topology, usable):
        return None
    from smartlaunch.worker_env import narrow_visible
    from smartlaunch.profile.cache import profile_entrypoint
    gpu = usable[0]

    def announce():
        print(f"smartlaunch: profiling {request.script} on GPU{gpu} (dry run, at most "
              f"{policy.dryrun.time_limit_s:.0f} s; cached afterwards)", file=sys.stderr, flush=True)
    return profile_entrypoint(request, policy, gpu=narrow_visible([gpu], environ, topology),
                              gpu_model=topology.gpu(gpu).name, environ=environ,
                              announce=announce)


def _comm_for(topology, policy, environ, profile):
    if not topology.gpus:
        return lambda group: None
    from smartlaunch.profile.comm import comm_curve
    max_bytes = None
    if profile is not None and profile.grad_bytes:
        # Only sizes up to the model's gradients matter; it keeps the benchmark short.
        max_bytes = max(1 << 20, 1 << (int(profile.grad_bytes) - 1).bit_length())

    def comm_for(group):
        return comm_curve(topology, tuple(group), policy, environ, max_bytes=max_bytes)
    return comm_for


def _trial_runner(request, policy, environ, topology, profile):
    if not policy.decision.trials or request.no_python:
        return None
    from smartlaunch.decide.trial import make_trial_runner
    from smartlaunch.profile.cache import cached_trials
    step = profile.step_time_s if profile is not None else None
    return cached_trials(make_trial_runner(request, policy, environ, expected_step_s=step),
                         request, policy, topology=topology, environ=environ)

