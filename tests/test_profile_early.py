"""The dry run's process started before the command line is parsed (profile/early.py): real
processes, a fake two-GPU topology, the CPU."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers_common import fixture_path, wait_until
from test_warm import private_tmp, tagged_left

from smartlaunch.profile import early

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "profile_early_dump.py")
POLICY = "decision:\n  min_efficiency: 0.5\n  trials: false\ndryrun:\n  warmup_steps: 1\n"


def plan_with(clean_env, shared_dir, policy_text=POLICY, *, first=None, **env):
    """early.start as the CLI calls it (cores given), then the pipeline as the CLI runs it."""
    from smartlaunch.pipeline import make_plan
    from smartlaunch.request import Request
    policy = clean_env / "policy.yaml"
    policy.write_text(policy_text)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
               "ENV_DUMP": str(shared_dir), **env}
    argv = ["--policy", str(policy), "--explain=json", SCRIPT]
    e = early.start(argv, environ, cores=8) if first is None else first(environ)
    started = e.child.pid if e is not None and e.child is not None else None
    plan, _, _ = make_plan(Request(script=SCRIPT, explain="json", policy_path=str(policy)),
                           set(), environ, cores=2, early=e)
    return plan, e, started


def settled(tmp: Path) -> None:
    wait_until(lambda: tagged_left() == [] and not [
        p for p in tmp.iterdir() if p.name.startswith("smartlaunch-")], what="nothing left")


def test_the_dry_run_runs_in_the_process_started_before_the_parse(clean_env, shared_dir,
                                                                  monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, e, started = plan_with(clean_env, shared_dir)
    assert plan.profile.status.value == "ok", plan.to_json()
    dry = json.loads((shared_dir / "dry.json").read_text())
    assert dry["pid"] == started and "smartlaunch.warm" in dry["cmdline"]
    assert dry["cuda"].startswith("GPU-") and dry["dryrun"] == "1"   # set at the go
    log = plan.profile.note.split("script output: ")[1].split(")")[0]
    assert f"early-dump pid {started}" in Path(log).read_text()  # its stdout reached the log
    settled(tmp)


def test_prestart_false_starts_none_and_the_dry_run_starts_cold(clean_env, shared_dir,
                                                                monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, e, _ = plan_with(clean_env, shared_dir,
                           POLICY.replace("trials: false\n", "trials: false\n  prestart: false\n"))
    assert e is None
    assert "smartlaunch.warm" not in json.loads((shared_dir / "dry.json").read_text())["cmdline"]
    assert plan.profile.status.value == "ok"
    settled(tmp)


def test_one_isolated_otherwise_than_the_dry_run_is_killed_unused(clean_env, shared_dir,
                                                                  monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, e, started = plan_with(
        clean_env, shared_dir, POLICY + "  isolation: off\n",
        first=lambda environ: early.EarlyDryRun(environ, isolated=True))
    dry = json.loads((shared_dir / "dry.json").read_text())
    assert dry["pid"] != started and "smartlaunch.warm" not in dry["cmdline"]
    assert plan.profile.status.value == "ok"
    settled(tmp)


def test_a_command_line_with_a_stored_profile_starts_none(clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan_with(clean_env, shared_dir)
    (shared_dir / "dry.json").unlink()
    plan, e, _ = plan_with(clean_env, shared_dir)          # the same command, the same cwd
    assert plan.profile.cached and not (shared_dir / "dry.json").exists()
    assert e is None
    argv = ["--policy", str(clean_env / "policy.yaml"), SCRIPT, "--lr", "0.1"]
    for other in (argv, [*argv[:2], "--reprofile", *argv[2:3]]):   # other args; --reprofile
        e = early.start(other, dict(os.environ), cores=8)
        assert e is not None
        e.close()
    settled(tmp)


def test_a_cache_hit_it_did_not_foresee_leaves_it_unused_and_gone(clean_env, shared_dir,
                                                                  monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan_with(clean_env, shared_dir)
    for marker in (clean_env / "home" / ".cache").rglob("seen/*"):
        marker.unlink()                  # a profile stored before the hint existed
    (shared_dir / "dry.json").unlink()
    plan, e, started = plan_with(clean_env, shared_dir)
    assert plan.profile.cached and not (shared_dir / "dry.json").exists()
    assert started is not None and e.child is None
    settled(tmp)


def test_a_usage_error_kills_it(clean_env, monkeypatch, capsys):
    tmp = private_tmp(clean_env, monkeypatch)
    made, start = [], early.start

    def spy(argv, environ, cores=None):
        made.append(start(argv, environ, cores=8))
        return made[-1]
    monkeypatch.setattr(early, "start", spy)
    from smartlaunch.cli import main
    assert main(["--nproc-per-node", "0", SCRIPT]) == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert made and made[0] is not None and made[0].child is None
    settled(tmp)


@pytest.mark.parametrize("argv,cores", [
    (["--strategy", "ddp", "t.py"], 8), (["--strategy=single", "t.py"], 8),
    (["--help"], 8), (["--no-python", "t"], 8), (["t.py"], 2)])
def test_no_dry_run_in_sight_or_no_core_to_spare_starts_none(clean_env, argv, cores):
    assert early.start(argv, dict(os.environ), cores=cores) is None


def test_with_the_warm_pools_its_gate_lies_where_its_sandbox_sees_it(clean_env, shared_dir,
                                                                     monkeypatch):
    """The early sweep runs and the gate file goes in the early process's shared result dir:
    the dry run passes its gate (a gate it could not see would hold it to its time limit)."""
    from smartlaunch import pipeline_pools
    tmp = private_tmp(clean_env, monkeypatch)
    gates, start = [], pipeline_pools.start

    def spy(*a, **k):
        pools = start(*a, **{**k, "cores": 16})
        gates.append(pools.gate)
        return pools
    monkeypatch.setattr(pipeline_pools, "start", spy)
    plan, e, started = plan_with(clean_env, shared_dir)
    assert plan.profile.status.value == "ok", plan.to_json()
    assert json.loads((shared_dir / "dry.json").read_text())["pid"] == started
    assert gates[0] is not None and "/result/" in gates[0]
    assert plan.profile.gate_wait_s is not None and plan.profile.gate_wait_s < 60
    assert plan.timings["allreduce_early"] > 0
    settled(tmp)


def test_the_early_trial_is_sized_as_the_pools_will_want_it():
    """One function sizes the DDP trial before the parse and after it: the usable GPUs, the
    --nproc-per-node cap and the policy's world sizes, so neither starts ranks the other
    kills."""
    from smartlaunch.policy.api import DecisionPolicy
    d = DecisionPolicy()
    assert [d.early_group(g, None) for g in (1, 2, 3, 4, 7, 8)] == [1, 2, 2, 4, 4, 8]
    assert d.early_group(4, 2) == 2 and d.early_group(8, 3) == 2
    assert d.early_group(8, 3, explicit_ddp=True) == 3       # --strategy ddp runs its own N
    assert DecisionPolicy(max_gpus=2).early_group(8, None) == 2


def test_before_the_parse_nproc_per_node_caps_the_early_trial(clean_env, monkeypatch):
    sized = []
    monkeypatch.setattr(early.EarlyDryRun, "start_trial",
                        lambda self, environ, size, python=None: sized.append(size))
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("nvswitch-8gpu")}
    for argv, want in ((["train.py"], [8]), (["--nproc-per-node", "4", "train.py"], [4]),
                       (["--nproc_per_node=3", "train.py"], [2]),
                       (["--nproc-per-node", "1", "train.py"], [])):
        sized.clear()
        e = early.start(argv, environ, cores=64)
        try:
            assert sized == want, (argv, sized)
        finally:
            if e is not None:
                e.close()
