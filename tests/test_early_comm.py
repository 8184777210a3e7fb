"""The all-reduce sweep a cold decision starts with its dry run (pipeline_pools.EarlySweep) and
the dry run's gate (profile/dryrun.py --gate): real processes, gloo ranks on the CPU, a fake
two-GPU topology."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from helpers_common import fixture_path, wait_until
from test_warm import cold_plan, private_tmp, tagged_left

from smartlaunch import proc

pytestmark = pytest.mark.timeout(240)
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "stamped_train.py")
# No trials: the sweep is the only pool, and the dry run the only run of the script.
POLICY = "decision:\n  min_efficiency: 0.5\n  trials: false\n" \
         "dryrun:\n  warmup_steps: 1\n  measure_steps: 3\n"


def stamps(shared_dir: Path) -> dict:
    path = shared_dir / "stamps.json"
    return json.loads(path.read_text()) if path.exists() else {}


ENDED = "the sweep's ranks, threads and temp dirs to end"


def early_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "smartlaunch-early-allreduce"]


def test_the_gate_holds_the_first_forward_until_its_file_exists(clean_env, shared_dir):
    from smartlaunch.policy.api import DryRunPolicy, Policy
    from smartlaunch.profile.runner import run_dry_run
    from smartlaunch.request import Request
    gate_dir = clean_env / "gate dir; 'quoted'"     # shared with the sandbox: runner keeps it
    gate_dir.mkdir()
    gate = gate_dir / "swept"
    opened = {}

    def open_late():       # 3 s after the script reached its first forward
        deadline = time.time() + 120
        while "before_forward" not in stamps(shared_dir) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(3.0)
        opened["at"] = time.time()
        gate.touch()
    opener = threading.Thread(target=open_late)
    opener.start()
    policy = Policy(dryrun=DryRunPolicy(time_limit_s=120, warmup_steps=1, measure_steps=3,
                                        measure_seconds=0.0))
    prof = run_dry_run(Request(script=SCRIPT), policy, gpu=None, gate=str(gate),
                       environ={**os.environ, "STAMPS": str(shared_dir)})
    opener.join()
    seen = stamps(shared_dir)
    assert prof.usable, prof.note
    assert seen["cmdline"][seen["cmdline"].index("--gate") + 1] == str(gate)
    assert seen["setup"] < opened["at"] <= seen["after_forward"]
    assert 2.9 <= prof.gate_wait_s <= seen["after_forward"] - seen["before_forward"] + 0.05


def test_the_gate_wait_is_recorded_apart_from_the_script_set_up(tmp_path):
    import torch
    from smartlaunch.profile.dryrun import Recorder
    gate = tmp_path / "swept"
    rec = Recorder(str(tmp_path / "p.json"), warmup=1, measure=2, gate=str(gate))
    time.sleep(0.2)                                    # the script's own set-up
    model = torch.nn.Linear(4, 2)
    opener = threading.Timer(1.0, gate.touch)
    opener.start()
    rec.on_pre(model, (torch.zeros(3, 4),))            # its first forward: held 1 s
    assert gate.exists()
    rec.on_step()
    opener.join()
    r = rec.result()
    assert r["gate_wait_s"] >= 0.99
    assert r["startup_s"] < 0.9                       # 0.2 s of set-up, the wait left out


def test_the_early_sweep_is_cached_and_the_decision_uses_it_without_a_second_benchmark(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    from smartlaunch.decide.explain import render_text
    from smartlaunch.profile import comm
    from smartlaunch.strategies import REGISTRY
    calls, measure = [], comm.measure_allreduce

    def spy(gpus, **kw):
        calls.append({"gpus": tuple(gpus), "pool": kw.get("pool") is not None,
                      "thread": threading.current_thread().name,
                      "max_bytes": kw.get("max_bytes")})
        curve = measure(gpus, **kw)
        calls[-1]["ended"] = time.time()
        return curve
    monkeypatch.setattr(comm, "measure_allreduce", spy)
    plan, topology, policy = cold_plan(clean_env, SCRIPT, POLICY, STAMPS=str(shared_dir))
    assert calls == [{"gpus": (0, 1), "pool": True, "thread": "smartlaunch-early-allreduce",
                      "max_bytes": None, "ended": calls[0]["ended"]}]
    assert plan.comm is not None and not plan.comm.cached and plan.comm.gpus == (0, 1)
    # every size, cached as comm_curve caches it: the next decision reads it
    from smartlaunch.profile.cache import comm_key, load_comm
    hit = load_comm(policy, comm_key(topology, (0, 1), "gloo", os.environ), os.environ,
                    need_bytes=comm.CPU_SIZES[-1])
    assert hit is not None and [p[0] for p in hit.points] == list(comm.CPU_SIZES)
    seen = stamps(shared_dir)
    assert "--gate" in seen["cmdline"]
    assert seen["after_forward"] >= calls[0]["ended"]      # no step while the sweep ran
    assert plan.profile.gate_wait_s is not None
    assert plan.timings["allreduce_early"] > 0
    assert "swept during the dry run in" in render_text(plan, REGISTRY)
    wait_until(lambda: tagged_left() == [] and early_threads() == [], what=ENDED)
    assert list(tmp.iterdir()) == []                   # the gate's and the ranks' dirs removed


def test_without_a_sweep_the_dry_run_gets_no_gate(clean_env, shared_dir, monkeypatch):
    private_tmp(clean_env, monkeypatch)
    plan, _, _ = cold_plan(clean_env, SCRIPT, POLICY.replace(
        "trials: false\n", "trials: false\n  prestart: false\n"), STAMPS=str(shared_dir))
    assert "--gate" not in stamps(shared_dir)["cmdline"]
    assert plan.profile.gate_wait_s is None and "allreduce_early" not in plan.timings
    assert plan.comm is not None and not plan.comm.cached     # measured after the dry run


def test_a_dry_run_failing_before_its_first_forward_leaves_nothing(clean_env, shared_dir,
                                                                  monkeypatch):
    from smartlaunch.errors import DryRunError
    tmp = private_tmp(clean_env, monkeypatch)
    with pytest.raises(DryRunError):
        cold_plan(clean_env, SCRIPT, POLICY, STAMPS=str(shared_dir), FAIL_AT_SETUP="1")
    wait_until(lambda: tagged_left() == [] and early_threads() == [], what=ENDED)
    assert list(tmp.iterdir()) == []


def test_closing_a_running_sweep_kills_its_ranks_and_removes_its_gate(clean_env, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    from smartlaunch.pipeline_pools import EarlySweep, Gate, Pools
    from smartlaunch.policy.api import Policy
    from smartlaunch.profile.comm import rank_base_env
    from smartlaunch.topology import discover
    from smartlaunch.warm import WarmPool
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}
    pool = WarmPool(2, rank_base_env(environ, "cpu"))
    pids = [c.pid for c, _ in pool.free]
    sweep = EarlySweep(pool, discover(environ), (0, 1), Policy(), environ)
    pools = Pools(comm=sweep)
    pools.keeper = Gate(pools)
    gate_dir = os.path.dirname(pools.gate)
    time.sleep(0.5)                  # the ranks are still importing torch
    t = time.monotonic()
    pools.close()                    # what Ctrl-C or a failed dry run does
    assert time.monotonic() - t < 5.0
    assert sweep.result is None and "cancelled" in str(sweep.error)
    assert not os.path.exists(gate_dir) and early_threads() == []
    assert not any(proc.proc_state(p).alive for p in pids)
    wait_until(lambda: tagged_left() == [] and list(tmp.iterdir()) == [], what=ENDED)


def test_a_failed_early_sweep_opens_the_gate_and_the_decision_measures_as_before(
        clean_env, shared_dir, monkeypatch):
    private_tmp(clean_env, monkeypatch)
    from smartlaunch.profile import comm
    threads, measure = [], comm.measure_allreduce

    def early_fails(gpus, **kw):
        threads.append(threading.current_thread().name)
        if threads[-1] == "smartlaunch-early-allreduce":
            raise comm.CommBenchError("rank 1 exited with code 1 (a broken link)")
        return measure(gpus, **kw)
    monkeypatch.setattr(comm, "measure_allreduce", early_fails)
    plan, _, _ = cold_plan(clean_env, SCRIPT, POLICY, STAMPS=str(shared_dir))
    assert threads == ["smartlaunch-early-allreduce", "MainThread"]
    assert plan.profile.usable and plan.profile.gate_wait_s is not None    # the gate opened
    assert plan.comm is not None and not plan.comm.cached and plan.comm.gpus == (0, 1)
    wait_until(lambda: tagged_left() == [] and early_threads() == [], what=ENDED)
