"""Data types of the topology layer. Fields NVML cannot read are None, never a guess. GPU
`index` is the CUDA ordinal this job sees; `nvml_index` the physical device (NVML, NUMA)."""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from smartlaunch.vocab import link_family, link_rank, nvlink_count


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"   # the GPU must not be used (fallen off the bus, uncorrectable ECC)


@dataclass(frozen=True)
class GPUProcess:
    pid: int
    user: str | None
    used_mib: int | None
    ours: bool = False          # started by this user/job (not a foreign tenant)


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str                   # stable identifier, e.g. "pcie_width_degraded"
    message: str                # one sentence with the numbers
    gpu: int | None = None      # GPU index, None for node-wide findings


@dataclass(frozen=True)
class GPU:
    index: int
    nvml_index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_mib: int
    memory_free_mib: int
    memory_used_mib: int
    utilization_pct: int | None = None
    processes: tuple[GPUProcess, ...] = ()
    numa_node: int = -1                   # -1: single node / unknown
    cpus: tuple[int, ...] = ()            # local CPUs intersected with sched_getaffinity
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks_active: int = 0
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages: int | None = None
    mig_mode: bool = False
    lost: bool = False                    # NVML error on the device (fallen off the bus)
    # Defaults keep older fixtures loadable:
    mig_devices: tuple[str, ...] = ()     # MIG instance UUIDs on this GPU ("MIG-..."), for visibility
    row_remap_pending: bool | None = None # Ampere+ replaced page retirement with row remapping
    row_remap_failed: bool | None = None
    nvml_error: str | None = None         # why the device is `lost`, as NVML said it
    persistence_mode: bool | None = None  # off: the driver tears down when no process holds it

    @property
    def foreign(self) -> tuple[GPUProcess, ...]:
        """Its processes this launch did not start."""
        return tuple(p for p in self.processes if not p.ours)

    @property
    def busy(self) -> bool:
        return bool(self.foreign)


@dataclass(frozen=True)
class Link:
    a: int
    b: int
    link_class: str             # "NV18", or a family of vocab.LINK_FAMILIES, or "??"
    p2p_read: bool | None = None
    p2p_write: bool | None = None
    p2p_nvlink: bool | None = None

    @property
    def family(self) -> str:
        return link_family(self.link_class)

    @property
    def p2p(self) -> bool | None:
        if self.p2p_read is None and self.p2p_write is None:
            return None
        return bool(self.p2p_read and self.p2p_write)


@dataclass(frozen=True)
class Topology:
    gpus: tuple[GPU, ...]
    links: tuple[Link, ...]                       # one per unordered pair, a < b
    hostname: str = ""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nccl_version: str | None = None
    numa_nodes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # node -> allowed CPUs
    findings: tuple[Finding, ...] = ()
    source: str = "nvml"                          # "nvml", "fake:<path>", "none"
    note: str = ""                                # e.g. why there are no GPUs

    def gpu(self, index: int) -> GPU:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def link(self, a: int, b: int) -> Link:
        if a > b:
            a, b = b, a
        for l in self.links:
            if l.a == a and l.b == b:
                return l
        raise KeyError((a, b))

    def worst_link(self, indices) -> Link | None:
        idx = sorted(indices)
        pairs = [self.link(x, y) for i, x in enumerate(idx) for y in idx[i + 1:]]
        return max(pairs, key=lambda l: (link_rank(l.link_class), -nvlink_count(l.link_class)),
                   default=None)

    def findings_for(self, index: int) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.gpu == index)

    def healthy(self, index: int) -> bool:
        return not any(f.severity == Severity.CRITICAL for f in self.findings_for(index)) \
            and not self.gpu(index).lost

    def fingerprint(self) -> str:
        """Stable across runs on an unchanged machine: UUIDs, link matrix, driver, NCCL."""
        return _digest({"uuids": [g.uuid for g in self.gpus],
                        "links": [(l.a, l.b, l.link_class, l.p2p) for l in self.links],
                        "driver": self.driver_version, "nccl": self.nccl_version})

    def hardware(self) -> str:
        """GPU models, memory and links in words, equal on alike nodes ("2× <model> (<memory>
        MiB), links NV18")."""
        if not self.gpus:
            return "no GPUs"
        kinds = Counter(f"{g.name} ({g.memory_total_mib} MiB)" for g in self.gpus)
        text = ", ".join(f"{n}× {kind}" for kind, n in kinds.items())
        links = sorted({l.link_class for l in self.links})
        return text + (f", links {'/'.join(links)}" if links else "")

    def hardware_fingerprint(self) -> str:
        """hardware() as a hash of every GPU in order and every link: equal on alike nodes."""
        return _digest({"gpus": [(g.index, g.name, g.memory_total_mib) for g in self.gpus],
                        "links": [(l.a, l.b, l.link_class) for l in self.links]})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["numa_nodes"] = {str(k): list(v) for k, v in self.numa_nodes.items()}
        for f in d["findings"]:
            f["severity"] = Severity(f["severity"]).value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Topology":
        gpus = tuple(
            GPU(**{**g, "processes": tuple(GPUProcess(**p) for p in g.get("processes", ())),
                   **{k: tuple(g.get(k, ())) for k in ("cpus", "throttle_reasons", "mig_devices")}})
            for g in d["gpus"])
        return cls(
            gpus=gpus, links=tuple(Link(**l) for l in d.get("links", ())),
            **{k: d.get(k) for k in ("driver_version", "cuda_driver_version", "nccl_version")},
            numa_nodes={int(k): tuple(v) for k, v in d.get("numa_nodes", {}).items()},
            findings=tuple(Finding(Severity(f["severity"]), f["code"], f["message"], f.get("gpu"))
                           for f in d.get("findings", ())),
            hostname=d.get("hostname", ""), source=d.get("source", "json"), note=d.get("note", ""))


def _digest(key) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cpu_only(note: str) -> Topology:
    """The machine as the launcher sees it without NVML: no GPUs, a reason why."""
    return Topology(gpus=(), links=(), source="none", note=note)


def shared_text(shared: dict[int, tuple[str, ...]]) -> str | None:
    """'GPU 0 with pid 4242 (user alice)' for the GPUs others used during a run; None if none."""
    return "; ".join(f"GPU {g} with {' and '.join(who)}" for g, who in sorted(shared.items())) \
        or None


def others_on(g, before=None) -> tuple[str, ...]:
    """'pid P (user U)' for each process on GPU g that the launch did not start and that was
    not on `before` (the same GPU when the plan was made). A pid whose user is unknown (a host
    pid seen from a container, the launch's own ranks included) is no evidence: left out."""
    known = {p.pid for p in before.processes} if before is not None else set()
    return tuple(f"pid {p.pid} (user {p.user})" for p in g.processes
                 if not p.ours and p.user is not None and p.pid not in known)
