"""A matrix of real script patterns (tests/scripts/patterns/), each run end to end through a
cold decision's warm path (cores=16: warm processes, the DDP trial's ranks set up beside the dry
run and held at a gate) and its cold path (cores=2: the trial's ranks started when the decision
asks), on a fake two-GPU topology with gloo on the CPU. Every row must decide within its bound
and leave no process and no temp dir behind; a few also run a real launch through the CLI.

Slow (minutes; one decision at a time, nothing in parallel):
`pytest -m slow tests/test_patterns.py`.
PATTERNS_REPORT=FILE appends one JSON line per row (bench/results/patterns-cpu.md).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from helpers_common import REPO, fixture_path
from helpers_early import private_tmp, tagged_left

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PATTERNS = Path(__file__).resolve().parent / "scripts" / "patterns"
# A predicted efficiency is at most 100%; the band (±200%: a factor of 3) around a floor of 34%
# reaches 11-102%, so every DDP×2 prediction of these small CPU models asks for the DDP trial
# (a loader-bound step was predicted at 95% here), and both paths measure one.
POLICY = ("decision:\n  min_efficiency: 0.34\n  uncertainty_band: 2.0\n  trial_steps: 3\n"
          "  trial_seconds: 0.3\ndryrun:\n  warmup_steps: 1\n  measure_steps: 3\n")
STEPS = ("--steps", "3000")     # more than any window needs: the decision ends each run
LEFT_WAIT_S = 3.0


@dataclass(frozen=True)
class Row:
    name: str
    script: str
    args: tuple[str, ...] = ()
    bound_s: float = 120.0       # the decision's wall time on a loaded 2-core machine


def loader(name: str, *args: str) -> Row:
    return Row(f"loader-{name}", "loader.py", args)


ROWS = [
    loader("0-workers", "--workers", "0"),
    loader("2-fork", "--workers", "2", "--context", "fork"),
    loader("2-fork-pinned", "--workers", "2", "--context", "fork", "--pin-memory"),
    loader("8-fork-persistent-pinned", "--workers", "8", "--context", "fork", "--persistent",
           "--pin-memory"),
    loader("2-spawn", "--workers", "2", "--context", "spawn"),
    loader("2-spawn-persistent", "--workers", "2", "--context", "spawn", "--persistent"),
    loader("2-forkserver", "--workers", "2", "--context", "forkserver"),
    loader("8-forkserver-persistent-pinned", "--workers", "8", "--context", "forkserver",
           "--persistent", "--pin-memory"),
    Row("loader-before-model", "loader_first.py"),
    # Inductor compiles C++ in the dry run and again in each trial rank (its cache is in the
    # sandbox's /tmp, thrown away): ~30 s a process here.
    Row("torch-compile", "compiled.py", bound_s=360.0),
    Row("fsdp2-fully-shard", "fsdp2.py"),
    Row("multiprocessing-pool", "mp_pool.py"),
    Row("subprocess-own-session", "subproc.py"),
    Row("reads-stdin", "stdin_reader.py"),
    Row("signal-handlers", "signals.py"),
    Row("background-thread", "bg_thread.py"),
    Row("progress-bar", "progress.py"),
    Row("sys-exit-0-mid-loop", "exit_mid.py"),
    Row("own-cuda-visible-devices", "own_cvd.py"),
    Row("hf-dict-batches", "hf_style.py"),
    Row("lightning-closure", "lightning_style.py"),
]
PATHS = {"warm": 16, "cold": 2}


@pytest.fixture
def one_thread(monkeypatch):
    """One OpenMP thread in every process: two per process on a loaded 2-core machine made a
    step of these models 10-15x slower (spinning threads), and the rows' bounds meaningless.
    And this checkout's smartlaunch in every process it starts (dry run, warm processes, trial
    ranks, the CLI), not whichever one the interpreter has installed."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))


def compile_skip(row: Row) -> None:
    if row.script == "compiled.py" and not (shutil.which("cc") or shutil.which("gcc")
                                            or shutil.which("g++")):
        pytest.skip("torch.compile's CPU backend (inductor) needs a C compiler; none on PATH")


def report(**fields) -> None:
    path = os.environ.get("PATTERNS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out.append(f"{pid} (parent {p.ppid()}, {p.status()}): {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            out.append(f"{pid} (gone)")
    return "; ".join(out)


def settled(find) -> list[int]:
    """What `find()` still lists after at most LEFT_WAIT_S (SIGKILLed processes the kernel has
    not yet reaped are listed for a moment)."""
    deadline = time.monotonic() + LEFT_WAIT_S
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = find()
    return left


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_each_pattern_decides_in_time_and_leaves_nothing(row, path, clean_env, monkeypatch,
                                                         one_thread):
    compile_skip(row)
    from smartlaunch.pipeline import make_plan
    from smartlaunch.request import Request
    tmp = private_tmp(clean_env, monkeypatch)
    policy = clean_env / "policy.yaml"
    policy.write_text(POLICY)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}
    request = Request(script=str(PATTERNS / row.script), script_args=[*row.args, *STEPS],
                      explain="json", policy_path=str(policy))
    t0 = time.monotonic()
    plan, _, _ = make_plan(request, set(), environ, None, cores=PATHS[path])
    took = time.monotonic() - t0
    d = plan.to_dict()
    ddp = [c for c in d["candidates"] if c["strategy"] == "ddp"]
    trial = bool(ddp) and all(c["measured"] for c in ddp)
    predicted = [c["model_speedup"] if c["measured"] else c["speedup"] for c in ddp]
    at_return = describe(tagged_left())
    left = settled(tagged_left)
    left_text = describe(left)
    tmp_left = sorted(p.name for p in tmp.iterdir())
    timings = d.get("timings") or {}
    dropped = [r["text"] for r in d["reasons"] if "set up beside the dry run was stopped"
               in r["text"]]
    report(row=row.name, path=path, seconds=round(took, 1), trial=trial, chosen=d["strategy"],
           ddp_predicted=predicted, profile=d["profile"].get("status"), left=left_text,
           left_at_return=at_return, tmp_left=tmp_left, timings=timings, dropped=dropped,
           reasons=[r["text"] for r in d["reasons"]] if not trial else [])
    assert took < row.bound_s, f"{row.name} ({path}): decided in {took:.0f} s"
    assert trial, f"{row.name} ({path}): no DDP trial measured:\n{plan.to_json()}"
    if path == "warm":      # the warm processes were used: the early sweep and the early trial
        assert "allreduce_early" in timings and not dropped, plan.to_json()
    else:
        assert "allreduce_early" not in timings and "profile_gate" not in timings
    assert left == [], f"{row.name} ({path}): left running: {left_text}"
    # a compiled script's graphs stay in torch's own cache directory (made for the dry run where
    # absent, sandbox.compile_caches), where the launch finds them: what its first compile
    # would leave; anything else is a trace
    kept = [n for n in tmp_left if n.startswith("torchinductor_") and row.name == "torch-compile"]
    assert all(any((tmp / n / "fxgraph").iterdir()) for n in kept), kept
    assert [n for n in tmp_left if n not in kept] == [], \
        f"{row.name} ({path}): temp dirs left: {tmp_left}"


# --- real launches through the CLI (this machine's cores: the cold path on 2 cores) ---------
@dataclass(frozen=True)
class Launch:
    name: str
    script: str
    args: tuple[str, ...]
    code: int                    # the script's own exit code
    strategy: str = "auto"
    stdin: str | None = None     # fed to the launch (the job's stdin, as under torchrun)
    says: str = ""               # in the job's output


LAUNCHES = [
    Launch("loader-8-fork-persistent-pinned", "loader.py",
           ("--workers", "8", "--context", "fork", "--persistent", "--pin-memory"), 0),
    Launch("subprocess-own-session", "subproc.py", (), 0),
    Launch("signal-handlers", "signals.py", (), 0),
    Launch("reads-stdin", "stdin_reader.py", (), 0, stdin="lr=0.05\n",
           says="1 settings from stdin"),
    Launch("sys-exit-0-mid-loop", "exit_mid.py", ("--code", "0"), 0),
    Launch("sys-exit-3-mid-loop", "exit_mid.py", ("--code", "3"), 3),
    Launch("sys-exit-3-mid-loop-ddp", "exit_mid.py", ("--code", "3"), 3, strategy="ddp"),
]


def marked(var: str, value: str) -> list[int]:
    """Live processes whose environment holds var=value."""
    needle = f"{var}={value}".encode()
    from smartlaunch import proc
    return [p.pid for p in psutil.process_iter() if p.pid != os.getpid()
            and proc.process_tagged(p.pid, needle) and proc.proc_state(p.pid).alive]


def expected_code(script_code: int, decision: str) -> int:
    """The README's exit codes: a failed DDP worker group gives torchrun's 1; a single-GPU job
    returns the script's own code."""
    if script_code == 0:
        return 0
    return 1 if decision.startswith("smartlaunch: DDP×") else script_code


@pytest.mark.parametrize("launch", LAUNCHES, ids=[x.name for x in LAUNCHES])
def test_a_real_launch_exits_as_the_readme_says_and_leaves_nothing(launch, clean_env,
                                                                   one_thread):
    tmp = clean_env / "tmp"
    tmp.mkdir()
    (clean_env / "policy.yaml").write_text(POLICY)
    mark = uuid.uuid4().hex
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
           "TMPDIR": str(tmp), "PATTERN_LAUNCH": mark}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", launch.strategy,
                        "--policy", str(clean_env / "policy.yaml"),
                        str(PATTERNS / launch.script), *launch.args, "--steps", "400"],
                       cwd=clean_env, env=env, input=launch.stdin or "", capture_output=True,
                       text=True, timeout=600)
    took = time.monotonic() - t0
    decision = next((line for line in r.stderr.splitlines() if line.startswith("smartlaunch: ")
                     and ("--explain for why" in line or "forced by" in line)), "")
    left = settled(lambda: marked("PATTERN_LAUNCH", mark))
    left_text = describe(left)
    # The job's own torch makes $TMPDIR/torchinductor_<user> (its optimizer imports dynamo,
    # whose cache lives there): the script's write, as under torchrun, not smartlaunch's.
    tmp_left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))
    report(row=launch.name, path=f"cli ({launch.strategy})", seconds=round(took, 1),
           code=r.returncode, decision=decision, left=left_text, tmp_left=tmp_left)
    assert decision, r.stderr[-3000:]
    assert r.returncode == expected_code(launch.code, decision), r.stderr[-3000:]
    assert launch.says in r.stdout, r.stdout[-2000:]
    assert left == [], f"{launch.name}: left running: {left_text}"
    assert tmp_left == [], f"{launch.name}: temp dirs left: {tmp_left}"
