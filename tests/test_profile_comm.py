"""All-reduce benchmark: gloo over 2 CPU processes, the cached curve, failures, bench-comm."""
from __future__ import annotations

import os
import time

import pytest

from smartlaunch import node_cli
from smartlaunch.policy.api import Policy
from smartlaunch.profile import cache, comm
from smartlaunch.topology.fake import load_node

pytestmark = pytest.mark.timeout(120)


def test_gloo_curve_over_two_processes_is_monotone_ish_and_interpolates(clean_env):
    seen = []
    curve = comm.measure_allreduce((0, 1), device="cpu", environ=dict(os.environ),
                                   max_bytes=3 << 20, progress=lambda *a: seen.append(a))
    sizes = [s for s, _ in curve.points]
    assert sizes == [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]
    # the status line's "all-reduce 1 MB (5 of 7 sizes)": rank 0's sizes in order, to the last
    assert seen and seen[-1] == (4 << 20, 7, 7), seen
    assert all(sizes[k - 1] == size and n == 7 for size, k, n in seen), seen
    assert curve.world_size == 2 and curve.backend == "gloo" and curve.gpus == (0, 1)
    times = [t for _, t in curve.points]
    assert all(t > 0 for t in times)
    # loopback gloo on a busy 2-core runner is noisy (one descheduling costs more than 4 MB);
    # 32-64x the bytes must still cost more than the smallest messages
    assert max(times[-2:]) > min(times[:2])
    (x0, y0), (x1, y1) = curve.points[-2], curve.points[-1]
    mid = (x0 + x1) // 2
    assert curve.time(mid) == pytest.approx(y0 + (y1 - y0) * (mid - x0) / (x1 - x0))
    assert curve.time(x1) == y1
    assert curve.bandwidth_Bps > 0 and curve.time(1 << 30) > curve.time(x1)
    assert curve.bus_bandwidth_Bps(x1) == pytest.approx(x1 / y1)  # 2(n-1)/n == 1 for n=2


def test_sizes_cover_the_gradient_size_and_no_more():
    assert comm.sizes_for("cuda", None) == tuple(1 << 20 << i for i in range(9))
    assert comm.sizes_for("cuda", 5 << 20)[-1] == 8 << 20
    assert comm.sizes_for("cuda", 8 << 20)[-1] == 8 << 20
    assert len(comm.sizes_for("cuda", 100)) == 2  # a tiny model still gets a curve
    assert comm.sizes_for("cpu", None)[-1] == 4 << 20


def test_failed_worker_raises_and_leaves_no_process(clean_env):
    # device="cuda" on a machine without CUDA: every rank fails in set_device
    t0 = time.monotonic()
    with pytest.raises(comm.CommBenchError, match=r"rank \d exited with code"):
        comm.measure_allreduce((0, 1), device="cuda", environ=dict(os.environ))
    assert time.monotonic() - t0 < 60
    mine = [p for p in _children() if "comm_worker" in p]
    assert not mine


def test_single_gpu_group_is_refused():
    with pytest.raises(comm.CommBenchError, match="at least 2 GPUs"):
        comm.measure_allreduce((0,), device="cpu", environ={})


def test_comm_key_follows_topology_group_and_nccl_env():
    topo = load_node("h200-nv18-pair")
    base = cache.comm_key(topo, (0, 1), "nccl", {"PATH": "/bin"})
    assert cache.comm_key(topo, (0, 1), "nccl", {"PATH": "/usr/bin"}) == base
    assert cache.comm_key(topo, (0, 1), "nccl", {"NCCL_P2P_DISABLE": "1"}) != base
    assert cache.comm_key(topo, (1, 0), "nccl", {}) != cache.comm_key(topo, (0, 1), "nccl", {})
    assert cache.comm_key(load_node("pcie-4gpu-x8"), (0, 1), "nccl", {}) != \
        cache.comm_key(topo, (0, 1), "nccl", {})


def test_bench_comm_fills_the_cache_then_reads_it(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("SMARTLAUNCH_FAKE_TOPOLOGY", "h200-nv18-pair")
    assert node_cli.main(["bench-comm"]) == 0
    first = capsys.readouterr().out
    assert "0,1" in first and "gloo" in first and "(cached)" not in first
    t0 = time.monotonic()
    assert node_cli.main(["bench-comm", "--json"]) == 0
    assert time.monotonic() - t0 < 1.0  # no processes started on a hit
    import json
    [curve] = json.loads(capsys.readouterr().out)
    assert curve["cached"] is True and curve["world_size"] == 2
    topo = load_node("h200-nv18-pair")
    said = []         # the pipeline's "measuring all-reduce over ..." line: never on a hit
    hit = comm.comm_curve(topo, (0, 1), Policy(), dict(os.environ),
                          announce=lambda: said.append("measuring"))
    assert hit.cached and len(hit.points) == len(comm.CPU_SIZES) and said == []


def _children() -> list[str]:
    import psutil
    return [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)]


def test_one_set_of_ranks_measures_each_group_over_a_communicator_of_its_own(clean_env):
    # comm_worker --groups: three gloo ranks joined once, a 3-group's curve then a pair's
    seen = []
    got = comm.measure_groups([(0, 1, 2), (0, 2)], device="cpu", environ=dict(os.environ),
                              max_bytes=256 << 10, progress=lambda *a: seen.append(a))
    assert list(got) == [(0, 1, 2), (0, 2)]
    for group, curve in got.items():
        assert curve.world_size == len(group) and curve.gpus == group
        assert [s for s, _ in curve.points] == [64 << 10, 128 << 10, 256 << 10]
        assert all(t > 0 for _, t in curve.points) and curve.derived_from == ()
    assert seen and seen[-1] == (256 << 10, 6, 6), seen          # both groups' sizes counted
    assert not [p for p in _children() if "comm_worker" in p]
    with pytest.raises(comm.CommBenchError, match="at least 2 GPUs"):
        comm.measure_groups([(0, 1), (2,)], device="cpu", environ={})
