"""Every launch leaves <run dir>/summary.txt (issue 18; DDP's: test_diagnosis_launch.py): a
single job's and an independent queue's, real processes on the fake 2-GPU topology."""
from __future__ import annotations

import os
import stat

import pytest

import helpers_jobs as H
from helpers_launch import run_independent
from smartlaunch.decide.plan import Plan, Strategy
from smartlaunch.launch.api import LaunchContext
from smartlaunch.launch.leases import LeaseManager
from smartlaunch.launch.run_loop import run
from smartlaunch.launch.single import SingleLauncher

pytestmark = pytest.mark.timeout(120)

STEPPER = """
import sys, time
import smartlaunch
for _ in range(6):
    time.sleep(0.02)
    smartlaunch.profile_step()
sys.exit(int(sys.argv[1]))
"""


def _run_dir(tmp):
    (run_dir,) = (tmp / "logs").iterdir()
    return run_dir


def test_a_single_gpu_job_leaves_its_exit_code_wall_time_and_step_rate(clean_env):
    topo = H.fake_topology(2)
    script = H.write_script(clean_env, "stepper.py", STEPPER)
    plan = Plan(Strategy.SINGLE, "cuda", (0,), 1, 2, command=(script, "3"))
    ctx = LaunchContext(H.policy(clean_env), topo, environ=dict(os.environ))
    assert run(SingleLauncher(plan, ctx), ctx) == 3
    run_dir = _run_dir(clean_env)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700       # logs may hold secrets
    head, where = (run_dir / "summary.txt").read_text().splitlines()
    assert head.startswith("smartlaunch: summary (failed): exit code 3 after "), head
    assert "; 6 steps, " in head and head.endswith(" steps/s"), head
    assert where == f"  run files: {run_dir}"
    assert LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).taken(topo) == set()


def test_a_cpu_job_leaves_its_exit_code_without_a_rate_it_did_not_count(clean_env):
    script = H.write_script(clean_env, "stepper.py", STEPPER)
    plan = Plan(Strategy.SINGLE, "cpu", (), 1, 1, command=(script, "0"))
    ctx = LaunchContext(H.policy(clean_env), H.fake_topology(0), environ=dict(os.environ))
    assert run(SingleLauncher(plan, ctx), ctx) == 0
    run_dir = _run_dir(clean_env)
    assert os.listdir(run_dir) == ["summary.txt"]        # no step counter on the CPU
    head = (run_dir / "summary.txt").read_text().splitlines()[0]
    assert head.startswith("smartlaunch: summary (succeeded): exit code 0 after ") and \
        head.endswith(" s"), head


def test_independent_jobs_leave_the_queue_table_beside_summary_json(clean_env, capsys):
    out = clean_env / "out"
    out.mkdir()
    script = H.write_script(clean_env, "job.py", H.JOB_SCRIPT)
    plan = H.plan([["--sleep", "0.1"], ["--sleep", "0.1", "--exit", "3", "--rate", "7.5"]])
    assert run_independent(plan, H.request(script, "--out", str(out)), H.policy(clean_env),
                           H.fake_topology(2)) == 1
    run_dir = _run_dir(clean_env)
    assert sorted(p.name for p in run_dir.glob("summary.*")) == ["summary.json", "summary.txt"]
    lines = (run_dir / "summary.txt").read_text().splitlines()
    assert lines[0].startswith("smartlaunch: summary (failed): exit code 1 after "), lines
    assert lines[1] == f"independent jobs: 1 of 2 succeeded (logs in {run_dir})"
    job1 = next(ln for ln in lines if ln.strip().startswith("1 "))
    assert "exit code 3" in job1 and "7.5" in job1, lines
    assert lines[-1].startswith("job 1 (--sleep 0.1 --exit 3 --rate 7.5) failed: exit code 3")
    # stderr gets the same table, each line marked as smartlaunch's
    err = capsys.readouterr().err
    assert f"smartlaunch: independent jobs: 1 of 2 succeeded (logs in {run_dir})" in err
