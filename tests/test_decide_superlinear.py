"""Measured speedups above N× on N GPUs are checked before they are shown: the one-GPU rate
is measured again by a trial, and what still stands says "superlinear" and why."""
from __future__ import annotations

from helpers_decide import FakeTrial, dual_socket, profile, request
from test_decide_choice import run

from smartlaunch.decide import Strategy
from smartlaunch.decide.explain import decision_line
from smartlaunch.strategies import REGISTRY

# 2.4 ms steps over 1.2 s: the dry run's window stands for the one-GPU trial (26,667 samples/s)
LONG = dict(steps_measured=500, window_s=1.2)


def _text(plan) -> str:
    return " ".join(r.text for r in plan.reasons) + " " + " ".join(c.reason for c in plan.candidates)


def test_a_superlinear_trial_against_the_dry_run_measures_one_gpu_again(clean_env):
    trial = FakeTrial({("single", 1): 30_000.0, ("ddp", 2): 64_000.0})   # 2.4× of the dry run
    plan, _ = run(dual_socket(), profile(**LONG), req=request(max_gpus=2), trial=trial)
    assert [c.strategy for c in trial.calls] == [Strategy.DDP, Strategy.SINGLE]
    ddp = next(c for c in plan.candidates if c.strategy == Strategy.DDP)
    assert ddp.measured and abs(ddp.speedup - 64_000 / 30_000) < 1e-9     # 2.13×, not 2.40×
    assert "one GPU measured again by a trial: 30,000 samples/s (its dry run gave 26,667" \
        in _text(plan), _text(plan)
    assert "superlinear on" in decision_line(plan, REGISTRY)                # 2.13 > 2.1


def test_a_one_gpu_trial_that_agrees_with_the_dry_run_leaves_a_number_with_its_why(clean_env):
    trial = FakeTrial({("single", 1): 26_000.0, ("ddp", 2): 64_000.0})
    plan, _ = run(dual_socket(), profile(**LONG), req=request(max_gpus=2), trial=trial)
    text = _text(plan)
    assert "still superlinear against it" in text and "held back" in text, text
    ddp = next(c for c in plan.candidates if c.strategy == Strategy.DDP)
    assert "[superlinear: 2.46× on 2 GPUs;" in ddp.reason, ddp.reason


def test_an_ordinary_speedup_runs_no_second_trial_and_says_nothing_of_it(clean_env):
    trial = FakeTrial({("single", 1): 30_000.0, ("ddp", 2): 45_000.0})
    plan, _ = run(dual_socket(), profile(**LONG), req=request(max_gpus=2), trial=trial)
    assert [c.strategy for c in trial.calls] == [Strategy.DDP]
    assert "superlinear" not in _text(plan) + decision_line(plan, REGISTRY)


def test_a_trial_that_gave_nothing_is_named_with_its_reason(clean_env):
    trial = FakeTrial({("single", 1): 1000.0})
    trial.why = {(Strategy.DDP, (0, 1)): "killed as stalled: its ranks did not all reach step 4 "
                                         "within 10 s"}
    plan, _ = run(dual_socket(), profile(), req=request(max_gpus=2), trial=trial)
    assert "no measurement for DDP×2 (killed as stalled: its ranks did not all reach step 4" \
        in _text(plan), _text(plan)
