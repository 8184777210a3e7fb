"""The pipeline's glue: leases around single/DDP launches, Slurm notes in the plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers_common import fixture_path, own_lines

from smartlaunch.launch.leases import LeaseManager
from smartlaunch.topology import discover

FAKE = {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}


def smartlaunch(args, cwd, env_extra=None):
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd,
                          env={**os.environ, **FAKE, **(env_extra or {})},
                          capture_output=True, text=True, timeout=120)


def _envdump(tmp):
    script = tmp / "envdump.py"
    script.write_text("import os, sys\nopen(sys.argv[1], 'w').write("
                      "os.environ.get('CUDA_VISIBLE_DEVICES', '-'))\n")
    return script


def test_all_gpus_leased_with_no_wait_fails_naming_the_holder(clean_env):
    topo = discover({**os.environ, **FAKE})
    out = clean_env / "gpu.txt"
    with LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]) as m, \
            m.acquire(topo, [0, 1], 2, wait=False, timeout_s=0):
        r = smartlaunch(["--strategy", "single", "--no-wait", str(_envdump(clean_env)),
                         str(out)], clean_env)
    assert r.returncode == 6, r.stderr
    lines = own_lines(r.stderr)
    assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0], r.stderr
    assert not out.exists()


@pytest.mark.parametrize("strategy", ["single", "independent", "ddp"])
def test_a_failed_hold_announces_nothing_and_leaves_no_run_directory(clean_env, strategy):
    # Every launcher holds its GPUs first, then prints the decision line and creates its run
    # directory: --no-wait on a node whose GPUs another launch holds gives the one error line.
    topo = discover({**os.environ, **FAKE})
    out = clean_env / "gpu.txt"
    with LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]) as m, \
            m.acquire(topo, [0, 1], 2, wait=False, timeout_s=0):
        each = ["--each", "a", "--each", "b"] if strategy == "independent" else []
        r = smartlaunch(["--strategy", strategy, *each, "--no-wait", str(_envdump(clean_env)),
                         str(out)], clean_env)
    assert r.returncode == 6, r.stderr
    lines = own_lines(r.stderr)
    assert len(lines) == 1 and "leased by" in lines[0], r.stderr
    logs = clean_env / "home" / ".cache" / "smartlaunch" / "logs"
    assert [p for p in logs.glob("*") if p.is_dir()] == []       # no run directory
    assert not out.exists()


def test_single_launch_takes_the_gpu_another_launch_left_free(clean_env):
    topo = discover({**os.environ, **FAKE})
    out = clean_env / "gpu.txt"
    with LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]) as m, \
            m.acquire(topo, [0], 1, wait=False, timeout_s=0):
        r = smartlaunch(["--strategy", "single", "--no-wait", str(_envdump(clean_env)),
                         str(out)], clean_env)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == topo.gpu(1).uuid


def test_plan_says_when_it_uses_fewer_gpus_than_slurm_allocated(clean_env):
    (clean_env / "t.py").write_text("")
    slurm = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1",
             "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_GPUS": "0,1",
             "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    r = smartlaunch(["--explain=json", "--strategy", "single", "t.py"], clean_env, slurm)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    texts = [x["text"] for x in plan["reasons"]]
    assert any("uses 1 of the 2 GPUs Slurm allocated" in t for t in texts), texts
    assert plan["left_free"] == [1]


@pytest.mark.slow
def test_plan_shows_what_each_stage_of_the_decision_cost(clean_env):
    # A cold decision: the dry run is timed under profile, the all-reduce benchmark under
    # allreduce; the warm one reads both from the cache and says so in its timings.
    script = os.path.join(os.path.dirname(__file__), "scripts", "tiny_train.py")
    args = ["--explain=json", "--nproc-per-node", "2", script, "--batch-size", "8"]
    cold = json.loads(smartlaunch(args, clean_env).stdout)["timings"]
    stages = ("policy", "topology", "leases", "profile", "allreduce", "decide")
    assert set(stages) <= set(cold)
    assert cold["profile"] > 0.5                          # a real dry run of the script
    assert cold["total"] >= sum(cold[k] for k in stages) * 0.99
    assert cold["since_process_start"] > cold["total"]    # imports come before the clock
    r = smartlaunch(["--explain", *args[1:]], clean_env)
    warm_text = r.stdout
    assert r.returncode == 0, r.stderr
    line = [x for x in warm_text.splitlines() if x.startswith("decided in ")]
    assert len(line) == 1 and "since the command started" in line[0]
    warm = json.loads(smartlaunch(args, clean_env).stdout)["timings"]
    # with 4+ cores the cold sweep ran beside the dry run (driver.Driver._start_early): its own seconds
    swept = cold["allreduce"] + cold.get("allreduce_early", 0.0)
    assert warm["profile"] < cold["profile"] / 5 and warm["allreduce"] < swept
