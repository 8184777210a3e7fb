"""A trial set up beside the dry run (issue 15, item 7): its warm ranks get their go with the
dry run's and stop at a gate before their first forward until the decision asks
(profile.trial.TrialSetup.start_early, profile/gate.py, pipeline_pools.Gate). Real processes,
gloo ranks on the CPU, a fake two-GPU topology."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from test_warm import cold_plan, private_tmp, tagged_left

pytestmark = pytest.mark.timeout(240)
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "decide" / "setup_stamps.py")
# A wide band around a low floor: the decision asks for the DDP trial for any prediction of
# 8-75% efficiency (at 0.5 a loaded CPU once predicted 16%, just outside the band).
POLICY = "decision:\n  min_efficiency: 0.25\n  uncertainty_band: 2.0\n  trial_steps: 3\n" \
         "dryrun:\n  warmup_steps: 1\n  measure_steps: 3\n"


def read(d: Path, name: str) -> dict:
    return json.loads((d / f"{name}.json").read_text())


@pytest.mark.slow
def test_the_trial_sets_itself_up_beside_the_dry_run_and_steps_when_asked(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, _, _ = cold_plan(clean_env, SCRIPT, POLICY, ENV_DUMP=str(shared_dir), SETUP_S="2")
    timings = plan.timings
    assert [c for c in plan.to_dict()["candidates"] if c.get("measured")], plan.to_json()
    dry, ranks = read(shared_dir, "dry0"), [read(shared_dir, f"trial{r}") for r in (0, 1)]
    for r in ranks:
        assert "smartlaunch.warm" in r["cmdline"]             # the warm ranks, not cold ones
        assert r["set_up"] < dry["first_forward"]              # set up before the dry run stepped
        assert r["first_forward"] > dry["first_forward"]       # held until the decision asked
    # What the decision waited for: not the trial's 2 s set-up again, only its steps.
    assert timings["trials_setup"] < 2.0 <= timings["profile"]
    time.sleep(0.3)
    assert tagged_left() == []
    assert list(tmp.iterdir()) == []


@pytest.mark.slow
def test_a_dry_run_out_of_memory_beside_the_trial_runs_again_alone(clean_env, shared_dir):
    import io
    from smartlaunch.statusline import StatusLine
    err = io.StringIO()
    plan, _, _ = cold_plan(clean_env, SCRIPT, POLICY, status=StatusLine(err, tty=False),
                           ENV_DUMP=str(shared_dir), OOM_ONCE="1")
    assert (shared_dir / "oom-once").exists() and (shared_dir / "dry0.json").exists()
    assert plan.to_dict()["profile"]["status"] == "ok"
    err = err.getvalue()
    assert err.count("ran out of GPU memory beside the trial set up with it; running it "
                     "again alone") == 1
    time.sleep(0.3)
    assert tagged_left() == []


def test_without_a_trial_set_up_early_a_dry_run_out_of_memory_fails(clean_env, shared_dir):
    from smartlaunch.errors import DryRunError
    with pytest.raises(DryRunError) as err:
        cold_plan(clean_env, SCRIPT, POLICY.replace("trial_steps: 3\n", "trials: false\n"),
                  ENV_DUMP=str(shared_dir), OOM_ONCE="now")
    assert err.value.out_of_memory


class StandIn:
    """A trial started early whose ranks reach their gate after `arrive_s` (None: never)."""

    def __init__(self, arrive_s):
        self.early, self.t0, self.arrive_s, self.closed = {}, time.monotonic(), arrive_s, None

    def arrived(self):
        return self.arrive_s is not None and time.monotonic() - self.t0 >= self.arrive_s

    @property
    def alive(self):
        return self.closed is None

    def close(self):
        self.closed = self.closed or time.monotonic() - self.t0


def gate_opened(pools, limit=30.0) -> float:
    t0 = time.monotonic()
    while not os.path.exists(pools.gate) and time.monotonic() - t0 < limit:
        time.sleep(0.01)
    return time.monotonic() - t0


def test_the_dry_runs_gate_opens_when_the_trials_ranks_wait_at_theirs(clean_env):
    from smartlaunch.pipeline_pools import Gate, Pools
    trial = StandIn(arrive_s=1.0)
    pools = Pools(trial=trial)
    pools.keeper = Gate(pools)
    try:
        assert 0.9 <= gate_opened(pools) < 30
        assert trial.closed is None                 # kept for the decision
    finally:
        pools.close()


def test_a_trial_slower_than_the_cap_is_killed_before_the_dry_run_steps(clean_env, monkeypatch):
    from smartlaunch import pipeline_pools
    from smartlaunch.profile import gate
    monkeypatch.setattr(pipeline_pools, "READY_LIMIT_S", 1.0)
    trial = StandIn(arrive_s=None)
    pools = pipeline_pools.Pools(trial=trial)
    pools.keeper = pipeline_pools.Gate(pools)
    # The dry run reaches its gate 0.3 s after the go: it then waits at most 1 s (the cap).
    threading.Timer(0.3, lambda: open(gate.marker(pools.gate, 0), "x").close()).start()
    try:
        waited = gate_opened(pools)
        assert 1.2 <= waited < 5
        assert trial.closed is not None and trial.closed <= waited + 0.05
        assert pools.keeper.dropped == "its set-up outlasted the dry run's wait"
    finally:
        pools.close()


def test_a_trials_gate_carries_its_step_count(tmp_path):
    import torch
    from smartlaunch.profile import gate
    from smartlaunch.profile.dryrun import Recorder
    path = str(tmp_path / "gate")
    rec = Recorder(str(tmp_path / "p.json"), warmup=1, measure=20, gate=path)
    threading.Timer(0.5, gate.open_gate, (path, {"measure": 7})).start()
    rec.on_pre(torch.nn.Linear(4, 2), (torch.zeros(3, 4),))
    assert os.path.exists(gate.marker(path, os.environ.get("RANK", "0")))
    assert rec.measure == 7 and rec.gate_wait_s >= 0.45


def test_a_held_sweep_measures_only_once_released(clean_env, monkeypatch):
    """Beside a trial setting itself up, the sweep's ranks join their group and wait: its
    curve comes only after `release` (Gate releases it once the trial waits at its gate)."""
    from helpers_common import fixture_path
    from smartlaunch import proc
    from smartlaunch.pipeline_pools import EarlySweep
    from smartlaunch.policy.api import Policy
    from smartlaunch.profile.comm import rank_base_env
    from smartlaunch.topology import discover
    from smartlaunch.warm import WarmPool
    tmp = private_tmp(clean_env, monkeypatch)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}
    pool = WarmPool(2, rank_base_env(environ, "cpu"))
    pids = [c.pid for c, _ in pool.free]
    sweep = EarlySweep(pool, discover(environ), (0, 1), Policy(), environ, hold=True)
    try:
        deadline = time.monotonic() + 120        # both ranks joined and wait at the hold
        while not all(os.path.exists(f"{sweep.hold}.waiting.{r}") for r in (0, 1)):
            assert time.monotonic() < deadline and sweep.thread.is_alive(), sweep.error
            time.sleep(0.05)
        time.sleep(1.0)
        assert sweep.thread.is_alive() and sweep.result is None and sweep.at is None
        sweep.release()
        curve = sweep.curve((0, 1))
        assert curve is not None and len(curve.points) >= 2, sweep.error
    finally:
        sweep.close()
    assert not any(proc.proc_state(p).alive for p in pids)
    time.sleep(0.3)
    assert tagged_left() == [] and list(tmp.iterdir()) == []


def test_the_early_trial_is_killed_first_when_memory_runs_low(clean_env, monkeypatch):
    from smartlaunch import pipeline_pools
    low_at = time.monotonic() + 0.5
    monkeypatch.setattr(pipeline_pools, "memory_low", lambda: time.monotonic() >= low_at)
    trial = StandIn(arrive_s=None)
    pools = pipeline_pools.Pools(trial=trial)
    pools.keeper = pipeline_pools.Gate(pools)
    try:
        assert gate_opened(pools) < 5          # no dry run came: only the memory ended it
        assert trial.closed is not None and 0.4 <= trial.closed < 2
        assert pools.keeper.dropped == "host memory ran low"
    finally:
        pools.close()


def test_memory_low_reads_the_share_left(clean_env):
    from smartlaunch.pipeline_pools import memory_low
    assert memory_low(1.0) and not memory_low(0.0)


def early_then_plan(clean_env, shared_dir, monkeypatch, plan_policy: str = POLICY):
    """early.start as the CLI calls it (a policy with trials on), then the pipeline with
    plan_policy; the TrialSetups constructed meanwhile, in order."""
    from helpers_common import fixture_path
    from smartlaunch.pipeline import make_plan
    from smartlaunch.profile import early
    from smartlaunch.profile.trial import TrialSetup
    from smartlaunch.request import Request
    made, init = [], TrialSetup.__init__

    def spy(self, *a, **k):
        made.append(self)
        return init(self, *a, **k)
    monkeypatch.setattr(TrialSetup, "__init__", spy)
    first, second = clean_env / "first.yaml", clean_env / "second.yaml"
    first.write_text(POLICY)
    second.write_text(plan_policy)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
               "ENV_DUMP": str(shared_dir)}
    e = early.start(["--policy", str(first), "--explain=json", SCRIPT], environ, cores=16)
    spawned = list(made)
    plan, _, _ = make_plan(Request(script=SCRIPT, explain="json", policy_path=str(second)),
                           set(), environ, cores=16, early=e)
    return plan, spawned, made


@pytest.mark.slow
def test_the_trials_ranks_spawned_before_the_parse_run_the_trial(clean_env, shared_dir,
                                                                  monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, spawned, made = early_then_plan(clean_env, shared_dir, monkeypatch)
    assert len(spawned) == 1 and spawned[0].size == 2       # before the parse
    assert made == spawned                                   # and no other was started
    assert [c for c in plan.to_dict()["candidates"] if c.get("measured")], plan.to_json()
    dry, ranks = read(shared_dir, "dry0"), [read(shared_dir, f"trial{r}") for r in (0, 1)]
    assert all(r["set_up"] < dry["first_forward"] for r in ranks)
    time.sleep(0.3)
    assert tagged_left() == [] and list(tmp.iterdir()) == []


@pytest.mark.slow
def test_trial_ranks_spawned_before_the_parse_that_no_trial_needs_are_killed(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, spawned, made = early_then_plan(clean_env, shared_dir, monkeypatch,
                                          POLICY.replace("trial_steps: 3\n", "trials: false\n"))
    assert len(spawned) == 1 and made == spawned
    assert not [c for c in plan.to_dict()["candidates"] if c.get("measured")]
    assert not (shared_dir / "trial0.json").exists()
    time.sleep(0.3)
    assert tagged_left() == [] and list(tmp.iterdir()) == []


@pytest.mark.slow
def test_a_trial_set_up_early_that_the_decision_never_asks_for_is_killed(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    # No band: the model's prediction decides and no trial is run.
    plan, _, _ = cold_plan(clean_env, SCRIPT, POLICY.replace("uncertainty_band: 2.0",
                                                             "uncertainty_band: 0.0"),
                           ENV_DUMP=str(shared_dir))
    assert not [c for c in plan.to_dict()["candidates"] if c.get("measured")], plan.to_json()
    assert (shared_dir / "started0").exists()            # its ranks had started the script
    assert not (shared_dir / "trial0.json").exists()     # and never passed their gate
    time.sleep(0.3)
    assert tagged_left() == [] and list(tmp.iterdir()) == []
