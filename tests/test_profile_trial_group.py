"""A trial's ranks without torchrun's agent (profile/trial_group.py): real gloo ranks on the
CPU under the dry-run hooks, compared with what a real torchrun gives the same script."""
from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers_common import wait_until
from helpers_jobs import fake_topology
from smartlaunch import sandbox
from smartlaunch.policy.api import DecisionPolicy, DryRunPolicy, Policy
from smartlaunch.profile.trial import make_trial_runner
from smartlaunch.request import Request
from smartlaunch.vocab import Strategy

SCRIPTS = Path(__file__).resolve().parent / "scripts" / "decide"
ENV_SCRIPT = str(SCRIPTS / "trial_env.py")
TOPO = fake_topology(2)      # the trials' GPUs, by UUID in CUDA_VISIBLE_DEVICES
QUICK = Policy(decision=DecisionPolicy(trial_steps=3), dryrun=DryRunPolicy(warmup_steps=1))


def dumps(folder: Path, n: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_trial_ranks_see_what_torchrun_gives_them(clean_env, shared_dir):
    ours_dir, theirs_dir = shared_dir / "ours", shared_dir / "theirs"
    ours_dir.mkdir()
    theirs_dir.mkdir()
    logs = []
    trial = make_trial_runner(Request(script=ENV_SCRIPT), QUICK,
                              {**os.environ, "ENV_DUMP": str(ours_dir)}, topology=TOPO,
                              log=logs.append)
    rate = trial(Strategy.DDP, (0, 1))
    assert rate is not None and rate > 0, logs          # gloo over env:// joined, steps timed
    ours = dumps(ours_dir, 2)
    # The same script under a real torchrun, given what the trial runner adds to the job's env.
    added = {k: v for k, v in ours[0].items()
             if k in sandbox.DRYRUN_ENV or k in ("SMARTLAUNCH_TRIAL", "CUDA_VISIBLE_DEVICES")}
    # Not our guard's tag: the spawner's guard sweeps that tag as it ends, reference included.
    env = {**os.environ, **added, "ENV_DUMP": str(theirs_dir), "DUMP_ONLY": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", ENV_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = dumps(theirs_dir, 2)
    for rank in (0, 1):
        a, b = ours[rank], theirs[rank]
        assert a["_rank"] == b["_rank"] == rank and a["_world"] == b["_world"] == 2
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"):
            assert a[k] == b[k], (rank, k, a.get(k), b.get(k))
        # Every variable torchrun gives a rank is there (values of ports and ids differ).
        assert set(b) - set(a) == {"DUMP_ONLY"}
        assert set(a) - {"SMARTLAUNCH_GUARD"} == set(b) - {"DUMP_ONLY"}
        assert a["TORCHELASTIC_USE_AGENT_STORE"] == "False"     # no agent store to wait for
    assert not any("smartlaunch.warm" in d["_cmdline"] for d in ours)     # started cold
    assert ours[0]["TORCHELASTIC_RUN_ID"] == ours[1]["TORCHELASTIC_RUN_ID"]
    assert ours[0]["MASTER_PORT"] == ours[1]["MASTER_PORT"]


def test_a_failing_rank_ends_its_peers_and_the_trial(clean_env, shared_dir):
    logs = []
    env = {**os.environ, "ENV_DUMP": str(shared_dir), "FAIL_RANK": "1"}
    pol = Policy(decision=DecisionPolicy(trial_steps=3),
                 dryrun=DryRunPolicy(warmup_steps=1, time_limit_s=120))
    t0 = time.monotonic()
    assert make_trial_runner(Request(script=ENV_SCRIPT), pol, env, topology=TOPO,
                             log=logs.append)(
        Strategy.DDP, (0, 1)) is None
    assert time.monotonic() - t0 < 60            # not the time limit: rank 0 was ended
    assert any("rank 1 exited with code 3" in line for line in logs), logs
    wait_until(lambda: all(gone(d["_pid"]) for d in dumps(shared_dir, 2)), what="the ranks to go")


def test_sigterm_reaches_every_rank_whose_hooks_write_what_they_saw(clean_env, shared_dir):
    from smartlaunch import proc
    out = shared_dir / "result"
    out.mkdir()
    env = {**os.environ, "HANG": "1", "HANG_PIDFILE": str(shared_dir / "pid")}
    cmd = [sys.executable, "-m", "smartlaunch.profile.trial_group", "--nproc", "2", "--",
           "--out-dir", str(out), "--warmup", "1", "--measure", "3",
           str(SCRIPTS / "tiny_ddp.py")]
    with proc.spawn(cmd, env=env) as child:
        deadline = time.monotonic() + 120
        while len(list(shared_dir.glob("pid.*"))) < 2 and time.monotonic() < deadline:
            assert child.returncode is None
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in shared_dir.glob("pid.*")]
        assert len(pids) == 2
        child.send(signal.SIGTERM)              # the spawner's group: the ranks are not in it
        assert child.wait(30) == 128 + signal.SIGTERM
    for r in (0, 1):                            # each rank's hooks ran their SIGTERM handler
        assert json.loads((out / f"rank{r}.json").read_text())["reason"] == "signal"
    wait_until(lambda: all(gone(p) for p in pids), what="the ranks to go")


def test_bad_usage_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "smartlaunch.profile.trial_group", "x"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage:")
