"""Driving one launcher from a test: a plan built by hand (no decide, so no worker command)
plus the Request it came from, run through run_loop as the command line would."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from smartlaunch.decide.plan import Plan
from smartlaunch.launch.api import LaunchResult, context
from smartlaunch.launch.run_loop import run, run_result


def with_command(plan: Plan, request) -> Plan:
    """A plan made without decide gets the request's worker command (decide's job)."""
    return plan if plan.command else dataclasses.replace(plan, command=request.worker_command())


def run_ddp(plan: Plan, request, policy, topology) -> int:
    """The DDP launch's exit code, its message printed to stderr."""
    from smartlaunch.launch.ddp import DDPLauncher
    ctx = context(request, policy, topology)
    return run(DDPLauncher(with_command(plan, request), ctx), ctx)


def launch_ddp(plan: Plan, request, policy, topology, *,
               environ: Mapping[str, str] | None = None) -> LaunchResult:
    """The DDP launch's LaunchResult, not printed (tests read its message and details)."""
    from smartlaunch.launch.ddp import DDPLauncher
    ctx = context(request, policy, topology, environ=os.environ if environ is None else environ)
    return run_result(DDPLauncher(with_command(plan, request), ctx), ctx)


def run_independent(plan: Plan, request, policy, topology) -> int:
    """Every variant run, the summary printed to stderr; the exit code."""
    from smartlaunch.launch.independent import IndependentLauncher
    ctx = context(request, policy, topology)
    return run(IndependentLauncher(with_command(plan, request), ctx), ctx)
