"""decide.probe: the decision before anything is measured (issue 16: re-planning inside decide)."""
from __future__ import annotations

import pytest

from helpers_decide import nv_pair, nvswitch8, policy, request

from smartlaunch.decide import decide
from smartlaunch.decide.explain import render_text
from smartlaunch.decide.probe import WAIT_REASON, probe
from smartlaunch.errors import PlanError, UsageError
from smartlaunch.strategies import REGISTRY


def never():
    raise AssertionError("the lease directory was read for an impossible request")


def test_an_impossible_request_fails_before_the_leases_are_read():
    with pytest.raises(UsageError) as e:
        probe(request(max_gpus=4), nv_pair(), policy(), units=REGISTRY, leased=never,
              environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "(CUDA_VISIBLE_DEVICES=0,1)" in str(e.value)
    with pytest.raises(PlanError):
        probe(request(strategy="ddp"), nv_pair(), policy(), units=REGISTRY,
              leased=lambda: frozenset({1}))


def test_every_usable_gpu_leased_plans_a_wait_without_measuring():
    got = probe(request(), nv_pair(), policy(), units=REGISTRY, leased=lambda: frozenset({0, 1}))
    assert (got.unavailable, got.measure, got.profile_gpu) == (frozenset(), False, None)
    assert got.wait_reason == WAIT_REASON
    # decide() carries it into the Plan, where --explain shows it beside the lease timeout.
    plan = decide(request(), nv_pair(), policy(), None, units=REGISTRY, comm_for=lambda g: None,
                  unavailable=got.unavailable, wait_reason=got.wait_reason)
    assert plan.wait_reason == WAIT_REASON and plan.wait_for_lease
    assert "waits up to 3600 s for its GPUs (every usable GPU is leased" in render_text(plan, REGISTRY)
    no_wait = decide(request(no_wait=True), nv_pair(), policy(), None, units=REGISTRY,
                     comm_for=lambda g: None,
                     wait_reason=got.wait_reason)
    assert not no_wait.wait_for_lease and "--no-wait: fails at once" in render_text(no_wait, REGISTRY)


def test_the_dry_run_goes_to_the_first_free_gpu_only_when_there_is_a_choice():
    got = probe(request(), nvswitch8(), policy(), units=REGISTRY, leased=lambda: frozenset({0, 1}))
    assert (got.unavailable, got.measure, got.profile_gpu, got.wait_reason) == \
        (frozenset({0, 1}), True, 2, "")
    # One GPU left, a forced strategy or --no-python: nothing to choose, no dry run.
    assert probe(request(), nv_pair(), policy(), units=REGISTRY,
                 leased=lambda: frozenset({0})).profile_gpu is None
    assert probe(request(strategy="single"), nvswitch8(), policy(), units=REGISTRY,
                 leased=frozenset).profile_gpu is None
    assert probe(request(no_python=True), nvswitch8(), policy(), units=REGISTRY,
                 leased=frozenset).profile_gpu is None
