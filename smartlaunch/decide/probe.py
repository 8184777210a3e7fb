"""What the decision needs measured, decided before anything is measured.

`probe()` runs `decide()` without measurements: an impossible request (too many GPUs, ddp on one
GPU, a forbidden strategy) fails here in milliseconds, before the lease directory is touched or a
dry run starts. When every usable GPU is leased by another launch it plans for a wait instead:
measuring on GPUs someone else holds would disturb them, so the policy's fallback decides and the
launcher waits for its lease (or, with --no-wait, fails naming the holders); the Plan carries the
reason (`Plan.wait_reason`, shown by --explain). The caller then runs the one real `decide()`
with what the probe says.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from smartlaunch.decide.api import Units
from smartlaunch.decide.decide import decide
from smartlaunch.errors import NoFreeGPUError
from smartlaunch.policy.api import Policy
from smartlaunch.request import Request
from smartlaunch.topology.api import Topology

WAIT_REASON = "every usable GPU is leased by another launch: no dry run"


@dataclass(frozen=True)
class Probe:
    unavailable: frozenset[int]        # GPUs the real decision must leave out
    measure: bool                      # False: plan for a wait, without dry run or trials
    profile_gpu: int | None            # where a dry run pays off; None: no dry run
    wait_reason: str = ""              # for decide(): why the plan expects to wait


def probe(request: Request, topology: Topology, policy: Policy, *, units: Units,
          leased: Callable[[], frozenset[int]],
          environ: Mapping[str, str] | None = None) -> Probe:
    """leased() is read only once the request is known possible (it touches the lease
    directory)."""
    def cheap(unavailable):
        decide(request, topology, policy, None, units=units, comm_for=lambda g: None,
               unavailable=unavailable, environ=environ)
    cheap(frozenset())
    unavailable = frozenset(leased())
    try:
        cheap(unavailable)
    except NoFreeGPUError:
        return Probe(frozenset(), False, None, WAIT_REASON)
    usable = [g.index for g in topology.gpus
              if g.index not in unavailable and not g.busy and topology.healthy(g.index)]
    return Probe(unavailable, True,
                 usable[0] if needs_profile(request, topology, usable, policy) else None)


def needs_profile(request: Request, topology: Topology, usable: list[int],
                  policy: Policy | None = None) -> bool:
    """A dry run only pays off when auto has a real choice to make: for variants, whether
    each may run as a DDP group of a world size the policy allows (pack.py); across a fixed
    number of nodes, how many of them to use (decide/nodes.py)."""
    if request.strategy != "auto" or request.no_python or not topology.gpus:
        return False
    if request.multi_node:
        lo, _, hi = request.nnodes.partition(":")
        return (hi or lo) == lo and not request.variants
    room = min(request.max_gpus or len(usable), len(usable))
    if request.variants:
        sizes = policy.decision.world_sizes if policy is not None else (2,)
        return any(k >= 2 and len(request.variants) * k <= room for k in sizes)
    return room > 1
