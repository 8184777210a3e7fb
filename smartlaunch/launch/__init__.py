"""Launch layer: runs a Plan. The CLI builds a LaunchContext with `context()` and calls
`execute(plan, ctx)`; run_loop.run drives the strategy's launcher (launch/api.py)."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping


def context(request, policy, topology, *, environ: Mapping[str, str] = os.environ,
            status=None, announce: Callable | None = None):
    """The LaunchContext of one command line: what launchers need besides the Plan."""
    from smartlaunch.launch.api import LaunchContext

    def record(plan, run_dir) -> None:     # the rate that ran, for the next plan of this job
        from smartlaunch.launch.measured import record_launch
        record_launch(plan, request, policy, topology, run_dir, environ=environ)
    return LaunchContext(policy, topology, environ=environ,
                         torchrun_args=request.torchrun_args, no_wait=request.no_wait,
                         quiet=request.quiet or policy.launch.quiet, status=status,
                         announce=announce or (lambda plan: None), record=record)


def launcher(plan, ctx):
    """The Launcher of the plan's strategy (step 7 of issue 16 moves this into a registry)."""
    from smartlaunch.vocab import Strategy
    if plan.strategy == Strategy.INDEPENDENT:
        from smartlaunch.launch.independent import IndependentLauncher
        return IndependentLauncher(plan, ctx)
    if plan.strategy == Strategy.DDP:
        from smartlaunch.launch.ddp import DDPLauncher
        return DDPLauncher(plan, ctx)
    from smartlaunch.launch.single import SingleLauncher
    return SingleLauncher(plan, ctx)


def execute(plan, ctx) -> int:
    """Run the plan to completion, holding GPU leases while it runs; return the exit code."""
    from smartlaunch.launch.run_loop import run
    return run(launcher(plan, ctx), ctx)


def run_plan(plan, request, policy, topology, **ctx_args) -> int:
    """execute() for a caller holding a Request rather than a context (tests, benchmarks); a
    plan made without decide gets the request's worker command."""
    if not plan.command:
        plan = dataclasses.replace(plan, command=request.worker_command())
    return execute(plan, context(request, policy, topology, **ctx_args))
