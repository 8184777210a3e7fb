"""A rank's last output lines reach the terminal (CI run of 2026-11-22: a DDP job's only line,
'job says hi', was missing because the end-of-run kill took the rank's output copier before it
had written it). kill_run(drain_s=...) spares the copiers until they exit by themselves."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from helpers_common import fixture_path
from smartlaunch.proc import RUN_ID_VAR, kill_run, run_processes

# A stand-in copier: named as the worker's copier is, it sleeps, then writes what it "drained".
COPIER = """
import sys, time
from smartlaunch import proc
proc._set_thread_name(proc.OUTPUT_COPIER.encode())   # named to its end, as a forked copier is
print("named", flush=True)
time.sleep(float(sys.argv[2]))
open(sys.argv[1], "w").write("drained")
"""
OTHER = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"


def _start(code, run_id, *args):
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                         env={**os.environ, RUN_ID_VAR: run_id}, stdout=subprocess.PIPE, text=True)
    p.stdout.readline()           # named / up: tagged and ready
    return p


def test_drain_spares_the_copier_until_it_has_written_and_kills_the_rest(tmp_path):
    run_id = f"drain-{os.getpid()}-1"
    copier = _start(COPIER, run_id, tmp_path / "out", 0.8)
    other = _start(OTHER, run_id)
    killed = kill_run(run_id, drain_s=5.0)
    assert other.wait(timeout=5) == -9 and other.pid in killed
    assert copier.wait(timeout=5) == 0 and copier.pid not in killed
    assert (tmp_path / "out").read_text() == "drained"
    assert run_processes(run_id) == []


def test_a_copier_that_never_finishes_is_killed_when_the_drain_ends(tmp_path):
    run_id = f"drain-{os.getpid()}-2"
    copier = _start(COPIER, run_id, tmp_path / "out", 60)
    t0 = time.monotonic()
    killed = kill_run(run_id, drain_s=1.0)
    took = time.monotonic() - t0
    assert copier.wait(timeout=5) == -9 and copier.pid in killed
    assert 0.9 < took < 4.0, took
    assert not (tmp_path / "out").exists()


def test_without_drain_the_copier_is_killed_at_once(tmp_path):
    run_id = f"drain-{os.getpid()}-3"
    copier = _start(COPIER, run_id, tmp_path / "out", 0.8)
    kill_run(run_id)
    assert copier.wait(timeout=5) == -9
    assert not (tmp_path / "out").exists()


def test_ddp_ranks_run_with_named_copiers_in_their_own_groups(clean_env):
    """The real worker: each rank's two copiers carry the name and are not in the rank's
    process group (so the agent's group kill of a failed rank spares them too)."""
    script = clean_env / "who.py"
    script.write_text(
        "import os, psutil\n"
        "me = os.getpid()\n"
        "kids = [c for c in psutil.Process(me).children() if c.name() == 'sl-output-copy']\n"
        # one write: under python -u (as torchrun runs ranks) print writes each piece apart,
        # and two ranks' pieces interleave on the shared stdout
        "line = f'copiers {len(kids)} {all(os.getpgid(c.pid) != os.getpgid(me) for c in kids)}\\n'\n"
        "os.write(1, line.encode())\n")
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--quiet", "--strategy", "ddp", str(script)],
                       cwd=clean_env, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines().count("copiers 2 True") == 2, r.stdout
