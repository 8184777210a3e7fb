"""Launch layer: runs a Plan. `execute()` is the only entry the CLI uses."""
from __future__ import annotations

import dataclasses
import sys


def execute(plan, request, policy, topology, status=None, announce=None) -> int:
    """Run the plan to completion, holding GPU leases while it runs; return the exit code.
    status: the StatusLine a waiting launch draws on (erased before the job starts);
    announce(plan): called once the plan's GPUs are held, just before the job starts."""
    from smartlaunch.decide.plan import Strategy

    announce = announce or (lambda p: None)
    if plan.strategy == Strategy.INDEPENDENT:  # leases GPU by GPU as its queue moves
        from smartlaunch.launch.independent import run_independent
        announce(plan)
        return run_independent(plan, request, policy, topology)
    if plan.device != "cuda" or not plan.gpus:
        announce(plan)
        return _run(plan, request, policy, topology)

    from smartlaunch.launch.leases import LeaseManager
    ddp = plan.strategy == Strategy.DDP
    count = len(plan.gpus) if ddp else 1
    with LeaseManager.from_policy(policy) as leases, leases.acquire(
            topology, plan.gpus + plan.fallback_gpus, count, wait=plan.wait_for_lease,
            timeout_s=plan.wait_timeout_s,
            status=_status if status is None else None,
            progress=status.update if status is not None else None) as lease:
        if status is not None:
            status.clear()
        if not ddp and lease.gpus != plan.gpus[:1]:
            plan = dataclasses.replace(plan, gpus=lease.gpus)
        announce(plan)
        return _run(plan, request, policy, topology)


def _run(plan, request, policy, topology) -> int:
    from smartlaunch.decide.plan import Strategy
    if plan.strategy == Strategy.DDP:
        from smartlaunch.launch.ddp import run_ddp
        return run_ddp(plan, request, policy, topology)
    from smartlaunch.launch.single import run_single
    return run_single(plan, request, policy, topology)


def _status(line: str) -> None:
    print(f"smartlaunch: {line}", file=sys.stderr, flush=True)
