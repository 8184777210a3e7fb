"""Across nodes: the two-level all-reduce curve and how many of the job's nodes run it.

t_k(b) = t_intra(b) + t_inter_k(b): the node's own curve over its g GPUs, plus the leader
curve over all N nodes scaled to k by the ring's traffic per node,
t_inter_k(b) = lat + (t_inter_N(b) - lat) * ((k-1)/k) / ((N-1)/N). The job on k nodes is
predicted as one DDP world of k*g ranks; every node is kept unless fewer are predicted faster
by more than MARGIN. A sweep across nodes is split over them (split_variants).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from smartlaunch.decide.cost import CostModel, predict_ddp, predict_single
from smartlaunch.decide.plan import Plan, Reason
from smartlaunch.decide.words import mb
from smartlaunch.errors import UsageError
from smartlaunch.profile.api import CommCurve, ModelProfile
from smartlaunch.request import Request

RULE_NODES = "multi-node: the all-reduce between nodes, measured"

MARGIN = 0.02


@dataclass(frozen=True)
class TwoLevelCurve:
    """The within-node curve (None for one rank per node) and the leader curve over N nodes."""
    intra: CommCurve | None
    inter: CommCurve
    per_node: int

    @property
    def nodes(self) -> int:
        return self.inter.world_size

    def inter_time(self, k: int, nbytes: float) -> float:
        if k <= 1 or nbytes <= 0:
            return 0.0
        n = self.nodes
        lat = self.inter.latency_s
        scale = ((k - 1) / k) / ((n - 1) / n)
        return lat + max(0.0, self.inter.time(nbytes) - lat) * scale

    def time(self, k: int, nbytes: float) -> float:
        intra = self.intra.time(nbytes) if self.intra is not None and self.per_node > 1 else 0.0
        return intra + self.inter_time(k, nbytes)

    def curve(self, k: int) -> CommCurve:
        """t_k as a CommCurve over the measured sizes."""
        sizes = sorted({b for b, _ in self.inter.points} |
                       ({b for b, _ in self.intra.points} if self.intra is not None else set()))
        pts = [(b, self.time(k, b)) for b in sizes]
        return CommCurve.from_points(k * self.per_node, self.inter.backend, pts,
                                     env=dict(self.inter.env))


@dataclass(frozen=True)
class NodeOption:
    nodes: int
    ranks: int
    step_s: float
    samples_per_s: float         # all ranks: ranks x per-rank batch / step (batch 1 if unknown)
    comm_s: float                # what communication adds to the step (cost model)


@dataclass(frozen=True)
class NodeChoice:
    nodes: int                   # how many of the job's nodes run it
    options: tuple[NodeOption, ...]
    text: str                    # why, with the numbers


def predict_nodes(profile: ModelProfile, curves: TwoLevelCurve, k: int,
                  model: CostModel = CostModel()) -> NodeOption:
    ranks = k * curves.per_node
    batch = profile.batch_size or 1
    if ranks == 1:
        p = predict_single(profile, model)
        return NodeOption(k, 1, p.step_s, batch / p.step_s, 0.0)
    p = predict_ddp(profile, curves.curve(k), ranks, model)
    return NodeOption(k, ranks, p.step_s, ranks * batch / p.step_s, p.comm_cost_s)


def choose_nodes(profile: ModelProfile, curves: TwoLevelCurve, *, least: int = 1,
                 allowed=lambda ranks: True, margin: float = MARGIN,
                 model: CostModel = CostModel()) -> NodeChoice:
    """All N nodes, or fewer (at least `least`, with a world size `allowed`) when predicted
    faster by more than `margin`."""
    n = curves.nodes
    options = tuple(predict_nodes(profile, curves, k, model)
                    for k in range(n, max(1, least) - 1, -1)
                    if k == n or allowed(k * curves.per_node))
    every = options[0]
    best = max(options, key=lambda o: o.samples_per_s)
    link = _link_words(curves)
    if best.nodes == n or best.samples_per_s <= every.samples_per_s * (1 + margin):
        pick = every
        why = (f"all {n} nodes: {_ranks(every.ranks)} predicted {every.samples_per_s:.3g} "
               f"samples/s (communication {every.comm_s * 1e3:.1f} ms of a "
               f"{every.step_s * 1e3:.1f} ms step over {link})")
        if best is not every:
            why += (f"; {best.nodes} node(s) would give {best.samples_per_s:.3g}, within the "
                    f"{margin:.0%} margin")
        elif len(options) > 1:
            runner_up = max(options[1:], key=lambda o: o.samples_per_s)
            why += f"; {runner_up.nodes} node(s) {runner_up.samples_per_s:.3g}"
    else:
        pick = best
        why = (f"{best.nodes} of the {n} nodes: {_ranks(best.ranks)} predicted "
               f"{best.samples_per_s:.3g} samples/s against {every.samples_per_s:.3g} on all "
               f"{n} (communication {every.comm_s * 1e3:.1f} ms of a {every.step_s * 1e3:.1f} "
               f"ms step over {link}); the other {n - best.nodes} node(s) are not used")
    return NodeChoice(pick.nodes, options, why)


def _ranks(ranks: int) -> str:
    return "one process" if ranks == 1 else f"DDP×{ranks}"


def _link_words(curves: TwoLevelCurve) -> str:
    """"the network (0.11 GB/s between nodes measured at 67.1 MB, gloo)": at the largest
    measured size."""
    inter = curves.inter
    if not inter.points:
        return f"the network ({inter.bandwidth_Bps / 1e9:.3g} GB/s between nodes, {inter.backend})"
    size, secs = inter.points[-1]
    return (f"the network ({size / secs / 1e9:.3g} GB/s between nodes measured at "
            f"{mb(size)}, {inter.backend})")


def split_variants(v: int, n: int) -> tuple[tuple[int, ...], ...]:
    """v variants over n nodes, contiguous; the first v % n nodes get one more."""
    q, r = divmod(v, n)
    starts = [k * q + min(k, r) for k in range(n + 1)]
    return tuple(tuple(range(starts[k], starts[k + 1])) for k in range(n))


@dataclass(frozen=True)
class NodeSweep:
    """--each across nodes: the first node's share as a one-node `request`, and `split`."""
    whole: Request
    request: Request
    split: tuple[tuple[int, ...], ...]

    def plan(self, local: Plan) -> Plan:
        v, n = len(self.whole.variants), len(self.split)
        counts = "/".join(str(len(s)) for s in self.split)
        why = Reason(f"{v} variants split over {n} nodes ({counts}, in order): each node runs "
                     f"its share as independent jobs of its own, as one node runs a sweep, "
                     f"with no process group between nodes; node 0 is the one that decides, "
                     f"the others are numbered as they read the plan (--rdzv-backend static: "
                     f"by --node-rank); SMARTLAUNCH_JOB_INDEX is the variant's index in the "
                     f"whole sweep", f"user: --each with "
                     f"{self.whole.nnodes_words()}")
        return dataclasses.replace(local, variants=self.whole.variants, nnodes=self.whole.nnodes,
                                   node_variants=self.split, node_index=0,
                                   reasons=local.reasons + (why,))


def sweep_across_nodes(request: Request) -> NodeSweep | None:
    """None unless a sweep across a fixed number of nodes; UsageError for a node range."""
    if not request.multi_node or not request.variants:
        return None
    lo, _, hi = request.nnodes.partition(":")
    if hi and hi != lo:
        raise UsageError(f"--each/--each-file split the variants over a fixed number of nodes, "
                         f"but {request.nnodes_words()} is a range; give --nnodes N (or "
                         f"--nnodes 1 for a separate sweep on each node)")
    split = split_variants(len(request.variants), int(lo))
    local = dataclasses.replace(request, nnodes="1", nnodes_from="",
                                variants=tuple(request.variants[i] for i in split[0]))
    return NodeSweep(request, local, split)
