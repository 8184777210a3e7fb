"""CPU lists and NUMA nodes from sysfs (a parameter, for tests), and the "0-31,64-95" notation."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from smartlaunch.vocab import RangeError, format_ranges, parse_ranges

format_cpulist = format_ranges      # (0, 1, 2, 3, 8) -> '0-3,8'; () -> ''


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11). Empty or malformed text gives ()."""
    try:
        return tuple(sorted(set(parse_ranges(text))))
    except RangeError:
        return ()


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (Slurm/cgroup cpusets, taskset)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):     # not Linux
        return tuple(range(os.cpu_count() or 1))


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML writes an 8-digit PCI domain ('00000000:19:00.0'), sysfs a 4-digit one, lower case."""
    parts = nvml_bus_id.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def pci_numa_node(sysfs: str, nvml_bus_id: str) -> int | None:
    """The device's NUMA node from sysfs; -1 when the firmware gives none; None if unreadable."""
    text = _read(Path(sysfs, "bus/pci/devices", sysfs_bus_id(nvml_bus_id), "numa_node"))
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def pci_local_cpus(sysfs: str, nvml_bus_id: str) -> tuple[int, ...] | None:
    text = _read(Path(sysfs, "bus/pci/devices", sysfs_bus_id(nvml_bus_id), "local_cpulist"))
    return parse_cpulist(text) if text is not None else None


def numa_nodes(sysfs: str, allowed: Iterable[int]) -> dict[int, tuple[int, ...]]:
    """NUMA node -> the CPUs of it this process may use, nodes with none left out; without
    /sys/devices/system/node, one node 0."""
    allowed = set(allowed)
    nodes: dict[int, tuple[int, ...]] = {}
    base = Path(sysfs, "devices/system/node")
    try:
        entries = sorted(base.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        name = entry.name
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        cpus = parse_cpulist(_read(entry / "cpulist") or "")
        mine = tuple(c for c in cpus if c in allowed)
        if mine:
            nodes[int(name[4:])] = mine
    if not nodes and allowed:
        nodes[0] = tuple(sorted(allowed))
    return nodes


def bits_to_ints(words: Iterable[int], word_bits: int = 64) -> tuple[int, ...]:
    """NVML's CPU and node sets (arrays of 64-bit masks) as ints: bit k of word w is w*64+k."""
    return tuple(w * word_bits + k for w, word in enumerate(map(int, words))
                 for k in range(word.bit_length()) if word >> k & 1)
