"""Launch layer: runs a Plan. The CLI builds a LaunchContext with `api.context()` and calls
`execute(plan, ctx, units)`; run_loop.run drives the launcher the plan's strategy unit builds
(launch/api.py's Launcher protocol; the units live in smartlaunch/strategies/)."""
from __future__ import annotations


def execute(plan, ctx, units) -> int:
    """Run the plan to completion, holding GPU leases while it runs; return the exit code.
    units: the strategy units by name (strategies.REGISTRY); launch names no strategy."""
    from smartlaunch.launch.run_loop import run
    return run(units[plan.strategy].launcher(plan, ctx), ctx)
