"""Which GPUs may run the job, and the best-linked group of N of them: best worst link,
then fewest NUMA nodes, then widest PCIe lanes, best links overall, lowest indices."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from smartlaunch.policy.api import Policy
from smartlaunch.topology.api import Topology
from smartlaunch.vocab import LINK_FAMILIES, link_rank

GiB = 1024 ** 3
MiB = 1024 ** 2
MAX_COMBINATIONS = 5000   # beyond: grow a group greedily


@dataclass(frozen=True)
class Excluded:
    gpu: int
    why: str          # "busy", "unhealthy", "leased", "memory"
    text: str         # one sentence with the numbers


def gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def free_bytes(topology: Topology, index: int) -> int:
    return topology.gpu(index).memory_free_mib * MiB


def fits(topology: Topology, index: int, peak: int | None, headroom: float) -> bool:
    return peak is None or peak <= free_bytes(topology, index) * headroom


def _busy(g) -> str:
    foreign = g.foreign
    used = sum(p.used_mib or 0 for p in foreign)
    who = ", ".join(f"pid {p.pid}" + (f" ({p.user})" if p.user else "") for p in foreign[:3])
    return (f"GPU{g.index} is busy: {len(foreign)} foreign process(es) using {used} MiB "
            f"({who}{', …' if len(foreign) > 3 else ''})")


def screen(topology: Topology, policy: Policy, peak: int | None,
           unavailable: frozenset[int]) -> tuple[list[int], list[Excluded]]:
    """(usable GPU indices, the others with why), in index order."""
    d = policy.decision
    usable, excluded = [], []
    for g in sorted(topology.gpus, key=lambda g: g.index):
        i = g.index
        if d.avoid_unhealthy_gpus and not topology.healthy(i):
            msgs = [f.message for f in topology.findings_for(i) if f.severity.value == "critical"]
            why = "; ".join(msgs) or "lost from the bus (NVML error)"
            excluded.append(Excluded(i, "unhealthy", f"GPU{i} is unhealthy: {why}"))
        elif i in unavailable:      # leased, or busy (the lease manager counts both)
            why = _busy(g) if g.busy else f"GPU{i} is leased by another smartlaunch job"
            excluded.append(Excluded(i, "leased", why))
        elif d.avoid_busy_gpus and g.busy:
            excluded.append(Excluded(i, "busy", _busy(g)))
        elif not fits(topology, i, peak, d.memory_headroom):
            excluded.append(Excluded(
                i, "memory", f"GPU{i} has {gib(free_bytes(topology, i))} free; the profiled "
                f"peak {gib(peak)} needs {gib(peak / d.memory_headroom)} at "
                f"{d.memory_headroom:.2f} headroom"))
        else:
            usable.append(i)
    return usable, excluded


def jobs_per_gpu(topology: Topology, policy: Policy, gpus, peak: int | None
                 ) -> tuple[dict[int, int], str]:
    """Independent jobs allowed at once per GPU (as many peaks as fit its headroom), and a
    note where jobs.jobs_per_gpu could not be honoured."""
    want = max(1, int(policy.jobs.jobs_per_gpu))
    cap = {i: 1 for i in gpus}
    if want == 1:
        return cap, ""
    if not peak:
        return cap, f"jobs.jobs_per_gpu={want} not used: no profiled peak GPU memory shows two jobs fit"
    notes = []
    for i in gpus:
        usable = free_bytes(topology, i) * policy.decision.memory_headroom
        cap[i] = max(1, min(want, int(usable // peak)))
        if cap[i] < want:
            notes.append(f"GPU {i} takes {cap[i]} job(s): {want} x {peak / GiB:.2f} GiB peak > "
                         f"{usable / GiB:.2f} GiB usable")
    return cap, "; ".join(notes)


def numa_nodes(topology: Topology, group) -> int:
    return len({topology.gpu(i).numa_node for i in group})


def link_allowed(topology: Topology, group, families: tuple[str, ...]) -> bool:
    return all(topology.link(a, b).family in families
               for a, b in itertools.combinations(sorted(group), 2))


def group_key(topology: Topology, group) -> tuple:
    worst = topology.worst_link(group)
    pairs = [topology.link(a, b) for a, b in itertools.combinations(sorted(group), 2)]
    nv = worst.link_class[2:] if worst and worst.link_class[2:].isdigit() else "0"
    narrow = 0 if worst and worst.link_class.startswith("NV") else -pcie_lanes(topology, group)
    return (link_rank(worst.link_class) if worst else 0, -int(nv),
            numa_nodes(topology, group), narrow,
            sum(link_rank(p.link_class) for p in pairs), tuple(sorted(group)))


def pcie_lanes(topology: Topology, group) -> int:
    """The narrowest PCIe link width in the group (0 where NVML did not say)."""
    widths = [topology.gpu(i).pcie_width for i in group]
    return min(widths, default=0) if all(widths) else 0


def best_group(topology: Topology, candidates: list[int], n: int,
               families: tuple[str, ...]) -> tuple[int, ...] | None:
    """The best-linked allowed group of n GPUs among candidates, or None."""
    if n > len(candidates):
        return None
    if n == 1:
        return (candidates[0],)
    pool = sorted(candidates)
    if math.comb(len(pool), n) <= MAX_COMBINATIONS:
        groups = (g for g in itertools.combinations(pool, n) if link_allowed(topology, g, families))
        return min(groups, key=lambda g: group_key(topology, g), default=None)
    return _greedy(topology, pool, n, families)


def _greedy(topology: Topology, pool: list[int], n: int, families) -> tuple[int, ...] | None:
    best = None
    for seed in pool:
        group = [seed]
        while len(group) < n:
            options = [g for g in pool if g not in group
                       and link_allowed(topology, (*group, g), families)]
            if not options:
                break
            group.append(min(options, key=lambda g: group_key(topology, (*group, g))))
        if len(group) == n and (best is None
                                or group_key(topology, group) < group_key(topology, best)):
            best = tuple(sorted(group))
    return best


ALL_FAMILIES = LINK_FAMILIES


def family_link(topology: Topology, group) -> str | None:
    """The worst link class inside the group, None for fewer than 2 GPUs."""
    if not group or len(group) < 2:
        return None
    worst = topology.worst_link(group)
    return worst.link_class if worst else None


def gpu_list_short(gpus) -> str:
    gpus = tuple(gpus)
    return ("GPU" + ",".join(str(g) for g in gpus)) if gpus else "none"
