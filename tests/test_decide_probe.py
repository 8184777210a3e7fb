"""decide.probe: the decision before anything is measured (issue 16: re-planning inside decide)."""
from __future__ import annotations

import pytest

from helpers_decide import nv_pair, nvswitch8, policy, request

from smartlaunch.decide.probe import WAIT_REASON, probe
from smartlaunch.errors import PlanError, UsageError


def never():
    raise AssertionError("the lease directory was read for an impossible request")


def test_an_impossible_request_fails_before_the_leases_are_read():
    with pytest.raises(UsageError) as e:
        probe(request(max_gpus=4), nv_pair(), policy(), leased=never,
              environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "(CUDA_VISIBLE_DEVICES=0,1)" in str(e.value)
    with pytest.raises(PlanError):
        probe(request(strategy="ddp"), nv_pair(), policy(), leased=lambda: frozenset({1}))


def test_every_usable_gpu_leased_plans_a_wait_without_measuring():
    got = probe(request(), nv_pair(), policy(), leased=lambda: frozenset({0, 1}))
    assert (got.unavailable, got.measure, got.profile_gpu) == (frozenset(), False, None)
    assert got.reasons == (WAIT_REASON,)


def test_the_dry_run_goes_to_the_first_free_gpu_only_when_there_is_a_choice():
    got = probe(request(), nvswitch8(), policy(), leased=lambda: frozenset({0, 1}))
    assert (got.unavailable, got.measure, got.profile_gpu, got.reasons) == \
        (frozenset({0, 1}), True, 2, ())
    # One GPU left, a forced strategy or --no-python: nothing to choose, no dry run.
    assert probe(request(), nv_pair(), policy(), leased=lambda: frozenset({0})).profile_gpu is None
    assert probe(request(strategy="single"), nvswitch8(), policy(),
                 leased=frozenset).profile_gpu is None
    assert probe(request(no_python=True), nvswitch8(), policy(),
                 leased=frozenset).profile_gpu is None
