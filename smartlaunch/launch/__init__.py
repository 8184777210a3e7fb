"""Launch layer: runs a Plan. `execute()` is the only entry the CLI uses."""
from __future__ import annotations

from smartlaunch.decide.plan import Strategy


def execute(plan, request, policy, topology) -> int:
    """Run the plan to completion; return smartlaunch's exit code."""
    if plan.strategy == Strategy.DDP:
        from smartlaunch.launch.ddp import run_ddp
        return run_ddp(plan, request, policy, topology)
    if plan.strategy == Strategy.INDEPENDENT:
        from smartlaunch.launch.independent import run_independent
        return run_independent(plan, request, policy, topology)
    from smartlaunch.launch.single import run_single
    return run_single(plan, request, policy, topology)
