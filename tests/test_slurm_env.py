"""SlurmContext detection, torchrun argument filling, GPU mapping, parsers, the runner door."""
from __future__ import annotations

import argparse

import pytest

from smartlaunch.errors import ExitCode, SlurmError
from smartlaunch.scheduler import slurm_parse as parse
from smartlaunch.scheduler.slurm import RDZV_PORT_BASE, apply_to_torchrun_args, detect, physical_gpus
from smartlaunch.scheduler.slurm_run import Completed, run_slurm

# Captured from `srun -N1 --gres=gpu:1 env` on the test cluster (Slurm 22.05.8), trimmed.
SRUN_ENV = {
    "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
    "SLURM_JOB_NODELIST": "vm", "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "1",
    "SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0", "SLURM_NODEID": "0",
    "SLURM_LOCALID": "0", "SLURMD_NODENAME": "vm",
}


def two_node_step(rank: int, **extra) -> dict:
    env = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "3", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": str(rank),
           "SLURMD_NODENAME": f"gpu0{7 + rank}", "SLURM_STEP_GPUS": "2,3",
           "SLURM_GPUS_ON_NODE": "2", "CUDA_VISIBLE_DEVICES": "2,3"}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def fake_runner(outputs: dict[str, str], calls: list | None = None):
    def run(argv, timeout_s):
        assert timeout_s > 0
        if calls is not None:
            calls.append(list(argv))
        return Completed(tuple(argv), 0, outputs[argv[0]], "")
    return run


def hostnames_runner(calls=None):
    def run(argv, timeout_s):
        if calls is not None:
            calls.append(list(argv))
        return Completed(tuple(argv), 0, "\n".join(parse.expand_hostlist(argv[-1])) + "\n", "")
    return run


def test_outside_slurm_is_none():
    assert detect({}) is None
    assert detect({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}) is None


def test_two_node_step_fills_rendezvous_from_scontrol():
    calls: list = []
    ctx = detect(two_node_step(1), runner=hostnames_runner(calls), device_probe=lambda g: None)
    assert calls == [["scontrol", "show", "hostnames", "gpu[07-08]"]]
    assert (ctx.nnodes, ctx.node_rank, ctx.hosts) == (2, 1, ("gpu07", "gpu08"))
    assert ctx.rdzv_endpoint == f"gpu07:{RDZV_PORT_BASE + 234 * 10 + 3}"
    assert ctx.rdzv_id == "1234.3"
    assert ctx.gpus == (2, 3) and not ctx.constrained
    args = argparse.Namespace(nnodes="1:1", node_rank=0, rdzv_backend="static",
                              rdzv_endpoint="", rdzv_id="none", standalone=False)
    notes = apply_to_torchrun_args(ctx, args, set())
    assert (args.nnodes, args.node_rank, args.rdzv_backend) == ("2", 1, "c10d")
    assert args.rdzv_endpoint == ctx.rdzv_endpoint and args.rdzv_id == "1234.3"
    assert "node 1 of 2" in notes[0] and "gpu07,gpu08" in notes[0]


def test_command_line_wins_over_slurm():
    ctx = detect(two_node_step(0), runner=hostnames_runner())
    args = argparse.Namespace(nnodes="2", node_rank=0, rdzv_backend="c10d",
                              rdzv_endpoint="head:29400", rdzv_id="mine", standalone=False)
    notes = apply_to_torchrun_args(ctx, args, {"--rdzv-endpoint", "rdzv_id"})
    assert args.rdzv_endpoint == "head:29400" and args.rdzv_id == "mine"
    assert any("rdzv_endpoint=head:29400 from the command line" in n for n in notes)


def test_batch_script_uses_first_node_only_and_says_so():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NNODES": "3",
           "SLURM_JOB_GPUS": "1", "SLURM_GPUS_ON_NODE": "1", "CUDA_VISIBLE_DEVICES": "1"}
    ctx = detect(env, runner=hostnames_runner())
    assert (ctx.nnodes, ctx.node_rank, ctx.step_id, ctx.job_nnodes) == (1, 0, None, 3)
    assert ctx.rdzv_endpoint == f"localhost:{RDZV_PORT_BASE + 770}" and ctx.rdzv_id == "77"
    assert "only n1 runs" in ctx.notes[0] and "srun --ntasks-per-node=1" in ctx.notes[0]


def test_pure_hostlist_when_scontrol_is_absent(monkeypatch):
    monkeypatch.setattr("smartlaunch.scheduler.slurm.available", lambda prog: False)
    ctx = detect(two_node_step(0))
    assert ctx.hosts == ("gpu07", "gpu08")


@pytest.mark.parametrize("env, words", [
    ({"SLURM_JOB_ID": "5"}, "SLURM_JOB_NODELIST is not"),
    (two_node_step(1, SLURM_STEP_NUM_NODES="3"), "SLURM_STEP_NUM_NODES=3"),
    (two_node_step(1, SLURM_NODEID=None, SLURMD_NODENAME=None), "SLURM_NODEID is missing"),
    (two_node_step(1, SLURMD_NODENAME="gpu07"), "SLURM_NODEID=1 but gpu07 is node 0"),
    (two_node_step(0, SLURM_STEP_TASKS_PER_NODE="2(x2)"), "started 2 smartlaunch processes"),
    ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "a", "SLURM_JOB_GPUS": "0,1",
      "SLURM_GPUS_ON_NODE": "1"}, "SLURM_GPUS_ON_NODE=1"),
    ({"SLURM_JOB_ID": "x1", "SLURM_JOB_NODELIST": "a"}, "not a job number"),
])
def test_inconsistent_environment_is_a_slurm_error(env, words):
    with pytest.raises(SlurmError) as exc:
        detect(env, runner=hostnames_runner())
    msg = str(exc.value)
    assert words in msg and "\n" not in msg
    assert exc.value.exit_code == ExitCode.SLURM == 9


def test_constrained_renumbering_maps_to_physical():
    env = two_node_step(0, CUDA_VISIBLE_DEVICES="0,1")          # Slurm's cgroup renumbering
    ctx = detect(env, runner=hostnames_runner(), device_probe=lambda g: None)
    assert ctx.constrained and ctx.gpus == (2, 3)
    assert physical_gpus(ctx, env) == [2, 3]
    assert physical_gpus(ctx, {"CUDA_VISIBLE_DEVICES": "1"}) == [3]
    with pytest.raises(SlurmError, match="past the 2 GPU"):
        physical_gpus(ctx, {"CUDA_VISIBLE_DEVICES": "2"})


def test_unconstrained_indices_are_physical_and_checked_against_the_allocation():
    env = two_node_step(0)
    ctx = detect(env, runner=hostnames_runner(), device_probe=lambda g: None)
    assert not ctx.constrained
    assert physical_gpus(ctx, env) == [2, 3]
    assert physical_gpus(ctx, {"CUDA_VISIBLE_DEVICES": "3"}) == [3]
    assert physical_gpus(ctx, {}) == [2, 3]
    with pytest.raises(SlurmError, match="GPU 0 is not allocated"):
        physical_gpus(ctx, {"CUDA_VISIBLE_DEVICES": "0"})


def test_user_edited_visible_devices_asks_the_device_probe():
    # Allocation 1,2 and CUDA_VISIBLE_DEVICES=1 fits both readings: the probe decides.
    env = two_node_step(0, SLURM_STEP_GPUS="1,2", CUDA_VISIBLE_DEVICES="1")
    probed = []
    ctx = detect(env, runner=hostnames_runner(), device_probe=lambda g: probed.append(g) or True)
    assert probed == [(1, 2)] and ctx.constrained and physical_gpus(ctx, env) == [2]
    ctx = detect(env, runner=hostnames_runner(), device_probe=lambda g: None)
    assert not ctx.constrained and physical_gpus(ctx, env) == [1]


def test_agrees_with_topology_visibility():
    visible = pytest.importorskip("smartlaunch.topology.visible")
    node = [(i, f"GPU-{i:08x}-0000-0000-0000-000000000000") for i in range(4)]
    for cvd in ("2,3", "3", "3,2"):
        env = two_node_step(0, CUDA_VISIBLE_DEVICES=cvd)
        ctx = detect(env, runner=hostnames_runner(), device_probe=lambda g: None)
        assert physical_gpus(ctx, env) == visible.resolve_visible(node, env)


def test_step_gpus_win_over_job_gpus():
    env = {**SRUN_ENV, "SLURM_JOB_GPUS": "0,1", "SLURM_STEP_GPUS": "1",
           "CUDA_VISIBLE_DEVICES": "1", "SLURM_GPUS_ON_NODE": "1"}
    ctx = detect(env, runner=hostnames_runner())
    assert ctx.gpus == (1,) and ctx.step_id == "0" and ctx.rdzv_endpoint.startswith("localhost:")


def test_parsers_on_captured_text():
    assert parse.expand_hostlist("gpu[01-02,05],login1,r[1-2]n[3-4]") == (
        "gpu01", "gpu02", "gpu05", "login1", "r1n3", "r1n4", "r2n3", "r2n4")
    assert parse.parse_hostnames("vm\nvm2\n\n") == ("vm", "vm2")
    assert parse.parse_id_list("0-2,5") == (0, 1, 2, 5)
    assert parse.parse_tasks_per_node("2(x3),1") == (2, 2, 2, 1)
    # `scontrol -o show node vm` after a failed prolog (Slurm 22.05.8), trimmed.
    line = ("NodeName=vm Arch=x86_64 CoresPerSocket=1 Gres=gpu:2 NodeAddr=127.0.0.1 "
            "State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug "
            "Reason=Prolog error [root@2026-11-22T00:10:01] CfgTRES=cpu=2,mem=1000M")
    rec = parse.parse_key_values(line)
    assert rec["Reason"] == "Prolog error [root@2026-11-22T00:10:01]"
    assert rec["CfgTRES"] == "cpu=2,mem=1000M"
    with pytest.raises(SlurmError, match="unbalanced"):
        parse.expand_hostlist("gpu[01-02")


def test_runner_door_errors_quote_output():
    def failing(argv, timeout_s):
        return Completed(tuple(argv), 1, "", "scontrol: error: Invalid node name specified\n")

    def hanging(argv, timeout_s):
        raise TimeoutError

    with pytest.raises(SlurmError, match="Invalid node name specified"):
        run_slurm(["scontrol", "show", "node", "x"], runner=failing)
    with pytest.raises(SlurmError, match="did not answer within 3 s"):
        run_slurm(["squeue"], timeout_s=3, runner=hanging)
    with pytest.raises(SlurmError, match="not found"):
        run_slurm(["surely-not-a-slurm-program-xyz"])
    calls = []
    out = run_slurm(["squeue", "-h"], runner=fake_runner({"squeue": "ok\n"}, calls))
    assert out.stdout == "ok\n" and calls == [["squeue", "-h"]]


def test_an_idle_slurm_allocation_is_said_at_launch_with_the_request_that_fits(clean_env):
    """--strategy single on a node where Slurm allocated two GPUs: one line, even with --quiet,
    naming the idle GPU and the sbatch/srun request that fits the plan."""
    import subprocess
    import sys
    from helpers_jobs import python_env
    (clean_env / "t.py").write_text("print('ran')\n")
    env = python_env(SMARTLAUNCH_FAKE_TOPOLOGY="h200-nv18-pair", SLURM_JOB_ID="42",
                     SLURM_JOB_NODELIST="nodea", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
                     SLURM_JOB_GPUS="0,1", SLURM_GPUS_ON_NODE="2", CUDA_VISIBLE_DEVICES="0,1",
                     SLURMD_NODENAME="nodea", SLURM_NODEID="0")
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                        "--quiet", "t.py"], cwd=clean_env, env=env, capture_output=True,
                       text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.startswith("smartlaunch:")]
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    assert lines == ["smartlaunch: the plan uses 1 of the 2 GPUs Slurm allocated on this node "
                     "(1 idle for the whole job; GPUs left free: GPU1); a request that fits "
                     "this plan next time: `sbatch --nodes=1 --gpus-per-node=1` (or `srun "
                     "--gpus-per-node=1`)"], r.stderr


def _plan(gpus=(0,), left_free=(), nnodes="1"):
    """The fields of a Plan the Slurm fit reads (scheduler/slurm_fit.py)."""
    import types
    return types.SimpleNamespace(gpus=gpus, left_free=left_free, nnodes=nnodes,
                                 multi_node=nnodes not in ("1", "1:1"), node_variants=())


BATCH_3 = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "g[1-3]", "SLURM_JOB_NUM_NODES": "3",
           "SLURM_NNODES": "3", "SLURMD_NODENAME": "g1"}


def test_idle_nodes_are_said_with_the_request_that_fits():
    from smartlaunch.allocation import idle_line
    batch = detect(BATCH_3, runner=hostnames_runner())
    # A batch script runs on the first node only; no GPUs asked.
    assert idle_line(batch, _plan(gpus=())) == (
        "the plan uses 1 of the 3 nodes Slurm allocated to job 7 (2 idle for the whole job); a "
        "request that fits this plan next time: `sbatch --nodes=1` (or `srun --nodes=1`)")
    # A step over every node, each node its own launch: nothing idle.
    step = {**BATCH_3, "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "g[1-3]",
            "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "0", "SLURM_JOB_GPUS": "0,1",
            "CUDA_VISIBLE_DEVICES": "0,1"}
    ctx = detect(step, runner=hostnames_runner())
    assert idle_line(ctx, _plan(gpus=(0, 1))) == ""
    # A multi-node plan that takes 2 of the step's 3 nodes (plan.nnodes says how many).
    assert idle_line(ctx, _plan(gpus=(0, 1), nnodes="2")) == (
        "the plan uses 2 of the 3 nodes Slurm allocated to job 7 (1 outside this srun step 7.0: "
        "idle unless another step uses them); a request that fits this plan next time: "
        "`sbatch --nodes=2 --gpus-per-node=2` (or `srun --nodes=2 --gpus-per-node=2`)")
    # A sweep of 2 variants across the step's 3 nodes: the node without a share is idle.
    sweep = _plan(gpus=(0, 1), nnodes="3")
    sweep.node_variants = ((0,), (1,), ())
    assert idle_line(ctx, sweep).startswith("the plan uses 2 of the 3 nodes Slurm allocated")


def test_release_unused_refusals_are_one_line_and_keep_the_environment():
    import dataclasses
    from smartlaunch.policy.api import Policy, SlurmPolicy
    from smartlaunch.scheduler.slurm_fit import release_unused
    on = dataclasses.replace(Policy(slurm=SlurmPolicy(release_unused=True)),
                             sources={"slurm.release_unused": "user:p.yaml"})
    calls = []

    def scontrol(show: str, update_rc: int, update_err: str = ""):
        def run(argv, timeout_s):
            calls.append(list(argv))
            if argv[1] == "show" and argv[2] == "hostnames":
                return Completed(tuple(argv), 0, "g1\ng2\ng3\n", "")
            if argv[1] == "-o":
                return Completed(tuple(argv), 0, show, "")
            return Completed(tuple(argv), update_rc, "", update_err)
        return run

    env = dict(BATCH_3)
    denied = scontrol("JobId=7 NumNodes=3 NodeList=g[1-3]", 1,
                      "Access/permission denied for job 7\n")
    line, out = release_unused(_plan(), on, env, runner=denied)
    assert out is env and line == (
        "slurm.release_unused (user:p.yaml): Slurm job 7 not shrunk: `scontrol update JobId=7 "
        "NumNodes=1` failed with exit code 1: 'Access/permission denied for job 7'; the launch "
        "goes on with the job's 3 nodes (the cluster does not let this job shrink: ask the "
        "admins, or set slurm.release_unused: false)")
    assert calls[-1] == ["scontrol", "update", "JobId=7", "NumNodes=1"]
    # An earlier launch of the same batch script shrank it: nothing to do, nothing said.
    calls.clear()
    line, out = release_unused(_plan(), on, env, runner=scontrol("JobId=7 NumNodes=1", 0))
    assert (line, out) == ("", env) and not any(c[1] == "update" for c in calls)
    # The key off: scontrol is not asked at all.
    calls.clear()
    assert release_unused(_plan(), Policy(), env, runner=denied) == ("", env) and not calls


def test_resize_script_variables_are_read():
    from smartlaunch.scheduler.slurm_fit import resize_env
    # slurm_job_1_resize.sh as scontrol 22.05.8 wrote it on the two-node test cluster.
    text = ('export SLURM_NODELIST="n1"\nexport SLURM_JOB_NODELIST="n1"\nexport SLURM_NNODES=1\n'
            'export SLURM_JOB_NUM_NODES=1\nexport SLURM_JOB_CPUS_PER_NODE="1"\n'
            'unset SLURM_NPROCS\nunset SLURM_NTASKS\nunset SLURM_TASKS_PER_NODE\n'
            'export PATH=/evil\nrm -rf /\n')
    assert resize_env(text) == {
        "SLURM_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_CPUS_PER_NODE": "1", "SLURM_NPROCS": None,
        "SLURM_NTASKS": None, "SLURM_TASKS_PER_NODE": None}


def test_without_scontrol_the_launch_says_so_and_runs_unshrunk(clean_env):
    """A batch script on a 2-node allocation, slurm.release_unused on, no Slurm commands on
    PATH (a container): one line naming the missing command, and the script runs."""
    import subprocess
    import sys
    from helpers_jobs import python_env
    (clean_env / "t.py").write_text("print('ran')\n")
    (clean_env / "p.yaml").write_text("slurm:\n  release_unused: true\n")
    env = python_env(SMARTLAUNCH_FAKE_TOPOLOGY="h200-nv18-pair", SLURM_JOB_ID="42",
                     SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NUM_NODES="2", SLURM_NNODES="2",
                     SLURM_JOB_GPUS="0", CUDA_VISIBLE_DEVICES="0", SLURMD_NODENAME="node1",
                     PATH=str(clean_env / "empty-bin"))
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                        "--quiet", "--policy", "p.yaml", "t.py"], cwd=clean_env, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.startswith("smartlaunch:")]
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    assert lines == [
        f"smartlaunch: slurm.release_unused (user:{clean_env}/p.yaml): Slurm job 42 not shrunk: "
        "`scontrol` not found: install Slurm's client commands (Debian: slurm-client) or put "
        "them on PATH; the launch goes on with the job's 2 nodes",
        "smartlaunch: the plan uses 1 of the 2 nodes Slurm allocated to job 42 (1 idle for the "
        "whole job); a request that fits this plan next time: `sbatch --nodes=1 "
        "--gpus-per-node=1` (or `srun --nodes=1 --gpus-per-node=1`)"], r.stderr
