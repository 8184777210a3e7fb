"""The measured-trial runner: real torchrun processes (gloo on CPU) under the dry-run hooks."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from helpers_common import wait_until
from helpers_jobs import fake_topology
from smartlaunch.proc import proc_state
from smartlaunch.vocab import Strategy
from smartlaunch.profile.trial import make_trial_runner, samples_per_s
from smartlaunch.policy.api import DecisionPolicy, DryRunPolicy, Policy
from smartlaunch.request import Request

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "decide" / "tiny_ddp.py")
TOPO = fake_topology(2)      # the trials' GPUs, by UUID in CUDA_VISIBLE_DEVICES
QUICK = Policy(decision=DecisionPolicy(trial_steps=3), dryrun=DryRunPolicy(warmup_steps=1))


def test_a_ddp_trial_measures_samples_per_second(clean_env):
    # Single runs the same torchrun path with --nproc-per-node 1; one real run keeps CI short.
    logs, phases = [], []
    t0 = time.time()
    trial = make_trial_runner(Request(script=SCRIPT), QUICK, dict(os.environ), topology=TOPO,
                              log=logs.append,
                              phases=phases.append)
    two = trial(Strategy.DDP, (0, 1))
    wall = time.time() - t0
    assert two is not None and two > 0, logs
    # Where the trial's seconds went (--explain's "trials ... [start-up, script set-up, steps,
    # exit]"): every phase from rank 0's stamps, all inside the call.
    [split] = phases
    assert set(split) == {"start", "setup", "steps", "exit"} and min(split.values()) >= 0, split
    assert split["start"] > 0 and split["steps"] > 0, split
    assert sum(split.values()) <= wall, (split, wall)          # inside the call


def test_a_held_trial_measures_again_in_the_same_ranks(clean_env):
    # Near the policy's floor decide asks for the same trial again: its ranks, held at their gate
    # after the first window, measure a second one (no start, no set-up); a third trial of
    # another candidate ends the held one (hold=1: only the latest stays).
    from smartlaunch.profile.session import Session
    logs, phases = [], []
    with Session() as s:
        trial = make_trial_runner(Request(script=SCRIPT), QUICK, dict(os.environ), topology=TOPO,
                                  session=s, log=logs.append, phases=phases.append, hold=1)
        first = trial(Strategy.DDP, (0, 1))
        [stage] = s.stages
        assert first and not stage.over, logs
        second = trial(Strategy.DDP, (0, 1))
        assert second and second > 0, logs
        assert s.stages == [stage] and stage.results == 2 and not stage.over
        assert phases[1]["start"] == 0 and phases[1]["setup"] == 0 and phases[1]["steps"] > 0
        assert trial(Strategy.SINGLE, (0,)), logs
        assert len(s.stages) == 2 and stage.over and stage.code == 0, stage.why
        assert not s.stages[1].over          # the latest stays held until the session ends
        import psutil
        ranks = psutil.Process(s.stages[1].children[0].pid).children(recursive=True)
        assert ranks
        t0 = time.monotonic()
    assert s.stages == [] and time.monotonic() - t0 < 5.0
    _, alive = psutil.wait_procs(ranks, timeout=5.0)
    assert not alive, alive                  # the held ranks end with the session


def test_a_held_trial_whose_script_ended_is_started_afresh(clean_env):
    # The script's own 8 steps hold one window (1 warm-up, 3 measured) but not a second: asked
    # again, the held trial's script ends; a fresh trial measures in its place.
    from smartlaunch.profile.session import Session
    script = str(Path(SCRIPT).with_name("short_ddp.py"))
    pol = dataclasses.replace(QUICK, decision=DecisionPolicy(trial_steps=3, trial_seconds=0.001))
    logs = []
    with Session() as s:
        trial = make_trial_runner(Request(script=script), pol, dict(os.environ), topology=TOPO,
                                  session=s, log=logs.append, hold=1)
        assert trial(Strategy.DDP, (0, 1)), logs
        [held] = s.stages
        assert not held.over
        assert trial(Strategy.DDP, (0, 1)), logs
        assert len(s.stages) == 2 and held.over and held.code == 0 and held.results == 1


def test_trials_are_held_only_where_their_gpu_memory_fits():
    from smartlaunch.driver import HELD_TRIALS, held_trials
    gib = 2**30
    assert held_trials(None, []) == HELD_TRIALS               # the CPU: nothing to fit
    assert held_trials(2 * gib, [0, 0]) == HELD_TRIALS        # free memory unknown
    assert held_trials(2 * gib, [143_000, 143_000]) == HELD_TRIALS
    # 80 GiB free on the fuller GPU, 30 GiB a copy: 64 GiB holds two, one of them the running trial
    assert held_trials(30 * gib, [100 * 1024, 80 * 1024]) == 1
    assert held_trials(50 * gib, [80 * 1024]) == 0              # one copy fits: none held


@pytest.mark.slow
def test_a_hung_trial_is_killed_at_the_time_limit(clean_env, shared_dir):
    tmp_path = shared_dir                 # the trial's own writes are thrown away
    # Generous: on a loaded 2-core CI box torch's import alone can take seconds.
    limit = 15.0
    pol = dataclasses.replace(QUICK, dryrun=DryRunPolicy(time_limit_s=limit))
    env = {**os.environ, "HANG": "1", "HANG_PIDFILE": str(tmp_path / "pid")}
    logs, phases = [], []
    trial = make_trial_runner(Request(script=SCRIPT), pol, env, topology=TOPO,
                              log=logs.append, phases=phases.append)
    t0 = time.monotonic()
    assert trial(Strategy.DDP, (0, 1)) is None
    assert time.monotonic() - t0 < limit + 10.0
    # Its seconds are not "start-up": it was killed, and --explain's split says so.
    [split] = phases
    assert list(split) == ["killed"] and limit <= split["killed"] < limit + 10.0, split
    assert any(f"trial of ddp×2 was killed at the time limit (dryrun.time_limit_s, {limit:g} s)"
               in x for x in logs), logs
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert pids, "the workers never started"
    wait_until(lambda: all(proc_state(p).state == "gone" for p in pids), what="the workers to go")


def test_no_python_entrypoints_cannot_be_trialled(clean_env):
    trial = make_trial_runner(Request(script="/bin/true", no_python=True), QUICK, {},
                              topology=TOPO)
    assert trial(Strategy.SINGLE, (0,)) is None


def test_candidate_ordinals_map_through_the_jobs_visible_devices():
    # The one function every child's CUDA_VISIBLE_DEVICES comes from (worker_env): the
    # job's own tokens where it has them, else the GPUs' UUIDs (immune to CUDA_DEVICE_ORDER).
    from smartlaunch.worker_env import narrow_visible
    topo = fake_topology(4)
    assert narrow_visible((1, 3), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, topo) == "5,7"
    assert narrow_visible((0, 1), {}, topo) == "GPU-fake-0000-aaaa,GPU-fake-0001-aaaa"


def test_rate_is_ranks_times_batch_over_rank0_step():
    assert samples_per_s({"step_time_s": 0.02, "batch_size": 64}, 2) == pytest.approx(6400)
    assert samples_per_s({"step_time_s": None}, 2) is None and samples_per_s(None, 1) is None


def test_trial_length_fills_the_policy_window():
    from smartlaunch.profile.trial import trial_steps
    from smartlaunch.profile.dryrun import MAX_STEPS
    pol = Policy(decision=DecisionPolicy(trial_steps=20, trial_seconds=1.0))
    assert trial_steps(pol, None) == 20                 # no estimate: the step count alone
    assert trial_steps(pol, 0.2) == 20                  # 20 x 200 ms already fills 1 s
    assert trial_steps(pol, 2e-3) == 500                # 2 ms steps: 500 to fill 1 s
    assert trial_steps(pol, 1e-6) == MAX_STEPS          # capped
    off = Policy(decision=DecisionPolicy(trial_steps=20, trial_seconds=0.0))
    assert trial_steps(off, 2e-3) == 20


def test_trial_command_carries_the_step_count(clean_env):
    from smartlaunch.profile.trial import trial_command
    cmd = trial_command(Request(script=SCRIPT), QUICK, 2, "/tmp/x", steps=500)
    assert cmd[cmd.index("--measure") + 1] == "500"
    assert cmd[cmd.index("--nproc") + 1] == "2"


def test_later_trials_size_their_window_from_the_first(clean_env, tmp_path):
    # A stand-in interpreter: records --measure, reports a 2 ms step for rank 0.
    seen = tmp_path / "measure.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    --out-dir) out="$2"; shift;;
    --measure) echo "$2" >> {seen};;
  esac
  shift
done
echo '{{"step_time_s": 0.002, "batch_size": 8}}' > "$out/rank0.json"
""")
    fake.chmod(0o755)
    pol = Policy(decision=DecisionPolicy(trial_steps=20, trial_seconds=0.5))
    trial = make_trial_runner(Request(script=SCRIPT), pol, {}, topology=TOPO, python=str(fake))
    assert trial(Strategy.SINGLE, (0,)) == pytest.approx(8 / 0.002)
    assert trial(Strategy.DDP, (0, 1)) == pytest.approx(2 * 8 / 0.002)
    # No profile estimate: the first runs trial_steps; the second fills 0.5 s of 2 ms steps.
    assert seen.read_text().split() == ["20", "250"]
    hinted = make_trial_runner(Request(script=SCRIPT), pol, {}, topology=TOPO,
                               python=str(fake), expected_step_s=0.01)
    hinted(Strategy.SINGLE, (0,))
    assert seen.read_text().split()[-1] == "50"


def test_trial_deadlines_come_from_the_dry_run_with_floors_and_the_limit():
    from smartlaunch.profile.trial import Deadlines
    d = Deadlines.from_dry_run(20.0, 0.05, 120.0)          # a compile of 20 s, 50 ms steps
    assert (d.first_s, d.step_s, d.limit_s) == (pytest.approx(60.15), 10.0, 120.0)
    d = Deadlines.from_dry_run(2.0, 1.0, 120.0)         # early ranks get the same first
    assert (d.first_s, d.step_s) == (30.0, 60.0)
    d = Deadlines.from_dry_run(None, None, 15.0)            # nothing measured: the time limit
    assert (d.first_s, d.step_s) == (15.0, 10.0)


@pytest.mark.slow
def test_a_trial_that_stops_stepping_is_killed_at_its_progress_deadline(clean_env, shared_dir):
    """A DDP trial whose rank 1 stops after 3 steps: killed once no rank has stepped for the
    step deadline (its 10 s floor here), long before the 120 s time limit, with the reason
    the plan shows; nothing of it is left."""
    script = str(Path(__file__).resolve().parent / "scripts" / "decide" / "stall_ddp.py")
    env = {**os.environ, "STALL_PIDFILE": str(shared_dir / "pid"), "STALL_AFTER": "3"}
    pol = dataclasses.replace(QUICK, dryrun=DryRunPolicy(warmup_steps=1, time_limit_s=120.0))
    trial = make_trial_runner(Request(script=script), pol, env, topology=TOPO,
                              expected_step_s=0.01, expected_setup_s=1.0)
    t0 = time.monotonic()
    assert trial(Strategy.DDP, (0, 1)) is None
    took = time.monotonic() - t0
    assert took < 90.0, took                                  # not the 120 s time limit
    why = trial.why[(Strategy.DDP, (0, 1))]
    assert why.startswith("killed as stalled: its ranks did not all reach step ") \
        and "within 10 s (the deadline from the dry run's own steps)" in why, why
    pids = [int(p.read_text()) for p in shared_dir.glob("pid.*")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
