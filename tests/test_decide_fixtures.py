"""The decision on the topology layer's JSON fixtures (smartlaunch/topology/fixtures)."""
from __future__ import annotations

import pytest

from helpers_decide import FakeComm, fixture, policy, profile, request
from smartlaunch.decide import Strategy
from helpers_decide import decide
from smartlaunch.strategies import REGISTRY

RESNET = dict(params=25_600_000, step_ms=17.0)
NO_SYS = ("NV", "PIX", "PXB", "PHB", "NODE")


def load(name):
    topo = fixture(name)
    assert topo is not None, f"fixture {name} is missing"
    return topo


def run(name, req=None, pol=None, unavailable=frozenset(), **kw):
    topo = load(name)
    comm = FakeComm(topo)
    return decide(req or request(), topo, pol or policy(), profile(**kw or RESNET),
                  units=REGISTRY, comm_for=comm, unavailable=unavailable), comm, topo


def test_nvswitch_asked_for_two_gets_an_nv_pair_on_one_numa_node(clean_env):
    plan, comm, topo = run("nvswitch-8gpu", request(max_gpus=2))
    assert plan.strategy == Strategy.DDP and len(plan.gpus) == 2
    assert len({topo.gpu(i).numa_node for i in plan.gpus}) == 1
    assert plan.link_class.startswith("NV")
    assert comm.calls == [plan.gpus]


def test_nvswitch_groups_grow_socket_by_socket(clean_env):
    plan, comm, topo = run("nvswitch-8gpu", pol=policy(world_sizes=tuple(range(1, 9))))
    by_n = {len(c.gpus): c.gpus for c in plan.candidates if c.strategy == Strategy.DDP}
    for n in (2, 3, 4):
        assert len({topo.gpu(i).numa_node for i in by_n[n]}) == 1, by_n[n]
    assert len({topo.gpu(i).numa_node for i in by_n[5]}) == 2


def test_nvswitch_picks_a_world_size_of_the_policy_never_seven(clean_env):
    # GPU7 taken: the seven others scale alike (82% each), and DDP×7 was the most samples/s;
    # decision.world_sizes (1, 2, 4, 8 by default) keeps the global batch a power of two.
    plan, comm, topo = run("nvswitch-8gpu", unavailable=frozenset({7}))
    assert plan.strategy == Strategy.DDP and plan.gpus == (0, 1, 2, 3)
    assert comm.calls == [(0, 1, 2, 3)]          # every pair NV18: ×2's curve derived from it
    plan, _, _ = run("nvswitch-8gpu", pol=policy(min_efficiency=0.82))   # ×8 81.9%, ×7 82.1%
    assert plan.nproc_per_node == 4


def test_dual_socket_without_sys_runs_single_and_says_why(clean_env):
    plan, comm, _ = run("dual-socket-sys", pol=policy(ddp_link_classes=NO_SYS))
    assert plan.strategy == Strategy.SINGLE and comm.calls == []
    said = [r for r in plan.reasons if r.rule and r.rule.startswith("decision.ddp_link_classes")]
    assert said and "SYS" in said[0].text


def test_busy_fixture_avoids_the_busy_gpu(clean_env):
    plan, comm, topo = run("busy-gpu")
    busy = [g.index for g in topo.gpus if g.busy]
    assert busy and not set(busy) & set(plan.gpus)
    assert all(not set(busy) & set(g) for g in comm.calls)


@pytest.mark.parametrize("name", ["ecc-fault", "lost-gpu"])
def test_unhealthy_gpus_are_never_used(clean_env, name):
    plan, comm, topo = run(name)
    bad = [g.index for g in topo.gpus if not topo.healthy(g.index)]
    assert bad and not set(bad) & set(plan.gpus) and not set(bad) & set(plan.left_free)
    assert any("unhealthy" in r.text for r in plan.reasons)


def test_pcie_phb_pair_large_gradients_stay_single(clean_env):
    plan, _, _ = run("pcie-phb-4070ti-pair", params=163_000_000, step_ms=21.0, peak_gib=9.0)
    assert plan.strategy == Strategy.SINGLE and plan.left_free == (1,)
    assert "GPU1 left free" in [c for c in plan.candidates if not c.chosen][0].reason


def test_pcie_phb_pair_refuses_a_peak_bigger_than_the_card(clean_env):
    from smartlaunch.errors import PlanError
    with pytest.raises(PlanError, match="does not fit GPU0's"):
        run("pcie-phb-4070ti-pair", peak_gib=15.0, **RESNET)
