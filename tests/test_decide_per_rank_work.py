"""A script that sizes its work by the world size: the plan says what it assumes, a trial settles."""
from __future__ import annotations

import dataclasses

from helpers_decide import TEST_MODEL, FakeComm, FakeTrial, nv_pair, policy, profile, request
from smartlaunch.decide import Strategy
from helpers_decide import decide
from smartlaunch.decide.explain import render_text
from smartlaunch.strategies import REGISTRY

GPT = dict(params=163_000_000, step_ms=21.0, batch=32, micro_batches=4, micro_batch_size=8)
WHERE = "train.py:89 (reads WORLD_SIZE)"


def plan_for(prof, trial=None, pol=None):
    topo = nv_pair()
    return decide(request(), topo, pol or policy(), prof, units=REGISTRY,
                  comm_for=FakeComm(topo), trial=trial,
                  model=TEST_MODEL)


def test_model_alone_decides_when_the_script_ignores_the_world_size(clean_env):
    trial = FakeTrial({("single", 1): 1000.0, ("ddp", 2): 1900.0})
    # A threshold far outside the model's error band of the prediction (~96% efficiency).
    plan = plan_for(profile(**GPT), trial, policy(min_efficiency=0.5))
    assert plan.strategy == Strategy.DDP and trial.calls == []
    text = render_text(plan, REGISTRY)
    assert "batch 32 per step (4 micro-batches of 8)" in text
    assert "per-rank work" not in text


def test_world_size_read_asks_for_a_trial_and_explains_the_assumption(clean_env):
    # nanoGPT under DDP×2 halves its accumulation: each rank does 16 samples per step, so
    # the measured DDP rate is about one GPU's, whatever the model predicts.
    trial = FakeTrial({("single", 1): 1000.0, ("ddp", 2): 1050.0})
    plan = plan_for(profile(**GPT, reads_world_size=WHERE), trial)
    assert [c.strategy for c in trial.calls] == [Strategy.SINGLE, Strategy.DDP]
    assert plan.strategy == Strategy.SINGLE
    text = render_text(plan, REGISTRY)
    assert "per-rank work: the script's own code asks for the world size" in text
    assert WHERE in text and "a measured trial settles it" in text
    assert "predictions assume torchrun's semantics" in text
    assert any("reads the world size before its first step" in r.text for r in plan.reasons)


def test_reading_the_world_size_without_accumulating_is_explained_not_trialled(clean_env):
    # What every DDP-ready script does (init DDP, size a sampler): no trial for that alone.
    trial = FakeTrial({("single", 1): 1000.0, ("ddp", 2): 1050.0})
    prof = profile(**{**GPT, "batch": 8, "micro_batches": 1}, reads_world_size=WHERE)
    assert not prof.work_depends_on_world_size
    plan = plan_for(prof, trial, policy(min_efficiency=0.5))   # far outside the model's band
    assert trial.calls == [] and plan.strategy == Strategy.DDP
    text = render_text(plan, REGISTRY)
    assert "per-rank work: the script's own code asks for the world size" in text
    assert "predictions assume torchrun's semantics" in text and "trial settles" not in text


def test_world_size_read_without_trials_says_the_prediction_assumes_it(clean_env):
    plan = plan_for(profile(**GPT, reads_world_size=WHERE), trial=None)
    assert plan.strategy == Strategy.DDP
    assert any("assuming each rank does the profiled work" in r.text for r in plan.reasons)


def test_cut_short_window_is_shown_as_low_confidence(clean_env):
    prof = dataclasses.replace(profile(**GPT), window_cut_short=True, steps_measured=7,
                               timing="cuda events")
    assert prof.low_confidence and not profile(**GPT).low_confidence
    text = render_text(plan_for(prof), REGISTRY)
    assert "[ok, 7 steps, cuda events]" in text
    assert "confidence: low: the script ended before the measurement window was complete" in text
