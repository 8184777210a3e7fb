"""Multi-node rendezvous as Slurm would set it up: two node agents on this machine, each with
the environment srun gives node 0 / node 1 of a 2-node step, c10d on localhost."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers_slurm import REPO

SCRIPT = REPO / "tests" / "slurm" / "gloo_allreduce.py"

AGENT = r"""
import sys, json
from torch.distributed.run import get_args_parser, run
from smartlaunch.scheduler.slurm import detect, apply_to_torchrun_args
ctx = detect()
args = get_args_parser().parse_args(["--nproc-per-node", "1", "--monitor-interval", "0.1",
                                     sys.argv[1], sys.argv[2]])
notes = apply_to_torchrun_args(ctx, args, {"nproc_per_node"})
print(json.dumps({"notes": notes, "endpoint": args.rdzv_endpoint}), flush=True)
run(args)
"""


def node_env(rank: int, job: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "SMARTLAUNCH_"))}
    env.update({"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "localhost,lo2",
                "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "localhost,lo2",
                "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                "SLURM_NODEID": str(rank), "SLURMD_NODENAME": ["localhost", "lo2"][rank],
                "PATH": "/usr/bin:/bin"})     # no scontrol: the pure hostlist path (containers)
    return env


def run_agents(argv_for_rank, tmp_path, job: str) -> list[tuple[str, str]]:
    procs = [subprocess.Popen(argv_for_rank(r), env=node_env(r, job), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        # Upstream race (pytorch elastic, e.g. meta-pytorch/torchtune#2676): when both agents
        # share one machine, the agent that hosts the c10d store may exit after the exit
        # barrier while the other still polls it, which then fails with a
        # RendezvousConnectionError although training finished. Seen with plain torchrun
        # here in about half the runs; check_training() asserts the training itself.
        if p.returncode != 0 and "RendezvousConnectionError" in err and "num_nodes_waiting" in err:
            continue
        assert p.returncode == 0, err[-3000:]
    return outs


def check_training(tmp_path) -> None:
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["sum"] for r in ranks] == [3.0, 3.0]
    assert sorted(r["group_rank"] for r in ranks) == [0, 1]
    assert ranks[0]["weight"] == ranks[1]["weight"]     # DDP kept the replicas in step


@pytest.mark.slow
def test_two_node_agents_train_through_slurm_rendezvous(tmp_path):
    job = str(4000 + os.getpid() % 1000)          # a port no other run of this test holds
    outs = run_agents(lambda r: [sys.executable, "-c", AGENT, str(SCRIPT), str(tmp_path)],
                      tmp_path, job)
    first = [json.loads(o.splitlines()[0]) for o, _ in outs]
    assert first[0]["endpoint"] == first[1]["endpoint"] and first[0]["endpoint"].startswith("localhost:")
    assert "node 1 of 2" in first[1]["notes"][0]
    check_training(tmp_path)


@pytest.mark.slow
def test_two_node_agents_through_smartlaunch(tmp_path):
    job = str(5000 + os.getpid() % 1000)
    exe = [sys.executable, "-m", "smartlaunch.cli"]
    run_agents(lambda r: [*exe, "--strategy", "ddp", "--nproc-per-node", "1", str(SCRIPT),
                          str(tmp_path)], tmp_path, job)
    check_training(tmp_path)
