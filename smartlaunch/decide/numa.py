"""NUMA bindings: which CPUs (and memory node) each local rank uses: those of the NUMA node
of the GPU it really uses, within this job's cpuset (launch/numa.py applies them)."""
from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from smartlaunch.decide.plan import NumaBinding, Plan
from smartlaunch.topology.api import Topology
from smartlaunch.topology.cpus import parse_cpulist

SINGLE_NODE_NOTE = "single NUMA node: no binding needed"


def core_groups(cpus: Sequence[int], siblings: Callable[[int], tuple[int, ...]] | None = None
                ) -> list[tuple[int, ...]]:
    """CPUs grouped by physical core (without sibling information, each CPU alone)."""
    siblings = siblings or _sysfs_siblings
    allowed, seen, groups = set(cpus), set(), []
    for c in sorted(cpus):
        if c in seen:
            continue
        group = tuple(sorted(s for s in (siblings(c) or (c,)) if s in allowed)) or (c,)
        seen.update(group)
        groups.append(group)
    return groups


def _sysfs_siblings(cpu: int) -> tuple[int, ...]:
    p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        return parse_cpulist(p.read_text()) or (cpu,)
    except OSError:
        return (cpu,)


def plan_bindings(plan: Plan, topology: Topology, mode: str, *, numactl: str | None = None,
                  siblings: Callable[[int], tuple[int, ...]] | None = None
                  ) -> tuple[NumaBinding, ...]:
    """One binding per entry of plan.gpus (local rank = position)."""
    if plan.device != "cuda" or not plan.gpus:
        return ()
    numactl = numactl if numactl is not None else (shutil.which("numactl") or "")
    nodes = {n: c for n, c in topology.numa_nodes.items() if n >= 0}
    out: list[NumaBinding] = []
    for lr, idx in enumerate(plan.gpus):
        try:
            g = topology.gpu(idx)
        except KeyError:
            out.append(NumaBinding(lr, idx, -1, (), mode, "none", f"GPU {idx} not in topology: not bound"))
            continue
        if mode == "off":
            out.append(NumaBinding(lr, idx, g.numa_node, (), mode, "none",
                                   "launch.numa_binding=off: not bound"))
            continue
        if g.numa_node < 0 or len(nodes) <= 1:
            out.append(NumaBinding(lr, idx, -1, (), mode, "none", SINGLE_NODE_NOTE))
            continue
        cpus = tuple(g.cpus or nodes.get(g.numa_node, ()))
        if not cpus:
            out.append(NumaBinding(lr, idx, g.numa_node, (), mode, "none",
                                   f"no CPU of NUMA node {g.numa_node} is allowed to this job: not bound"))
            continue
        out.append(NumaBinding(lr, idx, g.numa_node, cpus, mode, "", ""))
    if mode == "exclusive-cores":
        out = _split_cores(out, siblings)
    return tuple(_with_mechanism(b, numactl) for b in out)


def _split_cores(bindings: list[NumaBinding], siblings) -> list[NumaBinding]:
    """Ranks on one node share its cores in contiguous, disjoint groups of whole cores."""
    by_node: dict[int, list[int]] = {}
    for i, b in enumerate(bindings):
        if b.cpus:
            by_node.setdefault(b.numa_node, []).append(i)
    out = list(bindings)
    for node, members in by_node.items():
        cores = core_groups(bindings[members[0]].cpus, siblings)
        k = len(members)
        if len(cores) < k:
            for i in members:
                out[i] = dataclasses.replace(out[i], note=f"{len(cores)} cores on node {node} "
                                             f"for {k} ranks: sharing the node's CPUs")
            continue
        for j, i in enumerate(members):
            lo, hi = j * len(cores) // k, (j + 1) * len(cores) // k
            mine = tuple(c for core in cores[lo:hi] for c in core)
            out[i] = dataclasses.replace(out[i], cpus=mine,
                                         note=f"cores {hi - lo} of {len(cores)} on node {node}")
    return out


def _with_mechanism(b: NumaBinding, numactl: str) -> NumaBinding:
    if b.mechanism == "none":
        return b
    if numactl:
        mechanism, note = "numactl", f"CPUs and memory on node {b.numa_node}"
    else:
        mechanism = "sched_setaffinity"
        note = "numactl not installed: CPU affinity only, memory not bound"
    return dataclasses.replace(b, mechanism=mechanism, note=f"{b.note}; {note}" if b.note else note)
