"""Launch layer: runs a Plan. The CLI builds a LaunchContext with `api.context()` and calls
`execute(plan, ctx)`; run_loop.run drives the strategy's launcher (launch/api.py)."""
from __future__ import annotations



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
