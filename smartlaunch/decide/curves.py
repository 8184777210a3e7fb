"""Which candidate groups' all-reduce curves are measured, and which are derived.

A ring all-reduce of S bytes over N ranks moves 2(N-1)/N x S per rank, so
nccl-tests' bus bandwidth (algbw x 2(N-1)/N) is a property of the link, not of N: where every
pair of a group has the same link class as every pair of a measured group (and, without
NVLink, every GPU the same PCIe generation and width: an x8 GPU caps a PCIe ring), the
group's curve is the measured one carried over (CommCurve.for_group). Groups are taken
largest first: the largest group is the one the early sweep measures beside the dry run, and
its curve gives every smaller group of its kind. A group whose links differ, or of a kind no
measured group has, is measured. On a node where every pair is NV18 (NVSwitch) that is one
sweep whatever the number of group sizes; on pcie-4gpu-x8 (PIX pairs, NODE across, one x8
GPU) every candidate group is measured. The derivation's error against measured curves:
docs/decision.md and bench/comm_derive.py.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable

from smartlaunch.decide.words import gpu_list
from smartlaunch.profile.api import CommCurve
from smartlaunch.topology.api import Topology
from smartlaunch.vocab import link_family

Group = tuple[int, ...]


def link_kind(topology: Topology, group: Iterable[int]) -> tuple | None:
    """What a ring over `group` runs on, when every pair of it has the same link class:
    ("NV18",) over NVLink; (class, PCIe generation, width) otherwise. None when the pairs
    differ, or a link's class is unknown: such a group's curve is measured."""
    group = sorted(group)
    classes = {topology.link(a, b).link_class for a, b in itertools.combinations(group, 2)}
    if len(classes) != 1:
        return None
    cls = classes.pop()
    family = link_family(cls)
    if family == "NV":
        return (cls,)
    if family not in ("PIX", "PXB", "PHB", "NODE", "SYS"):
        return None
    pcie = {(topology.gpu(i).pcie_gen, topology.gpu(i).pcie_width) for i in group}
    return (cls, *pcie.pop()) if len(pcie) == 1 else None


def group_curves(groups: Iterable[Group], topology: Topology,
                 comm_for: Callable[[Group], CommCurve | None]) -> dict[Group, CommCurve | None]:
    """The curve of every group: measured (comm_for: the cache, else a benchmark), or derived
    from a group measured here whose link_kind is the same (CommCurve.for_group; its
    `derived_from` names the measured group). Largest groups first, so one measured group
    gives all the smaller ones of its kind; comm_for is called once per kind at most, plus
    once per group whose links are mixed."""
    out: dict[Group, CommCurve | None] = {}
    measured: dict[tuple, tuple[Group, CommCurve]] = {}  # link kind -> largest measured
    for group in sorted(dict.fromkeys(tuple(g) for g in groups), key=lambda g: (-len(g), g)):
        kind = link_kind(topology, group) if len(group) >= 2 else None
        if kind in measured:
            source, curve = measured[kind]
            out[group] = dataclasses.replace(curve.for_group(group), derived_from=source)
            continue
        curve = comm_for(group)
        out[group] = curve
        if curve is not None and kind is not None:
            measured[kind] = (group, curve)
    return out


def derived_note(topology: Topology, curves: dict[Group, CommCurve | None]) -> str:
    """One sentence naming the derived curves and the measured ones they came from, "" when
    none was derived: "all-reduce curves derived, not measured: GPUs 0,1 and GPUs 0,1,2,3
    from the curve measured on GPUs 0,...,7 (every pair NV18 in each); ..."."""
    by_source: dict[Group, list[Group]] = {}
    for group, curve in sorted(curves.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if curve is not None and curve.derived_from:
            by_source.setdefault(tuple(curve.derived_from), []).append(group)
    parts = []
    for source, targets in by_source.items():
        kind = link_kind(topology, source)
        link = f"every pair {kind[0]}" if kind else "the same links"
        if kind and len(kind) == 3 and kind[2]:
            link += f", every GPU PCIe gen {kind[1]} x{kind[2]}"
        names = " and ".join(gpu_list(g) for g in targets)
        parts.append(f"{names} from the curve measured on {gpu_list(source)} ({link} in each)")
    if not parts:
        return ""
    return ("all-reduce curves derived, not measured: " + "; ".join(parts) +
            "; a ring's bus bandwidth (algbw × 2(N−1)/N) is its links' whatever N, so the "
            "measured curve gives the others, its latency kept")
