"""Test helpers for the topology layer: a pynvml look-alike, a fake sysfs tree, the CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

NOT_SUPPORTED, NO_PERMISSION, GPU_IS_LOST, LIBRARY_NOT_FOUND, INVALID_ARGUMENT = 3, 4, 15, 12, 2
MIB = 1024 * 1024


class FakeNVMLError(Exception):
    _text = {NOT_SUPPORTED: "Not Supported", NO_PERMISSION: "Insufficient Permissions",
             GPU_IS_LOST: "GPU is lost", LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
             INVALID_ARGUMENT: "Invalid Argument"}

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._text.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeDevice:
    """Raw NVML readings of one GPU, in NVML's units (bytes, mW, bitmasks)."""
    uuid: str
    bus: str
    name: str = "NVIDIA H200"
    total_mib: int = 143771
    used_mib: int = 524
    util: int = 0
    nvlinks: list = field(default_factory=list)   # per link: remote bus id, or "switch"
    cpu_words: list = field(default_factory=lambda: [0xFFFFFFFF])   # CPUs 0-31
    node_words: list | None = None                # memory affinity; None: unsupported
    pcie: tuple = (5, 5, 16, 16)                  # cur gen, max gen, cur width, max width
    temperature: int = 31
    power_mw: int = 76000
    limit_mw: int = 700000
    clocks: tuple = (345, 1980)
    throttle: int = 0x1
    ecc: tuple | None = (0, 0)                    # volatile, aggregate uncorrected
    retired: tuple | None = None                  # (multi single-bit, double-bit) counts
    remap: tuple | None = (0, 0, 0, 0)
    mig: tuple = (0, 0)
    mig_uuids: tuple = ()
    procs: list = field(default_factory=list)     # (pid, used bytes)
    handle_error: int | None = None               # nvmlDeviceGetHandleByIndex raises this
    lost_in: set = field(default_factory=set)     # calls that raise GPU_IS_LOST
    unsupported: set = field(default_factory=set) # calls that raise NOT_SUPPORTED
    persistence: int = 1                          # nvmlDeviceGetPersistenceMode


class FakeNvml:
    """Enough of the pynvml module for NvmlBackend. `levels`/`p2p` are keyed by frozenset of
    NVML indices; p2p values are (read, write, nvlink) NVML statuses (0 = OK)."""
    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, devices, levels=None, p2p=None, init_error=None):
        self.devices = list(devices)
        self.levels = levels or {}
        self.p2p = p2p or {}
        self.init_error = init_error
        self.calls: list[str] = []
        self.initialised = 0

    # -- system ---------------------------------------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetHandleByIndex(self, i):
        d = self.devices[i]
        if d.handle_error is not None:
            raise FakeNVMLError(d.handle_error)
        return d

    # -- per device -----------------------------------------------------------------------
    def _on(self, name, d):
        self.calls.append(name)
        if name in d.lost_in:
            raise FakeNVMLError(GPU_IS_LOST)
        if name in d.unsupported:
            raise FakeNVMLError(NOT_SUPPORTED)

    def nvmlDeviceGetUUID(self, d):
        if isinstance(d, tuple):                       # a MIG handle
            return d[1]
        self._on("uuid", d)
        return d.uuid

    def nvmlDeviceGetName(self, d):
        self._on("name", d)
        return d.name

    def nvmlDeviceGetPciInfo(self, d):
        self._on("pci", d)
        return SimpleNamespace(busId=d.bus)

    def nvmlDeviceGetMigMode(self, d):
        self._on("mig", d)
        return list(d.mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, d):
        return len(d.mig_uuids)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, d, k):
        return (d, d.mig_uuids[k])

    def nvmlDeviceGetMemoryInfo(self, d):
        self._on("memory", d)
        return SimpleNamespace(total=d.total_mib * MIB, used=d.used_mib * MIB,
                               free=(d.total_mib - d.used_mib) * MIB)

    def nvmlDeviceGetUtilizationRates(self, d):
        self._on("util", d)
        return SimpleNamespace(gpu=d.util, memory=0)

    def nvmlDeviceGetMemoryAffinity(self, d, size, scope):
        self._on("memaffinity", d)
        if d.node_words is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return list(d.node_words) + [0] * (size - len(d.node_words))

    def nvmlDeviceGetCpuAffinity(self, d, size):
        self._on("cpuaffinity", d)
        return list(d.cpu_words) + [0] * (size - len(d.cpu_words))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, d):
        self._on("pcie", d)
        return d.pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, d):
        return d.pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, d):
        return d.pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, d):
        return d.pcie[3]

    def nvmlDeviceGetTemperature(self, d, sensor):
        self._on("temperature", d)
        return d.temperature

    def nvmlDeviceGetPowerUsage(self, d):
        self._on("power", d)
        return d.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, d):
        return d.limit_mw

    def nvmlDeviceGetPersistenceMode(self, d):
        self._on("persistence", d)
        return d.persistence

    def nvmlDeviceGetClockInfo(self, d, kind):
        assert kind == 1, "SM clock"
        return d.clocks[0]

    def nvmlDeviceGetMaxClockInfo(self, d, kind):
        return d.clocks[1]

    def nvmlDeviceGetCurrentClocksEventReasons(self, d):
        self._on("throttle", d)
        return d.throttle

    def nvmlDeviceGetTotalEccErrors(self, d, error_type, counter):
        self._on("ecc", d)
        if d.ecc is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        assert error_type == 1, "uncorrected"
        return d.ecc[counter]

    def nvmlDeviceGetRetiredPages(self, d, cause):
        if d.retired is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return list(range(d.retired[cause]))

    def nvmlDeviceGetRemappedRows(self, d):
        if d.remap is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return d.remap

    def nvmlDeviceGetComputeRunningProcesses(self, d):
        self._on("procs", d)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in d.procs]

    def nvmlDeviceGetNvLinkState(self, d, link):
        self._on("nvlink", d)
        if link >= len(d.nvlinks):
            raise FakeNVMLError(INVALID_ARGUMENT if d.nvlinks else NOT_SUPPORTED)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, d, link):
        remote = d.nvlinks[link]
        return SimpleNamespace(busId="00000000:FF:00.0" if remote == "switch" else remote)

    # -- pairs ----------------------------------------------------------------------------
    def _key(self, a, b):
        return frozenset((self.devices.index(a), self.devices.index(b)))

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        self._on("level", a)
        return self.levels.get(self._key(a, b), 50)

    def nvmlDeviceGetP2PStatus(self, a, b, kind):
        self._on("p2p", a)
        return self.p2p.get(self._key(a, b), (5, 5, 5))[kind]


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02X}:00.0"


def make_sysfs(root: Path, nodes: dict[int, str], devices: dict[str, tuple[int, str]]) -> str:
    """A sysfs tree: nodes {node: cpulist}, devices {nvml bus id: (numa_node, local_cpulist)}."""
    for n, cpus in nodes.items():
        p = root / "devices/system/node" / f"node{n}"
        p.mkdir(parents=True)
        (p / "cpulist").write_text(cpus + "\n")
    for b, (node, cpus) in devices.items():
        p = root / "bus/pci/devices" / ("0000:" + b.split(":", 1)[1].lower())
        p.mkdir(parents=True)
        (p / "numa_node").write_text(f"{node}\n")
        (p / "local_cpulist").write_text(cpus + "\n")
    return str(root)


def run_node(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The installed `smartlaunch-node` console script, as a user runs it."""
    exe = Path(sys.executable).with_name("smartlaunch-node")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "smartlaunch.node_cli"]
    return subprocess.run(cmd + args, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=60)
