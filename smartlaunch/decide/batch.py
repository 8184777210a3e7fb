"""What a plan does to the global batch, for --explain and the decision line.

Under torchrun's semantics every rank runs the script's own batch, so the samples of one
optimizer step are world size × per-rank batch: DDP×2 on a 4-GPU node halves what
`--nproc-per-node 4` would give, and an LR schedule tuned for one of them is off for the other.
The per-rank batch is the dry run's (ModelProfile.batch_size, every micro-batch of a step).
"""
from __future__ import annotations

from smartlaunch.decide.api import Role, Units
from smartlaunch.decide.plan import Plan


def global_batch(plan: Plan, units: Units) -> str | None:
    """"global batch 2 × 32 = 64; --nproc-per-node 4 would give 128", "global batch = 2 × the
    per-rank batch" when the dry run did not see it, or None: independent jobs (each its own
    batch), a collective unit other than torchrun's, and one process where nothing else was
    possible."""
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
    if plan.groups:          # variants as DDP groups (pack.py): each its own world of k
        k = len(plan.groups[0].gpus)
        return (f"each variant's global batch {k} × {b} = {k * b:,}" if b is not None else
                f"each variant's global batch = {k} × the per-rank batch")
    if unit.ROLE != Role.BASELINE and not (unit.COLLECTIVE and unit.TORCHRUN):
        return None          # not torchrun's ranks: their batch is their unit's to say
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
