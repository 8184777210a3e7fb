"""Which candidate groups' all-reduce curves are measured, and which are derived: bus
bandwidth is a property of the link, not of N, so a group whose pairs share one link kind
with a measured group carries that group's curve over (largest groups measured first)."""
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
    """("NV18",) over NVLink, (class, PCIe gen, width) otherwise, where every pair has the
    same link class; None when they differ or the class is unknown."""
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
    """The curve of every group: comm_for's, or derived from a measured group of the same
    link_kind (largest first: comm_for runs once per kind, plus once per mixed group)."""
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
    """One sentence naming the derived curves and their sources, "" when none."""
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
