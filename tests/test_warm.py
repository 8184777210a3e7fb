"""Warm processes (smartlaunch/warm.py) and the pools a cold decision starts with its dry run
(pipeline_pools.py): real processes, gloo ranks on the CPU, a fake two-GPU topology."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers_common import fixture_path

from smartlaunch import proc

PROBE = """import json, os, sys
import torch
json.dump({"argv": sys.argv, "env": dict(os.environ), "main": __name__,
           "cuda": torch.cuda.is_initialized(), "stdin": sys.stdin.read(),
           "unbuffered": getattr(sys.stdout, "write_through", False)},
          open(os.environ["OUT"], "w"))
sys.exit(int(os.environ.get("CODE", "0")))
"""


def warm_worker(tmp_path: Path, *flags: str, **env):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    base = {**os.environ, "OUT": str(tmp_path / "out.json"), **env}
    p = subprocess.Popen([sys.executable, *flags, "-m", "smartlaunch.warm"], cwd=tmp_path, env=base,
                         stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    return p, base


def go(p, line: bytes) -> tuple[int, str]:
    _, err = p.communicate(line, timeout=120)
    return p.returncode, err.decode()


def test_the_go_runs_the_module_as_python_m_would_with_the_per_run_variables(clean_env):
    p, base = warm_worker(clean_env, CODE="7")
    env = {**base, "RANK": "3", "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": ""}
    rc, err = go(p, json.dumps({"module": "probe_mod", "argv": ["a", "b"], "env": env}).encode()
                 + b"\n")
    assert rc == 7, err
    seen = json.loads((clean_env / "out.json").read_text())
    assert seen["argv"][0].endswith("probe_mod.py") and seen["argv"][1:] == ["a", "b"]
    assert seen["main"] == "__main__" and seen["stdin"] == "" and seen["cuda"] is False
    assert {k: seen["env"].get(k) for k in ("RANK", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")} == \
        {"RANK": "3", "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": ""}
    assert "fresh python" not in err


def test_a_variable_torch_reads_at_import_changed_gives_a_fresh_python(clean_env):
    p, base = warm_worker(clean_env)
    env = {**base, "OMP_NUM_THREADS": "3"}
    rc, err = go(p, json.dumps({"module": "probe_mod", "env": env}).encode() + b"\n")
    assert rc == 0, err
    assert "OMP_NUM_THREADS changed since the import: a fresh python runs probe_mod" in err
    assert json.loads((clean_env / "out.json").read_text())["env"]["OMP_NUM_THREADS"] == "3"


@pytest.mark.slow
def test_a_fresh_python_keeps_the_workers_unbuffered_output(clean_env, monkeypatch):
    """The early dry-run process runs `python -u` (the script's output reaches its log as it
    is written); a fresh exec must keep that."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)       # the flag alone says it
    p, base = warm_worker(clean_env, "-u")
    rc, err = go(p, json.dumps({"module": "probe_mod", "env": {**base, "OMP_NUM_THREADS": "3"}}
                               ).encode() + b"\n")
    assert rc == 0 and "a fresh python runs probe_mod" in err, err
    assert json.loads((clean_env / "out.json").read_text())["unbuffered"] is True


@pytest.mark.parametrize("line,code", [(b"", 0), (b"{not json\n", 2),
                                       (b'{"module": 3, "env": {}}\n', 2)])
def test_eof_or_a_bad_go_exits_without_running_anything(clean_env, line, code):
    p, _ = warm_worker(clean_env)
    rc, err = go(p, line)
    assert rc == code
    assert not (clean_env / "out.json").exists()
    if code:
        assert [x for x in err.splitlines() if x.startswith("smartlaunch")] == \
            [next(x for x in err.splitlines() if x.startswith("smartlaunch warm: bad go"))]


def tagged_left() -> list[int]:
    """Live processes this test process's guard would sweep (every spawn() descendant)."""
    needle = f"{proc.GUARD_VAR}={proc.guard().tag}".encode()
    return [p.pid for p in psutil.process_iter()
            if p.pid != os.getpid() and proc.process_tagged(p.pid, needle)
            and proc.proc_state(p.pid).alive]


def test_the_benchmark_ranks_run_on_a_warm_pool_which_leaves_nothing(clean_env):
    from smartlaunch.profile.comm import measure_allreduce, rank_base_env
    from smartlaunch.warm import WarmPool
    pool = WarmPool(2, rank_base_env(os.environ, "cpu"))
    pids = [c.pid for c, _ in pool.free]
    curve = measure_allreduce((0, 1), device="cpu", environ=dict(os.environ), max_bytes=1 << 17,
                              pool=pool)
    assert curve.backend == "gloo" and len(curve.points) >= 2
    assert not pool.free                  # both ranks were the warm ones
    pool.close()
    assert not any(proc.proc_state(p).alive for p in pids)


POLICY = "decision:\n  min_efficiency: 0.5\n  uncertainty_band: 2.0\n  trial_steps: 3\n" \
         "dryrun:\n  warmup_steps: 1\n"


def cold_plan(clean_env, script: str, policy_text: str = POLICY, status=None, **env):
    from smartlaunch.pipeline import make_plan
    from smartlaunch.request import Request
    policy = clean_env / "policy.yaml"
    policy.write_text(policy_text)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"), **env}
    request = Request(script=script, explain="json", policy_path=str(policy))
    return make_plan(request, set(), environ, status, cores=16)


def private_tmp(clean_env, monkeypatch) -> Path:
    """Temp dirs of this test alone (/tmp is shared with other runs)."""
    import tempfile
    tmp = clean_env / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


@pytest.mark.slow
def test_a_cold_decision_runs_its_trial_and_benchmark_on_warm_ranks(clean_env, shared_dir,
                                                                  monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    script = str(Path(__file__).resolve().parent / "scripts" / "decide" / "trial_env.py")
    from smartlaunch.profile.trial import TrialSetup
    from smartlaunch.warm import WarmPool
    used, take, run = [], WarmPool.take, TrialSetup.run

    def spy_take(self, *a):
        got = take(self, *a)
        used.append("comm") if got is not None and "comm" not in used else None
        return got

    def spy_run(self, *a):
        used.append("trial") if self.child is not None else None
        return run(self, *a)
    monkeypatch.setattr(WarmPool, "take", spy_take)
    monkeypatch.setattr(TrialSetup, "run", spy_run)
    plan, _, _ = cold_plan(clean_env, script, ENV_DUMP=str(shared_dir))
    chosen = [c for c in plan.to_dict()["candidates"] if c.get("chosen")]
    measured = [c for c in plan.to_dict()["candidates"] if c.get("measured")]
    assert chosen and measured, plan.to_json()
    t = plan.timings
    assert t["allreduce"] > 0 and t["trials"] > 0
    # The trial's ranks saw torchrun's contract for two ranks on the candidate's GPUs.
    ranks = [json.loads((shared_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [d["_rank"] for d in ranks] == [0, 1] and {d["WORLD_SIZE"] for d in ranks} == {"2"}
    assert {d["OMP_NUM_THREADS"] for d in ranks} == {"1"}
    assert {d["CUDA_VISIBLE_DEVICES"] for d in ranks} == {"0,1"}
    assert all("smartlaunch.warm" in d["_cmdline"] for d in ranks)     # warm, not re-executed
    assert used == ["comm", "trial"]
    time.sleep(0.3)
    assert tagged_left() == []
    assert list(tmp.iterdir()) == []                   # pools' and trials' dirs removed


@pytest.mark.slow
def test_prestart_false_starts_every_rank_when_it_is_needed(clean_env, shared_dir, monkeypatch):
    private_tmp(clean_env, monkeypatch)
    script = str(Path(__file__).resolve().parent / "scripts" / "decide" / "trial_env.py")
    from smartlaunch.warm import WarmPool
    started = []
    init = WarmPool.__init__

    def spy_init(self, *a, **k):
        started.append(a)
        return init(self, *a, **k)
    monkeypatch.setattr(WarmPool, "__init__", spy_init)
    plan, _, _ = cold_plan(clean_env, script, POLICY.replace(
        "trial_steps: 3\n", "trial_steps: 3\n  prestart: false\n"), ENV_DUMP=str(shared_dir))
    assert [c for c in plan.to_dict()["candidates"] if c.get("measured")], plan.to_json()
    ranks = [json.loads((shared_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert started == []
    assert not any("smartlaunch.warm" in d["_cmdline"] for d in ranks)
    time.sleep(0.3)
    assert tagged_left() == []


@pytest.mark.slow
def test_a_failed_dry_run_closes_the_pools(clean_env):
    from smartlaunch.errors import DryRunError
    bad = clean_env / "bad.py"
    bad.write_text("import time\ntime.sleep(1)\nraise SystemExit(5)\n")
    with pytest.raises(DryRunError):
        cold_plan(clean_env, str(bad))
    time.sleep(0.3)
    assert tagged_left() == []



