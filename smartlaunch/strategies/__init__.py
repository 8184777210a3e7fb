"""Strategy units: one module per strategy (its candidates, sentences, plan fields and
launcher) implementing the protocols of decide/api.py and launch/api.py."""
from __future__ import annotations

from smartlaunch.strategies import ddp, independent, single

# Candidate order: the baseline first; --explain's candidate table lists them in this order.
REGISTRY = {unit.NAME: unit for unit in (single, ddp, independent)}
