"""Measured and derived all-reduce curves (decide/curves.py, issue 26): a cold decision
measures one curve per kind of link, largest group first, and carries it to the smaller
groups whose every pair has the same link class; groups with mixed links are measured."""
from __future__ import annotations

import json

import pytest

from helpers_decide import FakeComm, curve, fixture, gpu, machine, policy, profile, request
from smartlaunch.decide import Strategy
from helpers_decide import decide
from smartlaunch.decide.curves import group_curves, link_kind
from smartlaunch.decide.explain import render_text
from smartlaunch.profile.api import CommCurve
from smartlaunch.strategies import REGISTRY

GPT = dict(params=124_000_000, step_ms=21.0, batch=8)
EVERY_N = tuple(range(1, 9))


def run(topo, pol=None, req=None, comm=None, **kw):
    comm = comm or FakeComm(topo)
    plan = decide(req or request(), topo, pol or policy(trials=False), profile(**GPT),
                  units=REGISTRY, comm_for=comm, **kw)
    return plan, comm


def ddp_rows(plan):
    return {len(c.gpus): c for c in plan.candidates if c.strategy == Strategy.DDP}


def nv4():
    """The lent 4-GPU node's shape: NV18 between every pair."""
    return machine([gpu(i) for i in range(4)], lambda a, b: "NV18", name="nv18-4gpu")


# --- how many sweeps a cold decision runs -----------------------------------------------

@pytest.mark.parametrize("sizes, groups", [
    (None, 3),                  # decision.world_sizes 1, 2, 4, 8: DDP×2, ×4, ×8
    (EVERY_N, 7),               # every N: seven sweeps one after another before issue 26
])
def test_nvswitch_8gpu_fixture_measures_one_curve_whatever_the_group_sizes(clean_env, sizes,
                                                                           groups):
    pol = policy(trials=False, **({"world_sizes": sizes} if sizes else {}))
    plan, comm = run(fixture("nvswitch-8gpu"), pol)
    rows = ddp_rows(plan)
    assert len(rows) == groups and all(r.speedup is not None for r in rows.values())
    assert comm.calls == [tuple(range(8))]
    assert plan.gpus == tuple(range(8)) and plan.comm.derived_from == ()
    for n, row in rows.items():
        if n < 8:
            assert f"derived from the curve measured on GPUs {','.join(map(str, range(8)))}" \
                in row.reason, row.reason


def test_four_nvlinked_gpus_measure_the_group_of_four_once(clean_env):
    plan, comm = run(nv4())
    assert comm.calls == [(0, 1, 2, 3)]
    assert sorted(ddp_rows(plan)) == [2, 4]
    plan, comm = run(nv4(), policy(trials=False, world_sizes=EVERY_N))
    assert comm.calls == [(0, 1, 2, 3)] and sorted(ddp_rows(plan)) == [2, 3, 4]


def test_pcie_4gpu_fixture_measures_every_group_its_mixed_links_make(clean_env):
    # PIX pairs, NODE across, GPU2 at x8: no two candidate groups share a kind of link.
    plan, comm = run(fixture("pcie-4gpu-x8"))
    assert comm.calls == [(0, 1, 2, 3), (0, 1)]
    plan, comm = run(fixture("pcie-4gpu-x8"), policy(trials=False, world_sizes=EVERY_N))
    assert comm.calls == [(0, 1, 2, 3), (0, 1, 3), (0, 1)]
    assert not any("derived" in r.text for r in plan.reasons)
    assert all("measured on this group" in r.reason for r in ddp_rows(plan).values())


def test_a_failed_benchmark_of_the_largest_group_measures_the_next_one(clean_env):
    topo = fixture("nvswitch-8gpu")
    comm = FakeComm(topo, missing={tuple(range(8))})
    plan, comm = run(topo, comm=comm)
    assert comm.calls == [tuple(range(8)), (0, 1, 2, 3)]
    rows = ddp_rows(plan)
    assert rows[8].speedup is None and "derived from the curve measured on GPUs 0,1,2,3" \
        in rows[2].reason


# --- only groups whose links are all alike are derived ----------------------------------

def test_link_kind_is_none_for_mixed_classes_and_mixed_pcie_widths():
    assert link_kind(nv4(), (0, 1, 2)) == ("NV18",)
    degraded = machine([gpu(i) for i in range(4)], lambda a, b: "NV12" if b == 3 else "NV18")
    assert link_kind(degraded, (0, 1, 3)) is None and link_kind(degraded, (0, 1, 2)) == ("NV18",)
    x8 = fixture("pcie-4gpu-x8")                     # (0,1) PIX x16; (2,3) PIX with GPU2 x8
    assert link_kind(x8, (0, 1)) == ("PIX", 4, 16)
    assert link_kind(x8, (2, 3)) is None and link_kind(x8, (0, 1, 2)) is None
    unknown = machine([gpu(i) for i in range(3)], lambda a, b: "??")
    assert link_kind(unknown, (0, 1, 2)) is None


def test_a_curve_is_derived_only_from_a_group_with_the_same_links():
    # two PIX switches joined by SYS: (0,1,2,3) PIX under one, (4,5) PIX under the other,
    # (2,4) and (0,1,4,5) cross SYS
    topo = machine([gpu(i, numa=i // 4) for i in range(8)],
                   lambda a, b: "PIX" if a // 4 == b // 4 else "SYS")
    comm = FakeComm(topo)
    got = group_curves([(0, 1), (4, 5), (0, 1, 2, 3), (2, 4), (0, 1, 4, 5), (4, 5, 6)],
                       topo, comm)
    assert comm.calls == [(0, 1, 2, 3), (0, 1, 4, 5), (2, 4)]
    assert got[(0, 1)].derived_from == (0, 1, 2, 3) and got[(4, 5)].derived_from == (0, 1, 2, 3)
    assert got[(4, 5, 6)].derived_from == (0, 1, 2, 3)
    assert got[(0, 1, 4, 5)].derived_from == () and got[(2, 4)].derived_from == ()


# --- the derivation itself ----------------------------------------------------------------

def test_the_derived_curve_keeps_the_bus_bandwidth_and_the_latency():
    four = curve(4, 300e9, latency_s=40e-6, gpus=(0, 1, 2, 3))
    two = four.for_group((0, 1))
    want = curve(2, 300e9, latency_s=40e-6)
    assert two.world_size == 2 and two.gpus == (0, 1)
    for (s, t), (_, w) in zip(two.points, want.points):
        assert t == pytest.approx(w, rel=1e-9)
    assert two.latency_s == pytest.approx(40e-6, rel=1e-6)
    assert two.bus_bandwidth_Bps(1 << 40) == pytest.approx(300e9, rel=1e-4)   # the fit's
    # up from a pair too: 2(N-1)/N grows from 1 to 1.5, the time of the bandwidth part with it
    up = want.for_group((0, 1, 2, 3))
    assert up.time(1 << 30) - 40e-6 == pytest.approx(1.5 * (want.time(1 << 30) - 40e-6),
                                                      rel=1e-6)
    # a point below the fitted latency (noise at the smallest size) is kept as measured
    noisy = CommCurve.from_points(4, "nccl", [(1 << 20, 50e-6), (1 << 28, 1.1e-3),
                                              (1 << 29, 2.1e-3)])
    assert noisy.latency_s > 50e-6 and noisy.for_group((0, 1)).points[0][1] == 50e-6
    back = CommCurve.from_dict(json.loads(json.dumps(two.to_dict())))
    assert back == two


# --- what the plan says ---------------------------------------------------------------------

def test_the_plan_names_the_derived_curves_and_where_they_came_from(clean_env):
    plan, _ = run(fixture("nvswitch-8gpu"), req=request(max_gpus=4))
    said = [r for r in plan.reasons if r.rule == "derived curves: docs/decision.md"]
    assert len(said) == 1
    assert said[0].text.startswith(
        "all-reduce curves derived, not measured: GPUs 0,1 from the curve measured on "
        "GPUs 0,1,2,3 (every pair NV18 in each); a ring's bus bandwidth (algbw × 2(N−1)/N)")
    text = render_text(plan, REGISTRY)
    assert "all-reduce curves derived, not measured: GPUs 0,1 from" in text


def test_a_chosen_derived_curve_is_shown_as_derived(clean_env):
    # GPT on 4 GPUs whose links give 60 GB/s: ×2 predicted 72% efficient, ×4 70%, so a
    # 71% floor picks the pair, whose curve was derived from the group of four's
    topo = nv4()
    plan, comm = run(topo, policy(trials=False, min_efficiency=0.71),
                     comm=FakeComm(topo, busbw={"NV": 60e9}))
    assert comm.calls == [(0, 1, 2, 3)] and plan.gpus == (0, 1)
    assert plan.comm.gpus == (0, 1) and plan.comm.derived_from == (0, 1, 2, 3)
    assert "all-reduce (nccl, GPUs 0,1, derived from GPUs 0,1,2,3's measured curve)" in \
        render_text(plan, REGISTRY)
