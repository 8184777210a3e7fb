"""Pair links from NVML: the `nvidia-smi topo -m` class and P2P status of every GPU pair. Active
NVLinks override the PCIe common-ancestor level, as in nvidia-smi."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from smartlaunch.topology.api import Link
from smartlaunch.topology.cpus import sysfs_bus_id
from smartlaunch.topology.nvcalls import DeviceLost
from smartlaunch.vocab import UNKNOWN_LINK

# nvmlGpuTopologyLevel_t -> nvidia-smi vocabulary.
LEVEL_CLASS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_P2P_READ, _P2P_WRITE, _P2P_NVLINK = 0, 1, 2
_P2P_OK = 0
_MAX_LINKS_FALLBACK = 18        # nvidia-ml-py before NVML_NVLINK_MAX_LINKS grew to 36


@dataclass
class NvlinkPorts:
    """Where one GPU's active NVLinks go: to another GPU (by bus id) or into NVSwitches."""
    active: int = 0
    peers: Counter = field(default_factory=Counter)   # bus id -> links to that GPU
    switch: int = 0                                   # links to anything not a GPU: NVSwitch
    remote_known: bool = True

    @classmethod
    def read(cls, c, handle, gpu_buses: set[str]) -> "NvlinkPorts":
        ports = cls()
        fail = object()
        for link in range(getattr(c.nvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS_FALLBACK)):
            state = c.get("nvmlDeviceGetNvLinkState", handle, link, default=fail)
            if state is fail:
                break                        # past the last link, or no NVLink at all
            if state != 1:
                continue
            ports.active += 1
            remote = c.get("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            bus = getattr(remote, "busId", None) if remote is not None else None
            if bus is None:
                ports.remote_known = False
                continue
            bus = sysfs_bus_id(bus.decode() if isinstance(bus, bytes) else str(bus))
            if bus in gpu_buses:
                ports.peers[bus] += 1
            else:
                ports.switch += 1
        return ports


def nvlink_count(a, b, p2p_nvlink: bool | None) -> int:
    """Links between GPUs a and b (_Device objects): direct ones plus, when both hang off
    NVSwitches, as many as the thinner side has (nvidia-smi shows NV18 for every HGX pair)."""
    pa, pb = a.nvlink, b.nvlink
    if not (pa.active and pb.active):
        return 0
    if pa.remote_known and pb.remote_known:
        direct = pa.peers.get(sysfs_bus_id(b.pci_bus_id), 0)
        switched = min(pa.switch, pb.switch)
        return direct + switched
    return min(pa.active, pb.active) if p2p_nvlink is not False else 0


def read_links(c, devices: Sequence[Any]) -> list[Link]:
    """One Link per unordered pair of `devices` (in CUDA ordinal order), a < b."""
    return [Link(i, j, UNKNOWN_LINK) if a.error or b.error else _pair(c, i, j, a, b)
            for i, a in enumerate(devices) for j, b in enumerate(devices) if j > i]


def _pair(c, i: int, j: int, a, b) -> Link:
    try:
        level = c.get("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
        status = [c.get("nvmlDeviceGetP2PStatus", a.handle, b.handle, k)
                  for k in (_P2P_READ, _P2P_WRITE, _P2P_NVLINK)]
    except DeviceLost:
        return Link(i, j, UNKNOWN_LINK)
    read, write, nvlink = (None if s is None else s == _P2P_OK for s in status)
    n = nvlink_count(a, b, nvlink)
    cls = f"NV{n}" if n else LEVEL_CLASS.get(level, UNKNOWN_LINK)
    return Link(i, j, cls, p2p_read=read, p2p_write=write, p2p_nvlink=nvlink)
