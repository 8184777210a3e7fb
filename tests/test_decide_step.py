"""decide as one pure step: decide(Inputs, Measured) returns the Plan or the next Need, and
`resolve` gives it each one. No process, no file: every measurement here is a value."""
from __future__ import annotations

import pytest

from helpers_decide import TEST_MODEL, FakeComm, curve, nv_pair, nvswitch8, policy, profile, request

from smartlaunch.decide import Plan, decide, resolve
from smartlaunch.decide.api import (Inputs, Measured, NeedCurve, NeedLeases, NeedNodes,
                                    NeedProfile, NeedTrial, TrialResult)
from smartlaunch.decide.decide import WAIT_REASON
from smartlaunch.decide.explain import render_text
from smartlaunch.decide.plan import Reason
from smartlaunch.errors import PlanError, UsageError
from smartlaunch.strategies import REGISTRY


def inputs(req=None, topo=None, pol=None, **kw) -> Inputs:
    return Inputs(req or request(), topo or nv_pair(), pol or policy(), REGISTRY,
                  model=TEST_MODEL, numactl="", **kw)


def test_an_impossible_request_fails_before_anything_is_asked_for():
    with pytest.raises(UsageError) as e:
        decide(inputs(request(max_gpus=4), environ={"CUDA_VISIBLE_DEVICES": "0,1"}))
    assert "(CUDA_VISIBLE_DEVICES=0,1)" in str(e.value)
    with pytest.raises(PlanError):          # ddp on the one GPU left by a lease elsewhere
        decide(inputs(request(strategy="ddp")), Measured(leased=frozenset({1})))


def test_the_first_need_is_the_leases_then_the_dry_run_on_the_first_free_gpu():
    assert decide(inputs()) == NeedLeases()
    need = decide(inputs(topo=nvswitch8()), Measured(leased=frozenset({0, 1})))
    assert need == NeedProfile(2, (2, 3, 4, 5, 6, 7))
    # One GPU left, a forced strategy or --no-python: nothing to choose, no dry run.
    one_left = decide(inputs(), Measured(leased=frozenset({0})))
    assert isinstance(one_left, Plan) and one_left.gpus == (1,)
    for req in (request(strategy="single"), request(no_python=True)):
        got = decide(inputs(req, nvswitch8()), Measured(leased=frozenset()))
        assert isinstance(got, Plan) and got.profile is None


def test_every_usable_gpu_leased_plans_a_wait_without_measuring():
    plan = decide(inputs(), Measured(leased=frozenset({0, 1})))
    assert isinstance(plan, Plan) and plan.wait_reason == WAIT_REASON and plan.wait_for_lease
    assert "waits up to 3600 s for its GPUs (every usable GPU is leased" in render_text(plan, REGISTRY)
    no_wait = decide(inputs(request(no_wait=True)), Measured(leased=frozenset({0, 1})))
    assert not no_wait.wait_for_lease and "--no-wait: fails at once" in render_text(no_wait, REGISTRY)


def fulfiller(topo, asked: list, between=None):
    """A driver of values: no lease, a 2.4 ms profile, FakeComm's curves, trials of single
    100 and DDP 180 samples/s (DDP×2 at 90%), `between` for the all-reduce between nodes;
    every need recorded in `asked`."""
    comm = FakeComm(topo)
    rates = {"single": 100.0, "ddp": 180.0}

    def fulfil(need, m):
        asked.append(need)
        if isinstance(need, NeedLeases):
            return m.add(need, frozenset())
        if isinstance(need, NeedProfile):
            return m.add(need, profile(step_ms=2.4))
        if isinstance(need, NeedCurve):
            return m.add(need, comm(need.gpus))
        if isinstance(need, NeedNodes):
            return m.add(need, between)
        return m.add(need, TrialResult(rates[need.strategy.value]))
    return fulfil


def test_a_cold_decision_asks_for_its_curve_then_its_trials_and_states_the_plan_whole():
    topo, asked = nv_pair(), []
    fulfil = fulfiller(topo, asked)
    note = Reason("a note the caller adds", "test")
    # a band so wide that every prediction is too close to the floor to decide alone
    plan = resolve(inputs(topo=topo, pol=policy(uncertainty_band=5.0), notes=(note,)), fulfil,
                   timings=lambda: {"decide": 0.5})
    kinds = [type(n).__name__ for n in asked]
    assert kinds[:3] == ["NeedLeases", "NeedProfile", "NeedCurve"], kinds
    assert asked[2].gpus == (0, 1) and asked[2].max_bytes == 32 << 20
    trials = [n for n in asked if isinstance(n, NeedTrial)]
    assert [(t.strategy.value, t.gpus, t.number, t.of) for t in trials] == \
        [("single", (0,), 1, 2), ("ddp", (0, 1), 2, 2)]       # "trial 1 of 2", "trial 2 of 2"
    # the plan as it leaves decide: chosen by the trials, prepared, every reason, the timings
    assert plan.strategy.value == "ddp" and plan.gpus == (0, 1)
    assert all(c.measured for c in plan.candidates)
    assert plan.reasons[-1] == note and plan.timings == {"decide": 0.5}
    assert [b.local_rank for b in plan.numa] == [0, 1]    # prepare's: one binding a rank


def test_the_same_measurements_give_the_same_answer():
    topo = nv_pair()
    m = Measured(leased=frozenset(), profile=profile(), profiled=True,
                 curves={(0, 1): curve(2, 100e9, gpus=(0, 1))})
    assert decide(inputs(topo=topo), m) == decide(inputs(topo=topo), m)


def test_how_many_nodes_is_the_last_need_and_one_node_kept_is_decided_as_one_node():
    """Step 7: a job across a fixed 2 nodes that this node decides for asks for the all-reduce
    between them last; a slow link keeps one node, whose plan is the one-node job's (with its
    own trials), a fast one keeps both; an unmeasured link keeps both and says why."""
    topo = nv_pair()
    comm = FakeComm(topo)

    def run(between):
        asked = []
        req = request(nnodes="2", nnodes_from="user")
        return resolve(inputs(req, topo, nodes=2), fulfiller(topo, asked, between)), asked

    slow, asked = run(curve(2, 0.05e9))
    kinds = [type(n).__name__ for n in asked]
    assert kinds[:4] == ["NeedLeases", "NeedProfile", "NeedCurve", "NeedNodes"], kinds
    assert asked[3] == NeedNodes(2, profile().grad_bytes, "ddp", (0, 1), "NV18", True, ())
    assert "NeedTrial" in kinds[4:]                 # the one-node job's own choice
    assert slow.nnodes == "1" and not slow.multi_node
    texts = [r.text for r in slow.reasons]
    assert any(t.startswith("1 of the 2 nodes:") for t in texts)
    assert texts[-1].startswith("on the one node kept, the job is decided as a one-node job")
    fast, asked = run(curve(2, 50e9))
    assert fast.nnodes == "2" and isinstance(asked[-1], NeedNodes)
    assert any(r.text.startswith("all 2 nodes: DDP×4 predicted") for r in fast.reasons)
    unmeasured, _ = run("not every node arrived within join_timeout=5 s")
    assert unmeasured.nnodes == "2"
    assert unmeasured.reasons[-1].text == "all 2 nodes: not every node arrived within join_timeout=5 s"
    # not this node's choice (nodes=0: another node decides, or a range of nodes)
    plan = decide(inputs(request(nnodes="2", nnodes_from="user"), topo),
                  Measured(leased=frozenset(), profile=profile(), profiled=True,
                           curves={(0, 1): comm((0, 1))}))
    assert isinstance(plan, Plan) and plan.nnodes == "2"
