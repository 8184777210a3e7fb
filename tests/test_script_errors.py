"""A failing script looks as it does under python: its traceback has only its own frames, a
rank's traceback is never cut off by the stop that follows its failure, and a failing rank's
own teardown (atexit) runs to its end. Real `smartlaunch` runs on the CPU (gloo)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts_errors"
RAISE = str(SCRIPTS / "raise_here.py")


def run(argv, cwd, **env):
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)


def smartlaunch(args, cwd, **env):
    return run([sys.executable, "-m", "smartlaunch.cli", *args], cwd, **env)


def traceback_block(stderr: str) -> list[str]:
    """The lines python prints for an uncaught exception: from 'Traceback' (or, for a
    SyntaxError, its 'File' line) to the exception's line."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("Traceback (most recent call last):")
                 or re.match(r'  File ".*", line \d+$', line))
    end = next(i for i in range(start, len(lines)) if re.match(r"\w+(Error|Exception)\b", lines[i]))
    return lines[start:end + 1]


@pytest.mark.parametrize("script", [RAISE, str(SCRIPTS / "syntax_error.py")],
                         ids=["exception", "syntax error"])
def test_a_single_jobs_traceback_is_pythons_own(clean_env, script):
    theirs = run([sys.executable, script], clean_env)
    ours = smartlaunch(["--strategy", "single", script], clean_env)
    assert ours.returncode == theirs.returncode == 1, ours.stderr
    assert traceback_block(ours.stderr) == traceback_block(theirs.stderr), ours.stderr
    assert "smartlaunch/" not in ours.stderr.replace("smartlaunch: ", "")


def test_a_modules_traceback_starts_in_the_module(clean_env):
    ours = smartlaunch(["--strategy", "single", "-m", "pkg"], clean_env,
                       PYTHONPATH=os.pathsep.join([str(SCRIPTS), os.environ["PYTHONPATH"]]))
    assert ours.returncode == 1, ours.stderr
    block = traceback_block(ours.stderr)
    assert block[1].startswith(f'  File "{SCRIPTS / "pkg" / "__main__.py"}"'), block
    assert block[-1] == "KeyError: 'deliberate failure in a module'"
    assert not any("runpy" in line or "smartlaunch" in line for line in block), block


@pytest.mark.parametrize("attempts", [1, pytest.param(20, marks=pytest.mark.slow)])
def test_a_failing_ranks_slow_traceback_is_kept_and_its_teardown_runs(clean_env, attempts):
    """The traceback goes through a 0.15 s excepthook, and the rank's atexit handler takes
    0.5 s after it: both finish although the launcher stops the other rank at the failure,
    in every one of `attempts` launches."""
    for attempt in range(attempts):
        done = clean_env / f"teardown-{attempt}"
        r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", RAISE], clean_env,
                        FAIL_RANKS="1", SLOW_HOOK="1", ATEXIT_FILE=str(done))
        assert r.returncode == 1, r.stderr[-3000:]
        block = traceback_block(r.stderr)
        assert block[-1] == "ValueError: deliberate failure of rank 1", r.stderr[-3000:]
        assert not any("smartlaunch" in line for line in block), block
        assert re.search(r"smartlaunch: rank 1 \(local 1, pid \d+\) on .* failed with exit code 1",
                         r.stderr), r.stderr[-3000:]
        assert done.read_text() == "teardown done\n", f"attempt {attempt}: teardown cut off"
