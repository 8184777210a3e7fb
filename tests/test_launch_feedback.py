"""Measured launches feed back: the next plan of the same job prefers them to predictions.

CPU, gloo, the fake NV18 pair: real single and DDP×2 launches count their steps; a DDP launch
below the policy's efficiency ends with one line of advice, and the next plan follows it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_common import fixture_path
from smartlaunch.policy.api import Policy
from smartlaunch.profile import feedback

pytestmark = pytest.mark.timeout(400)

SCRIPT = str(Path(__file__).parent / "scripts" / "feedback_train.py")
FAKE = fixture_path("h200-nv18-pair")


def smartlaunch(args, cwd, sleep_ms):
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": FAKE, "SLEEP_MS": str(sleep_ms)}
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def plan(cwd):
    r = smartlaunch(["--explain=json", SCRIPT, "--steps", "60"], cwd, 20)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.slow
def test_measured_launches_are_used_by_the_next_plan(clean_env):
    before = plan(clean_env)       # cold: dry run + all-reduce; the model alone decides
    assert before["strategy"] == "ddp", before["reasons"]

    single = smartlaunch(["--strategy", "single", SCRIPT, "--steps", "60"], clean_env, 20)
    assert single.returncode == 0, single.stderr[-2000:]
    assert "ran at" not in single.stderr
    ddp = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", SCRIPT, "--steps", "60"],
                      clean_env, 60)   # each rank 3× as slow: DDP×2 gives ~0.7× one GPU
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    advice = [ln for ln in ddp.stderr.splitlines() if " ran at " in ln]
    assert len(advice) == 1, ddp.stderr[-2000:]
    assert advice[0].startswith("smartlaunch: DDP×2 ran at ")
    assert "below the policy's 70%; one GPU from a single-GPU launch" in advice[0]
    assert advice[0].endswith("the next launch of this job will run on one GPU")

    after = plan(clean_env)
    assert after["strategy"] == "single"
    why = " ".join(r["text"] for r in after["reasons"])
    assert "measured by earlier launches of this job, preferred over predictions" in why
    assert "DDP×2 on GPUs 0,1 ran at" in why and "→ single GPU0" in why
    ddp_row = [c for c in after["candidates"] if c["strategy"] == "ddp"][0]
    assert ddp_row["measured"] and 0.3 < ddp_row["speedup"] < 1.4
    text = smartlaunch(["--explain", SCRIPT, "--steps", "60"], clean_env, 20).stdout
    assert "measured by earlier launches" in text and "chosen (launch)" in text


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_a_launch_that_shared_its_gpu_keeps_no_rate(clean_env, strategy):
    """Another user's process appears on GPU 0 mid-run: the run's rate says as much about it as
    about the plan (taking turns, a DDP×2 run read 0.14× one GPU on 2× H100, and the next plan
    ran on one GPU), so none is kept and one line says why."""
    fixture = clean_env / "topo.json"
    fixture.write_text(Path(FAKE).read_text())
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": str(fixture), "SLEEP_MS": "20",
           "TENANT_FIXTURE": str(fixture)}
    n = ["--nproc-per-node", "2"] if strategy == "ddp" else []
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", strategy, *n,
                        SCRIPT, "--steps", "80"], cwd=clean_env, env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [ln for ln in r.stderr.splitlines() if "shared its GPUs" in ln]
    assert line == ["smartlaunch: this run shared its GPUs (GPU 0 with pid 4242 (user mallory)): "
                    "its step rate is not kept for the next plan of this job"], r.stderr[-2000:]
    assert not list(clean_env.glob("home/.cache/smartlaunch/launches/*")), "a rate was kept"
    # the same launch alone keeps its rate
    fixture.write_text(Path(FAKE).read_text())
    env.pop("TENANT_FIXTURE")
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", strategy, *n,
                        SCRIPT, "--steps", "80"], cwd=clean_env, env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0 and "shared its GPUs" not in r.stderr, r.stderr[-2000:]
    assert list(clean_env.glob("home/.cache/smartlaunch/launches/*"))


def test_a_trial_that_shared_its_gpus_is_no_measurement(clean_env, shared_dir):
    """Another user's process comes onto GPU 0 during the DDP×2 trial: the trial is no
    measurement (nothing kept), and the decision says why. (The fixture sits where the trial's
    sandbox lets its writes through.)"""
    fixture = shared_dir / "topo.json"
    fixture.write_text(Path(FAKE).read_text())
    policy = clean_env / "trial.yaml"
    policy.write_text("decision:\n  min_efficiency: 0.9\n  uncertainty_band: 0.5\n")  # a trial
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": str(fixture), "SLEEP_MS": "20",
           "TENANT_FIXTURE": str(fixture), "TENANT_WORLD": "2", "TENANT_STEP": "1"}
    argv = [sys.executable, "-m", "smartlaunch.cli", "--explain=json", "--policy", str(policy),
            "--nproc-per-node", "2", SCRIPT, "--steps", "60"]
    r = subprocess.run(argv, cwd=clean_env, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    why = " ".join(x["text"] for x in json.loads(r.stdout)["reasons"])
    assert "no measurement for DDP×2 (another process came onto its GPUs (GPU 0 with pid 4242 " \
           "(user mallory)))" in why, why
    assert not list(clean_env.glob("home/.cache/smartlaunch/trials/*"))
    fixture.write_text(Path(FAKE).read_text())     # the same trial alone measures
    r = subprocess.run(argv + [], cwd=clean_env, env={**env, "TENANT_FIXTURE": ""},
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "another process" not in r.stdout and list(clean_env.glob("home/.cache/smartlaunch/trials/*"))


def test_a_dry_run_that_shared_its_gpu_is_used_once_and_not_kept(clean_env, shared_dir):
    fixture = shared_dir / "topo.json"
    fixture.write_text(Path(FAKE).read_text())
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": str(fixture), "SLEEP_MS": "20",
           "TENANT_FIXTURE": str(fixture), "TENANT_WORLD": "1", "TENANT_STEP": "1"}
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--explain=json",
                        "--nproc-per-node", "2", SCRIPT, "--steps", "60"], cwd=clean_env,
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    profile = json.loads(r.stdout)["profile"]
    assert profile["status"] == "ok" and profile["step_time_s"], profile
    assert profile["note"].endswith("another process came onto the GPU during the dry run (GPU 0 "
                                    "with pid 4242 (user mallory)): its figures are used this "
                                    "once, not cached"), profile["note"]
    assert not list(clean_env.glob("home/.cache/smartlaunch/profiles/*.json"))


def test_short_launches_and_other_jobs_record_nothing(clean_env):
    assert feedback.measured_rate("single", (0,), feedback.MIN_STEPS - 1, 5.0, {}) is None
    assert feedback.measured_rate("single", (0,), 100, 0.5, {}) is None
    r = feedback.measured_rate("ddp", (0, 1), 101, 2.0, {"batch_size": 8, "micro_batches": 2,
                                                        "reads_world_size": "t.py:3"})
    assert r.steps_per_s == pytest.approx(50.0) and r.rank_steps_per_s == pytest.approx(100.0)
    assert r.samples_per_s == pytest.approx(800.0) and "torchrun's semantics" in r.assumed
    policy = Policy()
    feedback.store_rate(policy, "k1", r, os.environ)
    assert feedback.load_rates(policy, "k1", os.environ)["ddp:0,1"] == r
    assert feedback.load_rates(policy, "k2", os.environ) == {}
