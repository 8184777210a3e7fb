"""Strategy units: one module per strategy, each holding what is specific to it (its
candidates, its sentences in --explain, the fields of its plan and its launcher), behind one
registry. A layer above launch: decide/ and launch/ define the protocols (decide/api.py,
launch/api.py) and take the registry as an argument; pipeline passes REGISTRY.

Adding a strategy: its name in vocab.Strategy, its module here, one line below, its tests."""
from __future__ import annotations

from smartlaunch.strategies import ddp, independent, single

# Candidate order: single first (the baseline every speedup is relative to), then DDP, then
# independent jobs; --explain's candidate table lists them in this order.
REGISTRY = {unit.NAME: unit for unit in (single, ddp, independent)}
