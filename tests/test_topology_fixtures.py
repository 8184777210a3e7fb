"""Every shipped fixture, through the fake backend: link matrix, NUMA map, findings."""
from __future__ import annotations

import dataclasses
import json

import pytest

from helpers_common import fixture_path
from smartlaunch.topology import Severity, discover
from smartlaunch.topology.api import cpu_only, Topology
from smartlaunch.topology.fake import FIXTURES, from_json, load_node, to_json

R = lambda a, b: tuple(range(a, b + 1))   # noqa: E731  CPU ranges as the issue writes them

# name -> (link matrix row by row, upper triangle; NUMA map; per-GPU (numa, cpus); findings)
EXPECTED = {
    "pcie-phb-4070ti-pair": (
        [["PHB"]], {0: R(0, 15)}, [(-1, R(0, 15))] * 2, set()),
    "dual-socket-sys": (
        [["SYS"]], {0: R(0, 31), 1: R(32, 63)}, [(0, R(0, 31)), (1, R(32, 63))], set()),
    "h200-nv18-pair": (
        [["NV18"]], {0: R(0, 31)}, [(-1, R(0, 31))] * 2, set()),
    "nvswitch-8gpu": (
        [["NV18"] * (7 - i) for i in range(7)], {0: R(0, 63), 1: R(64, 127)},
        [(0, R(0, 63))] * 4 + [(1, R(64, 127))] * 4, set()),
    "pcie-4gpu-x8": (
        [["PIX", "NODE", "NODE"], ["NODE", "NODE"], ["PIX"]], {0: R(0, 31)}, [(-1, R(0, 31))] * 4,
        {("warning", "pcie_width_degraded", 2)}),
    "busy-gpu": (
        [["PXB"]], {0: R(0, 31)}, [(-1, R(0, 31))] * 2, {("info", "gpu_busy", 1)}),
    "lost-gpu": (
        [["??"]], {0: R(0, 31)}, [(-1, R(0, 31)), (-1, ())], {("critical", "gpu_lost", 1)}),
    "ecc-fault": (
        [["NV12"]], {0: R(0, 31)}, [(-1, R(0, 31))] * 2,
        {("critical", "ecc_uncorrected", 0), ("warning", "row_remap_pending", 0)}),
}


def test_every_shipped_fixture_is_covered():
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_links_numa_and_findings(name, clean_env, monkeypatch):
    rows, numa, per_gpu, findings = EXPECTED[name]
    monkeypatch.setenv("SMARTLAUNCH_FAKE_TOPOLOGY", name)
    topo = discover()
    assert topo.source.startswith("fake:")
    n = len(per_gpu)
    assert [g.index for g in topo.gpus] == list(range(n))
    matrix = [[topo.link(a, b).link_class for b in range(a + 1, n)] for a in range(n - 1)]
    assert matrix == rows
    assert topo.numa_nodes == numa
    assert [(g.numa_node, g.cpus) for g in topo.gpus] == per_gpu
    assert {(f.severity.value, f.code, f.gpu) for f in topo.findings} == findings
    critical = {f.gpu for f in topo.findings if f.severity == Severity.CRITICAL}
    assert [topo.healthy(i) for i in range(n)] == [i not in critical for i in range(n)]


def test_measured_h200_pair_matches_the_issue():
    topo = from_json("h200-nv18-pair", {})
    g = topo.gpus[0]
    assert (g.name, g.memory_total_mib, g.pcie_gen, g.pcie_width, g.nvlinks_active) == \
        ("NVIDIA H200", 143771, 5, 16, 18)
    link = topo.link(0, 1)
    assert (link.p2p, link.p2p_nvlink) == (True, True)
    assert (topo.driver_version, topo.nccl_version) == ("580.159.04", "2.28.9")


def test_4070_pair_has_no_p2p_and_16gb():
    topo = from_json("pcie-phb-4070ti-pair", {})
    assert topo.link(0, 1).p2p is False
    assert {g.name for g in topo.gpus} == {"NVIDIA GeForce RTX 4070 Ti SUPER"}
    assert all(15_000 < g.memory_total_mib <= 16 * 1024 for g in topo.gpus)


def test_busy_gpu_belongs_to_another_user():
    topo = from_json("busy-gpu", {})
    assert [g.busy for g in topo.gpus] == [False, True]
    (p,) = topo.gpus[1].processes
    assert (p.user, p.used_mib, p.ours) == ("bob", 20480, False)


def test_fixtures_hold_readings_not_verdicts():
    for path in FIXTURES.glob("*.json"):
        assert json.loads(path.read_text())["findings"] == [], path.name


def test_findings_are_recomputed_when_a_reading_changes(tmp_path):
    d = json.loads((FIXTURES / "h200-nv18-pair.json").read_text())
    d["gpus"][1]["pcie_width"] = 4
    d["links"][0]["p2p_read"] = False
    path = tmp_path / "degraded.json"
    path.write_text(json.dumps(d))
    codes = {(f.code, f.gpu) for f in from_json(str(path), {}).findings}
    assert codes == {("pcie_width_degraded", 1), ("p2p_unavailable", None)}


def test_extra_fixture_findings_are_kept_and_stored_computed_ones_dropped(tmp_path):
    d = json.loads((FIXTURES / "busy-gpu.json").read_text())
    d["findings"] = [
        {"severity": "warning", "code": "fan_failed", "message": "GPU1 fan stopped", "gpu": 1},
        {"severity": "critical", "code": "gpu_lost", "message": "stale verdict", "gpu": 0},
    ]
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(d))
    topo = from_json(str(path), {"CUDA_VISIBLE_DEVICES": "1"})
    assert {(f.code, f.gpu) for f in topo.findings} == {("fan_failed", 0), ("gpu_busy", 0)}


def test_fingerprint_is_stable_and_follows_the_link_matrix():
    a, b = from_json("nvswitch-8gpu", {}), from_json("nvswitch-8gpu", {})
    assert a.fingerprint() == b.fingerprint()
    # Readings that change by the minute do not change it ...
    warm = dataclasses.replace(a, gpus=tuple(dataclasses.replace(g, temperature_c=80, memory_free_mib=1)
                                            for g in a.gpus))
    assert warm.fingerprint() == a.fingerprint()
    # ... a link, the GPU set, the driver or NCCL do.
    links = list(a.links)
    links[5] = dataclasses.replace(links[5], link_class="NV12")
    assert dataclasses.replace(a, links=tuple(links)).fingerprint() != a.fingerprint()
    assert dataclasses.replace(a, nccl_version="2.27.3").fingerprint() != a.fingerprint()
    assert from_json("nvswitch-8gpu", {"CUDA_VISIBLE_DEVICES": "1,0"}).fingerprint() != a.fingerprint()
    fps = {from_json(n, {}).fingerprint() for n in EXPECTED}
    assert len(fps) == len(EXPECTED)


def test_hardware_fingerprint_is_equal_on_alike_nodes_and_follows_models_and_links():
    # A multi-node job's nodes compare it: another node's serial numbers, hostname, driver
    # and free memory are not the plan's business; the GPUs' models, memory and links are.
    a = from_json("nvswitch-8gpu", {})
    other = dataclasses.replace(
        a, hostname="elsewhere", driver_version="999", nccl_version="2.99",
        gpus=tuple(dataclasses.replace(g, uuid=f"GPU-other-{g.index}", memory_free_mib=7,
                                       pci_bus_id=f"0000:{g.index}1:00.0") for g in a.gpus))
    assert other.fingerprint() != a.fingerprint()
    assert other.hardware_fingerprint() == a.hardware_fingerprint()
    assert other.hardware() == a.hardware() == \
        f"8× {a.gpus[0].name} ({a.gpus[0].memory_total_mib} MiB), links NV18"
    links = list(a.links)
    links[5] = dataclasses.replace(links[5], link_class="NV12")
    assert dataclasses.replace(a, links=tuple(links)).hardware_fingerprint() != \
        a.hardware_fingerprint()
    bigger = dataclasses.replace(a, gpus=tuple(
        dataclasses.replace(g, memory_total_mib=g.memory_total_mib * 2) for g in a.gpus))
    assert bigger.hardware_fingerprint() != a.hardware_fingerprint()
    assert from_json("nvswitch-8gpu", {"CUDA_VISIBLE_DEVICES": "0,1"}).hardware_fingerprint() \
        != a.hardware_fingerprint()
    assert cpu_only("no NVML").hardware() == "no GPUs"
    fps = {from_json(n, {}).hardware_fingerprint() for n in EXPECTED}
    assert len(fps) > 1


def test_json_round_trip_is_lossless():
    for name in EXPECTED:
        topo = from_json(name, {})
        again = Topology.from_dict(json.loads(to_json(topo)))
        assert again == topo, name


def test_load_node_ignores_visibility(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert len(load_node(fixture_path("nvswitch-8gpu")).gpus) == 8
