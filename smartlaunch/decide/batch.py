"""What a plan does to the global batch (world size × the dry run's per-rank batch)."""
from __future__ import annotations

from smartlaunch.decide.api import Role, Units
from smartlaunch.decide.plan import Plan


def global_batch(plan: Plan, units: Units) -> str | None:
    """"global batch 2 × 32 = 64; --nproc-per-node 4 would give 128", or None where the
    plan has no global batch to speak of."""
    unit = units[plan.strategy]
    n = plan.nproc_per_node
    p = plan.profile
    b = p.batch_size if p is not None and p.batch_size else None
    room = min(plan.requested_max, len(plan.gpus) + len(plan.left_free)) \
        if plan.device == "cuda" else n
    lo, _, nodes = (plan.nnodes or "1").rpartition(":")
    up = lo not in ("", nodes)           # an elastic range, "1:4": the most it may give
    if unit.ROLE == Role.BASELINE and (b is None or room < 2 or plan.forced):
        return None
    if plan.groups:
        k = len(plan.groups[0].gpus)
        return (f"each variant's global batch {k} × {b} = {k * b:,}" if b is not None else
                f"each variant's global batch = {k} × the per-rank batch")
    if unit.ROLE != Role.BASELINE and not (unit.COLLECTIVE and unit.TORCHRUN):
        return None
    if nodes != "1":
        ranks = f"{'up to ' if up else ''}{nodes} nodes × {n}"
    else:
        ranks = str(n)
    if b is None or (p is not None and p.work_depends_on_world_size):
        why = (" (the script reads the world size and may divide its "
               f"{p.micro_batches} micro-batches by it)") if b is not None else ""
        return f"global batch = {ranks} × the per-rank batch{why}"
    total = n * b * (int(nodes) if nodes.isdigit() else 1)
    text = f"global batch {ranks} × {b} = {total:,}"
    if not plan.forced and nodes == "1" and room != n and room >= 2:
        text += f"; --nproc-per-node {room} would give {room * b:,}"
    return text
