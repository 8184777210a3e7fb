"""The real backend, the only module that touches pynvml (nvidia-ml-py), imported on first use.
`nvml=` takes any pynvml look-alike (tests). A field NVML cannot read is None; a device that errors
like a fallen-off GPU becomes a GPU with lost=True, never an exception."""
from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from smartlaunch.errors import TopologyError
from smartlaunch.topology import cpus as cpumod
from smartlaunch.topology import health
from smartlaunch.topology.api import GPU, GPUProcess, Topology
from smartlaunch.topology.links import NvlinkPorts, read_links
from smartlaunch.topology.nvcalls import ERROR_NO_PERMISSION, Calls, DeviceLost
from smartlaunch.topology.visible import (
    PhysicalGPU, resolve_visibility, visibility_findings, visibility_note,
)


class NvmlUnavailable(TopologyError):
    """No driver, no libnvidia-ml, or NVML refused to start: the machine is CPU-only to us."""

    def __init__(self, message: str, *, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


# nvmlClocksEventReason* bits.
THROTTLE_BITS = (
    (0x001, "gpu_idle"), (0x002, "applications_clocks_setting"), (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"), (0x010, "sync_boost"), (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"), (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"), (0x200, "board_limit"), (0x400, "reliability"),
)
_CLOCK_SM, _TEMPERATURE_GPU, _ECC_UNCORRECTED, _VOLATILE, _AGGREGATE = 1, 0, 1, 0, 1
_MIB = 1024 * 1024


def decode_throttle(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    names = tuple(name for bit, name in THROTTLE_BITS if mask & bit)
    unknown = mask & ~sum(bit for bit, _ in THROTTLE_BITS)
    return names + ((f"0x{unknown:x}",) if unknown else ())


@dataclass
class _Device:
    nvml_index: int
    handle: Any = None
    uuid: str = ""
    name: str = "??"
    pci_bus_id: str = ""
    mig_mode: bool = False
    mig_uuids: tuple[str, ...] = ()
    error: str | None = None                 # set when the device is lost
    nvlink: NvlinkPorts = field(default_factory=NvlinkPorts)


@dataclass
class NvmlBackend:
    nvml: Any = None                                        # pynvml or a look-alike
    sysfs: str = "/sys"
    allowed: tuple[int, ...] | None = None                  # default: sched_getaffinity
    owner: Callable[[int], tuple[str | None, bool]] | None = None   # pid -> (user, ours)

    def read(self, environ: Mapping[str, str]) -> Topology:
        nvml = _start(self.nvml)
        try:
            return self._read(Calls(nvml), environ)
        finally:
            _stop(nvml)

    def _read(self, c: Calls, environ: Mapping[str, str]) -> Topology:
        count = c.get("nvmlDeviceGetCount", default=0)
        devices = [d for d in (self._identify(c, i) for i in range(count)) if d is not None]
        physical = [PhysicalGPU(d.nvml_index, d.uuid, d.mig_uuids) for d in devices]
        vis = resolve_visibility(physical, environ)
        by_index = {d.nvml_index: d for d in devices}
        chosen = [by_index[i] for i in vis.nvml_indices]
        allowed = self.allowed if self.allowed is not None else cpumod.allowed_cpus()
        nodes = cpumod.numa_nodes(self.sysfs, allowed)
        known_buses = {cpumod.sysfs_bus_id(d.pci_bus_id) for d in devices if d.pci_bus_id}
        gpus = [self._gpu(c, pos, d, allowed, len(nodes), known_buses)
                for pos, d in enumerate(chosen)]
        links = read_links(c, chosen)
        extra = visibility_findings(vis, {d.nvml_index: d.name for d in devices}, environ)
        return Topology(
            gpus=tuple(gpus), links=tuple(links), hostname=socket.gethostname(),
            driver_version=c.get("nvmlSystemGetDriverVersion"),
            cuda_driver_version=_cuda_version(c.get("nvmlSystemGetCudaDriverVersion")),
            nccl_version=nccl_version(), numa_nodes=nodes,
            findings=health.assess(gpus, links, extra), source="nvml",
            note=visibility_note(vis, environ, len(devices)))

    def _identify(self, c: Calls, i: int) -> _Device | None:
        """Enough to apply CUDA_VISIBLE_DEVICES; None for a GPU this process may not open."""
        d = _Device(i)
        try:
            d.handle = c.nvml.nvmlDeviceGetHandleByIndex(i)
        except c.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == ERROR_NO_PERMISSION:
                return None                  # another job's GPU behind a device cgroup
            d.error = str(exc)
            return d
        try:
            d.uuid = _text(c.get("nvmlDeviceGetUUID", d.handle, default="") or "")
            d.name = _text(c.get("nvmlDeviceGetName", d.handle, default="??"))
            pci = c.get("nvmlDeviceGetPciInfo", d.handle)
            d.pci_bus_id = _text(getattr(pci, "busId", "")) if pci is not None else ""
            mode = c.get("nvmlDeviceGetMigMode", d.handle)
            d.mig_mode = bool(mode and mode[0] == 1)
            if d.mig_mode:
                d.mig_uuids = _mig_uuids(c, d.handle)
        except DeviceLost as exc:
            d.error = str(exc)
        return d

    def _gpu(self, c: Calls, pos: int, d: _Device, allowed, n_nodes: int, known_buses) -> GPU:
        base = dict(index=pos, nvml_index=d.nvml_index, uuid=d.uuid, pci_bus_id=d.pci_bus_id,
                    mig_mode=d.mig_mode, mig_devices=d.mig_uuids)
        if d.error is None:
            try:
                return GPU(**base, **self._readings(c, d, allowed, n_nodes, known_buses))
            except DeviceLost as exc:
                d.error = str(exc)
        return GPU(**base, name="??", memory_total_mib=0, memory_free_mib=0, memory_used_mib=0,
                   lost=True, nvml_error=d.error)

    def _readings(self, c: Calls, d: _Device, allowed, n_nodes: int, known_buses) -> dict:
        h = d.handle
        mem = c.get("nvmlDeviceGetMemoryInfo", h)
        node, local = self._locality(c, d, n_nodes)
        allowed_set = set(allowed)
        remap = c.get("nvmlDeviceGetRemappedRows", h)
        persistence = c.get("nvmlDeviceGetPersistenceMode", h)
        d.nvlink = NvlinkPorts.read(c, h, known_buses)
        return dict(
            _live(c, h), name=d.name,
            memory_total_mib=_mib(mem, "total"), memory_free_mib=_mib(mem, "free"),
            memory_used_mib=_mib(mem, "used"),
            processes=_processes(c, h, self.owner or _process_owner),
            numa_node=node,
            cpus=tuple(x for x in local if x in allowed_set),
            pcie_gen=c.get("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_gen_max=c.get("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_width=c.get("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_width_max=c.get("nvmlDeviceGetMaxPcieLinkWidth", h),
            nvlinks_active=d.nvlink.active,
            sm_clock_max_mhz=c.get("nvmlDeviceGetMaxClockInfo", h, _CLOCK_SM),
            ecc_volatile_uncorrected=c.get("nvmlDeviceGetTotalEccErrors", h, _ECC_UNCORRECTED,
                                           _VOLATILE),
            ecc_aggregate_uncorrected=c.get("nvmlDeviceGetTotalEccErrors", h, _ECC_UNCORRECTED,
                                            _AGGREGATE),
            retired_pages=_retired_pages(c, h),
            row_remap_pending=None if remap is None else bool(remap[2]),
            row_remap_failed=None if remap is None else bool(remap[3]),
            persistence_mode=None if persistence is None else bool(persistence),
        )

    def _locality(self, c: Calls, d: _Device, n_nodes: int) -> tuple[int, tuple[int, ...]]:
        """(NUMA node, local CPUs) by memory affinity, as `nvidia-smi topo -m` (NumaNodeId names
        the GPU's own memory node on Grace Hopper, not the CPUs near it)."""
        words = math.ceil(max(os.cpu_count() or 1, 64) / 64)
        node = None
        mask = c.get("nvmlDeviceGetMemoryAffinity", d.handle, words, 0)   # scope NODE
        if mask is not None:
            nodes = cpumod.bits_to_ints(mask)
            node = nodes[0] if len(nodes) == 1 else None
        if node is None:
            node = cpumod.pci_numa_node(self.sysfs, d.pci_bus_id)
        if n_nodes <= 1 or node is None:
            node = -1                        # one node: nothing to pin to
        affinity = c.get("nvmlDeviceGetCpuAffinity", d.handle, words)
        local = cpumod.bits_to_ints(affinity) if affinity is not None else ()
        if not local:
            local = cpumod.pci_local_cpus(self.sysfs, d.pci_bus_id) or ()
        return node, local


def _processes(c: Calls, h,
               owner: Callable[[int], tuple[str | None, bool]]) -> tuple[GPUProcess, ...]:
    procs = c.get("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None:                    # v3 symbol missing in older drivers
        procs = c.get("nvmlDeviceGetComputeRunningProcesses_v2", h) or []
    out = []
    for p in procs:
        user, ours = owner(int(p.pid))
        used = getattr(p, "usedGpuMemory", None)
        out.append(GPUProcess(int(p.pid), user, None if used is None else int(used) // _MIB, ours))
    return tuple(out)


def _live(c: Calls, h) -> dict:
    """The readings that change while a job runs: clocks, temperature, power, utilisation."""
    throttle = c.get("nvmlDeviceGetCurrentClocksEventReasons", h)
    if throttle is None:
        throttle = c.get("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    power, limit = c.get("nvmlDeviceGetPowerUsage", h), c.get("nvmlDeviceGetEnforcedPowerLimit", h)
    return dict(sm_clock_mhz=c.get("nvmlDeviceGetClockInfo", h, _CLOCK_SM),
                temperature_c=c.get("nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU),
                power_w=None if power is None else power / 1000.0,
                power_limit_w=None if limit is None else limit / 1000.0,
                utilization_pct=getattr(c.get("nvmlDeviceGetUtilizationRates", h), "gpu", None),
                throttle_reasons=decode_throttle(throttle))


def _start(nvml):
    """pynvml (or `nvml`, a look-alike) initialised; NvmlUnavailable when it cannot be."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({exc}); "
                                  f"pip install nvidia-ml-py",
                                  reason="nvidia-ml-py not installed") from exc
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML did not start: {exc}", reason=str(exc)) from exc
    return nvml


def _stop(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass


def _process_owner(pid: int) -> tuple[str | None, bool]:
    """(user, ours): ours = this process or one it started. A host pid we cannot see (container):
    unknown user, not ours."""
    import psutil
    me = os.getpid()
    try:
        p = psutil.Process(pid)
        user = p.username()
        ours = pid == me or any(a.pid == me for a in p.parents())
    except (psutil.Error, OSError):
        return None, False
    return user, ours


def _mig_uuids(c: Calls, h) -> tuple[str, ...]:
    out = []
    for k in range(c.get("nvmlDeviceGetMaxMigDeviceCount", h, default=0) or 0):
        mh = c.get("nvmlDeviceGetMigDeviceHandleByIndex", h, k)
        if mh is not None:
            uuid = c.get("nvmlDeviceGetUUID", mh)
            if uuid:
                out.append(_text(uuid))
    return tuple(out)


def _retired_pages(c: Calls, h) -> int | None:
    counts = [c.get("nvmlDeviceGetRetiredPages", h, cause) for cause in (0, 1)]
    if all(x is None for x in counts):
        return None                          # Ampere and later remap rows instead
    return sum(len(x) for x in counts if x is not None)


def _mib(mem, attr: str) -> int:
    v = getattr(mem, attr, None)
    return int(v) // _MIB if v is not None else 0


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _cuda_version(v: int | None) -> str | None:
    return None if not v else f"{v // 1000}.{(v % 1000) // 10}"


def nccl_version() -> str | None:
    """NCCL as torch would load it, without importing torch: the pip NCCL package's version, else
    torch's if already imported, else None."""
    from importlib import metadata
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        v = torch.cuda.nccl.version()
    except Exception:                        # CPU-only torch: no NCCL compiled in
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


class LiveReadings:
    """A running job's GPUs re-read cheaply (_live's readings and their processes), NVML started
    once for the reader's life; `close()` ends NVML. A GPU that cannot be read keeps its
    fields."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._started = False

    def read(self, topology: Topology, indices) -> Topology:
        """`topology` with the GPUs at `indices` refreshed (the others as they are)."""
        if not self._started:
            self._nvml, self._started = _start(self._nvml), True
        nvml = self._nvml
        c, fresh = Calls(nvml), {}
        for i in indices:
            g = topology.gpu(i)
            try:
                h = nvml.nvmlDeviceGetHandleByUUID(g.uuid)
            except nvml.NVMLError:
                continue
            try:
                fresh[i] = dataclasses.replace(g, **_live(c, h),
                                               processes=_processes(c, h, _process_owner))
            except DeviceLost as exc:
                fresh[i] = dataclasses.replace(g, lost=True, nvml_error=str(exc))
        gpus = tuple(fresh.get(g.index, g) for g in topology.gpus)
        return dataclasses.replace(topology, gpus=gpus)

    def close(self) -> None:
        if self._started:
            self._started = False
            _stop(self._nvml)
