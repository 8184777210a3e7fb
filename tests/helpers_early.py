"""What the tests of a cold decision's processes share (tests/test_early.py, test_patterns.py)."""
from __future__ import annotations

import os
from pathlib import Path

import psutil

from helpers_common import fixture_path

from smartlaunch import proc

POLICY = "decision:\n  min_efficiency: 0.5\n  uncertainty_band: 2.0\n  trial_steps: 3\n" \
         "dryrun:\n  warmup_steps: 1\n"


def cold_plan(clean_env, script: str, policy_text: str = POLICY, status=None, cores: int = 16,
              fixture: str = "h200-nv18-pair", max_gpus: int | None = None, **env):
    """make_plan as the CLI runs it on a machine with `cores` CPUs and a fake topology (two
    GPUs unless `fixture` names another), --nproc-per-node max_gpus."""
    from smartlaunch.pipeline import make_plan
    from smartlaunch.request import Request
    policy = clean_env / "policy.yaml"
    policy.write_text(policy_text)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path(fixture), **env}
    request = Request(script=script, explain="json", policy_path=str(policy), max_gpus=max_gpus)
    return make_plan(request, set(), environ, status, cores=cores)


def private_tmp(clean_env, monkeypatch) -> Path:
    """Temp dirs of this test alone (/tmp is shared with other runs)."""
    import tempfile
    tmp = clean_env / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


def tagged_left() -> list[int]:
    """Live processes this test process's guard would sweep (every spawn() descendant)."""
    needle = f"{proc.GUARD_VAR}={proc.guard().tag}".encode()
    return [p.pid for p in psutil.process_iter()
            if p.pid != os.getpid() and proc.process_tagged(p.pid, needle)
            and proc.proc_state(p.pid).alive]
