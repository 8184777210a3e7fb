"""The NVML backend's translation of NVML values, driven by a pynvml look-alike (no GPU here)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_topology import (
    GPU_IS_LOST, LIBRARY_NOT_FOUND, MIB, NO_PERMISSION, FakeDevice, FakeNvml, bus, make_sysfs, uuid,
)
from smartlaunch.topology import discover
from smartlaunch.topology.nvml import NvmlBackend, NvmlUnavailable, _process_owner, decode_throttle

REPO = Path(__file__).resolve().parent.parent


def backend(nvml, tmp_path, allowed=tuple(range(32)), nodes=None, devices=None, owner=None):
    sysfs = make_sysfs(tmp_path / "sys", nodes if nodes is not None else {0: "0-31"}, devices or {})
    return NvmlBackend(nvml=nvml, sysfs=sysfs, allowed=allowed,
                       owner=owner or (lambda pid: ("alice", False)))


def h200_pair():
    a = FakeDevice(uuid(0), bus(0), nvlinks=["switch"] * 18)
    b = FakeDevice(uuid(1), bus(1), nvlinks=["switch"] * 18)
    return FakeNvml([a, b], levels={frozenset((0, 1)): 30}, p2p={frozenset((0, 1)): (0, 0, 0)})


def test_measured_h200_pair_level_30_with_nvlinks_reads_as_nv18(tmp_path):
    nvml = h200_pair()
    topo = backend(nvml, tmp_path).read({})
    link = topo.link(0, 1)
    assert (link.link_class, link.p2p_read, link.p2p_write, link.p2p_nvlink) == ("NV18", True, True, True)
    g = topo.gpus[0]
    assert (g.name, g.memory_total_mib, g.memory_free_mib, g.nvlinks_active) == ("NVIDIA H200", 143771, 143247, 18)
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    assert (g.power_w, g.power_limit_w, g.sm_clock_mhz, g.sm_clock_max_mhz) == (76.0, 700.0, 345, 1980)
    assert (topo.driver_version, topo.cuda_driver_version) == ("580.159.04", "13.0")
    assert g.numa_node == -1 and g.cpus == tuple(range(32)) and topo.numa_nodes == {0: tuple(range(32))}
    assert topo.findings == () and topo.source == "nvml"
    assert nvml.initialised == 0                       # shut down again


@pytest.mark.parametrize("level, cls", [(0, "PIX"), (10, "PIX"), (20, "PXB"), (30, "PHB"),
                                        (40, "NODE"), (50, "SYS"), (77, "??")])
def test_topology_levels_map_to_nvidia_smi_classes(level, cls, tmp_path):
    nvml = FakeNvml([FakeDevice(uuid(0), bus(0)), FakeDevice(uuid(1), bus(1))],
                    levels={frozenset((0, 1)): level})
    assert backend(nvml, tmp_path).read({}).link(0, 1).link_class == cls


def test_direct_nvlinks_count_per_peer(tmp_path):
    # Three GPUs: 0-1 bonded by 4 links, 1-2 by 2, 0-2 by none (PCIe host bridge).
    d = [FakeDevice(uuid(0), bus(0), nvlinks=[bus(1)] * 4),
         FakeDevice(uuid(1), bus(1), nvlinks=[bus(0)] * 4 + [bus(2)] * 2),
         FakeDevice(uuid(2), bus(2), nvlinks=[bus(1)] * 2)]
    nvml = FakeNvml(d, levels={frozenset((0, 1)): 30, frozenset((1, 2)): 30, frozenset((0, 2)): 30})
    topo = backend(nvml, tmp_path).read({})
    assert [(l.a, l.b, l.link_class) for l in topo.links] == [(0, 1, "NV4"), (0, 2, "PHB"), (1, 2, "NV2")]
    assert [g.nvlinks_active for g in topo.gpus] == [4, 6, 2]


@pytest.mark.parametrize("mask, names", [
    (0x0, ()),
    (0x1, ("gpu_idle",)),
    (0x4 | 0x40, ("sw_power_cap", "hw_thermal_slowdown")),
    (0x8 | 0x80, ("hw_slowdown", "hw_power_brake_slowdown")),
    (0x400 | 0x1000, ("reliability", "0x1000")),
])
def test_throttle_bitmask_decoding(mask, names):
    assert decode_throttle(mask) == names


def test_throttled_hot_gpu_at_power_limit_gives_findings(tmp_path):
    hot = FakeDevice(uuid(0), bus(0), throttle=0x4 | 0x40, temperature=91, power_mw=699000,
                     clocks=(1200, 1980), util=100)
    topo = backend(FakeNvml([hot]), tmp_path).read({})
    by_code = {f.code: f for f in topo.findings}
    assert set(by_code) == {"clocks_throttled", "temperature_high", "power_at_limit"}
    assert "1200 of 1980 MHz" in by_code["clocks_throttled"].message
    assert "hw_thermal_slowdown" in by_code["clocks_throttled"].message
    assert "sw_power_cap" not in by_code["clocks_throttled"].message   # normal under load


def test_persistence_mode_off_is_one_line_for_the_machine(tmp_path):
    devs = [FakeDevice(uuid(i), bus(i), persistence=0 if i < 2 else 1) for i in range(3)]
    topo = backend(FakeNvml(devs), tmp_path / "a").read({})
    assert [g.persistence_mode for g in topo.gpus] == [False, False, True]
    off = [f for f in topo.findings if f.code == "persistence_off"]
    assert len(off) == 1 and off[0].gpu is None
    assert "GPU0, GPU1" in off[0].message and "GPU2" not in off[0].message
    devs = [FakeDevice(uuid(0), bus(0), unsupported={"persistence"})]
    topo = backend(FakeNvml(devs), tmp_path / "b").read({})
    assert topo.gpus[0].persistence_mode is None
    assert not [f for f in topo.findings if f.code == "persistence_off"]


def test_pcie_generation_drop_counts_only_while_busy(tmp_path):
    idle = FakeDevice(uuid(0), bus(0), pcie=(1, 5, 16, 16), util=0, throttle=0x1)
    busy = FakeDevice(uuid(1), bus(1), pcie=(3, 5, 16, 16), util=95, throttle=0x0)
    topo = backend(FakeNvml([idle, busy]), tmp_path).read({})
    assert {(f.code, f.gpu) for f in topo.findings} == {("pcie_gen_degraded", 1)}


def test_gpu_lost_mid_read_becomes_a_critical_finding(tmp_path):
    good = FakeDevice(uuid(0), bus(0))
    bad = FakeDevice(uuid(1), bus(1), lost_in={"memory"})
    topo = backend(FakeNvml([good, bad]), tmp_path).read({})
    lost = topo.gpu(1)
    assert lost.lost and lost.uuid == uuid(1) and lost.nvml_error == "GPU is lost"
    assert lost.memory_total_mib == 0 and lost.temperature_c is None
    assert [(f.severity.value, f.code, f.gpu) for f in topo.findings] == [("critical", "gpu_lost", 1)]
    assert topo.link(0, 1).link_class == "??" and topo.link(0, 1).p2p is None
    assert topo.healthy(0) and not topo.healthy(1)


def test_gpu_whose_handle_fails_is_lost_but_keeps_its_ordinal(tmp_path):
    d = [FakeDevice(uuid(0), bus(0), handle_error=999), FakeDevice(uuid(1), bus(1))]
    topo = backend(FakeNvml(d), tmp_path).read({})
    assert [g.lost for g in topo.gpus] == [True, False]
    assert topo.gpus[1].uuid == uuid(1)


def test_gpus_we_may_not_open_are_not_ours(tmp_path):
    d = [FakeDevice(uuid(0), bus(0), handle_error=NO_PERMISSION), FakeDevice(uuid(1), bus(1))]
    topo = backend(FakeNvml(d), tmp_path).read({})
    assert [(g.index, g.nvml_index) for g in topo.gpus] == [(0, 1)]


def test_unreadable_fields_are_none_not_guesses(tmp_path):
    d = FakeDevice(uuid(0), bus(0), ecc=None, remap=None,
                   unsupported={"temperature", "power", "util", "throttle", "pcie"})
    g = backend(FakeNvml([d]), tmp_path).read({}).gpus[0]
    assert (g.temperature_c, g.power_w, g.utilization_pct, g.pcie_gen) == (None, None, None, None)
    assert (g.ecc_volatile_uncorrected, g.retired_pages, g.row_remap_pending) == (None, None, None)
    assert g.throttle_reasons == () and not g.lost


def test_ecc_and_retired_pages(tmp_path):
    d = [FakeDevice(uuid(0), bus(0), ecc=(3, 5), retired=(1, 2)),
         FakeDevice(uuid(1), bus(1), ecc=(0, 4), remap=(0, 1, 0, 1))]
    topo = backend(FakeNvml(d), tmp_path).read({})
    assert topo.gpus[0].retired_pages == 3
    assert {(f.severity.value, f.code, f.gpu) for f in topo.findings} == {
        ("critical", "ecc_uncorrected", 0), ("warning", "retired_pages", 0),
        ("warning", "ecc_uncorrected_history", 1), ("critical", "row_remap_failed", 1)}


def test_p2p_missing_on_a_pcie_switch_is_flagged(tmp_path):
    nvml = FakeNvml([FakeDevice(uuid(0), bus(0)), FakeDevice(uuid(1), bus(1))],
                    levels={frozenset((0, 1)): 10}, p2p={frozenset((0, 1)): (5, 5, 5)})
    topo = backend(nvml, tmp_path).read({})
    assert [(f.code, f.gpu) for f in topo.findings] == [("p2p_unavailable", None)]
    assert "GPU0-GPU1" in topo.findings[0].message


def test_numa_from_sysfs_and_cpus_intersected_with_affinity(tmp_path):
    d = [FakeDevice(uuid(0), bus(0), cpu_words=[0xFFFF]),            # CPUs 0-15
         FakeDevice(uuid(1), bus(1), unsupported={"cpuaffinity"})]   # falls back to sysfs
    be = backend(FakeNvml(d), tmp_path, allowed=tuple(range(8, 24)),
                 nodes={0: "0-15", 1: "16-31"},
                 devices={bus(0): (0, "0-15"), bus(1): (1, "16-31")})
    topo = be.read({})
    assert [(g.numa_node, g.cpus) for g in topo.gpus] == [(0, tuple(range(8, 16))), (1, tuple(range(16, 24)))]
    assert topo.numa_nodes == {0: tuple(range(8, 16)), 1: tuple(range(16, 24))}


def test_nvml_memory_affinity_wins_over_sysfs(tmp_path):
    d = [FakeDevice(uuid(0), bus(0), node_words=[0b10])]
    be = backend(FakeNvml(d), tmp_path, nodes={0: "0-15", 1: "16-31"}, devices={bus(0): (-1, "0-31")})
    assert be.read({}).gpus[0].numa_node == 1


def test_single_numa_node_machine_reports_minus_one(tmp_path):
    d = [FakeDevice(uuid(0), bus(0), node_words=[0b1])]
    be = backend(FakeNvml(d), tmp_path, nodes={0: "0-31"}, devices={bus(0): (0, "0-31")})
    assert be.read({}).gpus[0].numa_node == -1


def test_processes_with_owner_and_busy(tmp_path):
    # Foreign pids that cannot be this process (pids are small in some sandboxes).
    a, b = [p for p in (4242, 4343, 5252) if p != os.getpid()][:2]
    d = [FakeDevice(uuid(0), bus(0), procs=[(os.getpid(), 2048 * MIB)]),
         FakeDevice(uuid(1), bus(1), procs=[(a, 20480 * MIB), (b, None)])]
    owners = {os.getpid(): ("me", True), a: ("bob", False), b: (None, False)}
    topo = backend(FakeNvml(d), tmp_path, owner=owners.__getitem__).read({})
    assert [g.busy for g in topo.gpus] == [False, True]
    assert [(p.pid, p.user, p.used_mib, p.ours) for p in topo.gpus[1].processes] == \
        [(a, "bob", 20480, False), (b, None, None, False)]
    (busy,) = [f for f in topo.findings if f.code == "gpu_busy"]
    assert f"pid {a} (bob, 20480 MiB)" in busy.message and f"pid {b} (unknown user)" in busy.message


def test_process_owner_knows_this_process_and_its_children():
    import getpass
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _process_owner(os.getpid()) == (getpass.getuser(), True)
        assert _process_owner(child.pid) == (getpass.getuser(), True)
        assert _process_owner(os.getppid())[1] is False          # our parent is not ours
        assert _process_owner(2 ** 22 + 12345) == (None, False)  # gone / other pid namespace
    finally:
        child.kill()
        child.wait()


def test_visibility_applies_before_reading(tmp_path):
    d = [FakeDevice(uuid(i), bus(i)) for i in range(4)]
    nvml = FakeNvml(d, levels={frozenset((1, 3)): 20})
    topo = backend(nvml, tmp_path).read({"CUDA_VISIBLE_DEVICES": f"3,{uuid(1)[:12]}"})
    assert [(g.index, g.nvml_index, g.uuid) for g in topo.gpus] == [(0, 3, uuid(3)), (1, 1, uuid(1))]
    assert topo.link(0, 1).link_class == "PXB"
    # hidden GPUs are identified (for UUID matching) but not read
    assert nvml.calls.count("memory") == 2


def test_mig_uuids_are_read_for_visibility(tmp_path):
    d = [FakeDevice(uuid(0), bus(0)),
         FakeDevice(uuid(1), bus(1), mig=(1, 1), mig_uuids=("MIG-abc-1", "MIG-abc-2"))]
    topo = backend(FakeNvml(d), tmp_path).read({"CUDA_VISIBLE_DEVICES": "MIG-abc-2"})
    assert [g.nvml_index for g in topo.gpus] == [1]
    assert topo.gpus[0].mig_mode and topo.gpus[0].mig_devices == ("MIG-abc-1", "MIG-abc-2")


def test_nvml_init_failure_raises_nvml_unavailable(tmp_path):
    with pytest.raises(NvmlUnavailable) as info:
        backend(FakeNvml([], init_error=LIBRARY_NOT_FOUND), tmp_path).read({})
    assert info.value.reason == "NVML Shared Library Not Found"


def test_discover_on_this_cpu_machine_is_cpu_only(clean_env):
    # The real pynvml, no driver here: discover() must not raise.
    topo = discover()
    if topo.source == "nvml":
        pytest.skip("this machine has an NVIDIA driver")
    assert topo.gpus == () and topo.source == "none"
    assert topo.note.startswith("no NVIDIA driver/NVML on this machine (")


def test_only_nvml_py_imports_pynvml_and_nothing_at_import_time():
    src = REPO / "smartlaunch"
    importers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                       if "import pynvml" in p.read_text() or "from pynvml" in p.read_text())
    assert importers == ["topology/nvml.py"]
    code = ("import sys, smartlaunch.topology, smartlaunch.topology.cli, smartlaunch.topology.nvml;"
            "print('pynvml' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_nvlink_class_without_nvlink_p2p_is_flagged(tmp_path):
    nvml = h200_pair()
    nvml.p2p = {frozenset((0, 1)): (0, 0, 5)}          # PCIe P2P works, NVLink P2P does not
    topo = backend(nvml, tmp_path).read({})
    assert topo.link(0, 1).link_class == "NV18"
    assert [(f.code, f.gpu) for f in topo.findings] == [("p2p_nvlink_unavailable", None)]


def test_our_overhead_for_an_eight_gpu_node_is_far_below_the_budget(tmp_path):
    # Everything but NVML itself (translation, sysfs, visibility, health) for 8 NVSwitch GPUs;
    # the real figure, NVML included, comes from bench/topology_bench.py on the H200 machine.
    import statistics
    import time
    d = [FakeDevice(uuid(i), bus(i), nvlinks=["switch"] * 18, procs=[(os.getpid(), MIB)]) for i in range(8)]
    nvml = FakeNvml(d, levels={frozenset((a, b)): 50 for a in range(8) for b in range(8)},
                    p2p={frozenset((a, b)): (0, 0, 0) for a in range(8) for b in range(8)})
    be = backend(nvml, tmp_path, nodes={0: "0-15", 1: "16-31"})
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        topo = be.read({})
        times.append(time.perf_counter() - t0)
    assert len(topo.links) == 28 and {l.link_class for l in topo.links} == {"NV18"}
    assert statistics.median(times) < 0.1
