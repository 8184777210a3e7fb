"""Every suite script that can run on the CPU trains under torchrun with two gloo ranks (tiny
sizes) and rank 0 prints the throughput line bench/regret.py parses.

One torchrun job at a time (each is an agent and two ranks, all importing torch): started all at
once they overran their deadline on a loaded 2-core machine. These rows are `slow` (CI runs them
with -m slow; test_cli_launch runs the lead's example under torchrun in the default run)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import common  # noqa: E402  (bench/ is not a package; its scripts import each other by name)

CPU_SCRIPTS = sorted({e.script for e in common.SUITE if not e.torchvision})
TV_SCRIPTS = sorted({e.script for e in common.SUITE if e.torchvision})


def _argv(script: str) -> list[str]:
    # The lead's MLP example has no --tiny; its medium model is CPU-sized already.
    tiny = [] if script == common.MLP else ["--tiny", "--batch-size", "4"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            script, "--steps", "3", "--warmup", "1", *tiny]


@pytest.mark.slow
@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_script_trains_under_torchrun_with_two_ranks(script, tmp_path):
    env = common.child_env(dict(os.environ), None)
    env.update(OMP_NUM_THREADS="1", HOME=str(tmp_path))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(_argv(script), cwd=REPO, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:          # timed out: the agent and its ranks, not only the agent
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("throughput:")]
    assert len(lines) == 1, out            # rank 0 only
    tp = common.parse_throughput(out)
    assert tp is not None, lines
    assert tp["world"] == 2
    model = common.parse_model_line(out)
    assert model["params"] > 0 and model["batch"] > 0
    assert tp["samples_per_s"] == pytest.approx(2 * tp["per_rank"], rel=1e-3, abs=0.15)  # one decimal printed
    if script != common.MLP:
        # bench/suite's scripts time one region: per rank = batch / mean step time. (The
        # example reports the median step instead.)
        assert tp["per_rank"] == pytest.approx(model["batch"] * 1e3 / tp["step_ms"], rel=0.02)


@pytest.mark.parametrize("script", TV_SCRIPTS)
def test_torchvision_script_runs_single_process(script, clean_env):
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed here (the GPU machine has it)")
    res = subprocess.run([sys.executable, str(REPO / script), "--tiny", "--steps", "2", "--warmup",
                          "1", "--batch-size", "2"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert common.parse_throughput(res.stdout)["world"] == 1


def test_scripts_exist_and_suite_ids_are_unique():
    assert len({e.id for e in common.SUITE}) == len(common.SUITE)
    assert len({e.script for e in common.SUITE}) >= 8
    for e in common.SUITE:
        assert (REPO / e.script).is_file(), e.script
