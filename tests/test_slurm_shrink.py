"""slurm.release_unused against a real two-node Slurm (tests/helpers_slurm.py NodesCluster):
a batch script on a 2-node allocation runs on its first node only, so the plan leaves a node
idle; with the key the launch shrinks the job to that node before it starts the script, and
every refusal (the site forbids it, an srun step, no scontrol) is one line with the launch
going on unshrunk. The job's node count is read inside the running script, through scontrol."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from helpers_common import fixture_path
from helpers_policy import as_admin_installed, needs_admin_install
from helpers_slurm import slurm_nodes  # noqa: F401

pytestmark = pytest.mark.slow

# What the launched script reports: the Slurm variables it was given and the job's node count
# as slurmctld has it while the script runs.
WORKER = """\
import os, subprocess
job = os.environ["SLURM_JOB_ID"]
out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
num = [w for w in out.stdout.split() if w.startswith("NumNodes=")]
print("worker", os.environ.get("SLURM_JOB_NUM_NODES"), os.environ.get("SLURM_JOB_NODELIST"),
      os.environ.get("SLURM_NNODES"), num[0] if num else out.stderr.strip())
"""


def submit(cluster, name: str, *, policy: str | None, launch_prefix: str = "",
           uid: str | None = None, wrap=None) -> tuple[dict, list[str], Path]:
    """Run `smartlaunch --strategy single t.py` as the batch script of a 2-node job with 2 GPUs
    per node; (the job's final record, the job's output lines, its working directory)."""
    work = cluster.dir / "shared" / name
    work.mkdir(mode=0o777)
    os.chmod(work, 0o777)
    (work / "t.py").write_text(WORKER)
    state = work / "state"
    argv = [sys.executable, "-m", "smartlaunch.cli", "--strategy", "single"]
    if policy is not None:
        (work / "user.yaml").write_text(policy)
        argv += ["--policy", str(work / "user.yaml")]
    argv.append("t.py")
    if wrap is not None:
        argv = wrap(argv)
    script = work / "job.sh"
    script.write_text("#!/bin/sh\n" + launch_prefix + " ".join(map(shlex.quote, argv)) + "\n")
    script.chmod(0o755)
    env = {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
           "SMARTLAUNCH_CACHE_DIR": str(state / "cache"),
           "SMARTLAUNCH_LOG_DIR": str(state / "logs"),
           "SMARTLAUNCH_LEASE_DIR": str(state / "leases"), "HOME": str(work),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = work / "out.txt"
    sub = cluster.client("sbatch", "--parsable", "-N2", "--gres=gpu:2", f"--chdir={work}",
                         f"--output={out}", *([f"--uid={uid}"] if uid else []), str(script),
                         env=env)
    assert sub.returncode == 0, sub.stderr + cluster.logs()
    job = sub.stdout.strip()
    info = cluster.wait_job(job, timeout=120)
    lines = out.read_text().splitlines() if out.exists() else []
    assert info["JobState"] == "COMPLETED", (info, lines, cluster.logs())
    return info, lines, work


def said(lines: list[str]) -> list[str]:
    """smartlaunch's Slurm lines."""
    return [x for x in lines if x.startswith("smartlaunch: ") and "slurm" in x.lower()]


def idle(job: str) -> str:
    return IDLE.replace("JOB", job)


IDLE = ("smartlaunch: the plan uses 1 of the 2 GPUs Slurm allocated on this node (1 idle for the "
        "whole job; GPUs left free: GPU1) and 1 of the 2 nodes Slurm allocated to job JOB (1 "
        "idle for the whole job); a request that fits this plan next time: `sbatch --nodes=1 "
        "--gpus-per-node=1` (or `srun --nodes=1 --gpus-per-node=1`)")
ON = "slurm:\n  release_unused: true\n"


def _nobody_cannot_run_python() -> str | None:
    """Why the job cannot run as nobody here (this interpreter under root's home), or None."""
    import subprocess
    if os.geteuid() != 0:
        return "needs root"
    r = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", "import yaml"],
                       capture_output=True, text=True, env={**os.environ, "HOME": "/"})
    return None if r.returncode == 0 else f"nobody cannot run {sys.executable}: {r.stderr.strip()}"


@pytest.mark.parametrize("user", ["root", pytest.param("nobody", marks=pytest.mark.skipif(
    bool(_nobody_cannot_run_python()), reason=str(_nobody_cannot_run_python())))])
def test_a_batch_launch_gives_the_idle_node_back_before_the_script_starts(slurm_nodes, user):
    """As root, and as an ordinary user (nobody): Slurm lets a user shrink their own job."""
    info, lines, work = submit(slurm_nodes, f"shrinks-{user}", policy=ON, uid=user)
    job = info["JobId"]
    assert said(lines) == [
        f"smartlaunch: slurm.release_unused (user:{work}/user.yaml): Slurm job {job} shrunk from "
        f"2 to 1 node (`scontrol update JobId={job} NumNodes=1`): 1 idle node released; the 1 "
        f"idle GPU on this node stays allocated (Slurm changes a running job's GPUs only by "
        f"releasing whole nodes)", idle(job)], lines
    # The script ran on the shrunk job, with the variables scontrol said to reset.
    assert "worker 1 n1 1 NumNodes=1" in lines, lines
    assert info["NumNodes"] == "1" and info["NodeList"] == "n1", info
    # scontrol's resize scripts went to a private directory, not the job's.
    assert not list(work.glob("slurm_job_*")), list(work.iterdir())


@needs_admin_install
def test_an_enforced_admin_key_shrinks_over_the_users_false(slurm_nodes):
    admin = slurm_nodes.dir / "admin.yaml"
    admin.write_text("enforce:\n  slurm:\n    release_unused: true\n")

    def wrap(argv):
        return as_admin_installed(argv, str(admin), slurm_nodes.dir / "shared" / "admin-ns")

    info, lines, _ = submit(slurm_nodes, "admin-enforces", wrap=wrap,
                            policy="slurm:\n  release_unused: false\n")
    job = info["JobId"]
    assert said(lines)[0].startswith(
        "smartlaunch: slurm.release_unused (enforced:/etc/smartlaunch/policy.yaml): Slurm job "
        f"{job} shrunk from 2 to 1 node"), lines
    assert "worker 1 n1 1 NumNodes=1" in lines and info["NumNodes"] == "1", (lines, info)


def test_a_site_that_forbids_resizing_gets_one_line_and_the_launch_goes_on(slurm_nodes):
    slurm_nodes.deny_modify.write_text("")
    try:
        info, lines, work = submit(slurm_nodes, "site-forbids", policy=ON)
    finally:
        slurm_nodes.deny_modify.unlink()
    job = info["JobId"]
    assert said(lines) == [
        f"smartlaunch: slurm.release_unused (user:{work}/user.yaml): Slurm job {job} not shrunk: "
        f"`scontrol update JobId={job} NumNodes=1` failed with exit code 1: 'Unspecified error "
        f"for job {job}'; the launch goes on with the job's 2 nodes (the cluster does "
        f"not let this job shrink: ask the admins, or set slurm.release_unused: false)", idle(job)
    ], lines
    assert "worker 2 n[1-2] 2 NumNodes=2" in lines and info["NumNodes"] == "2", (lines, info)


def test_inside_an_srun_step_the_job_is_not_shrunk(slurm_nodes):
    """Not the batch script: `srun -N1 smartlaunch` in the 2-node job. The other node may run
    other steps, so the line says so instead of calling it idle."""
    info, lines, work = submit(slurm_nodes, "in-a-step", policy=ON,
                               launch_prefix="srun -N1 --ntasks-per-node=1 ")
    job = info["JobId"]
    assert said(lines) == [
        f"smartlaunch: slurm.release_unused (user:{work}/user.yaml): Slurm job {job} not shrunk: "
        f"this launch runs in srun step {job}.0, not in the job's batch script (a step's nodes "
        f"stay allocated while it runs, and the job's other nodes may run other steps); start "
        f"smartlaunch from the batch script to release idle nodes; the launch goes on with the "
        f"job's 2 nodes",
        "smartlaunch: the plan uses 1 of the 2 GPUs Slurm allocated on this node (1 idle for the "
        f"whole job; GPUs left free: GPU1) and 1 of the 2 nodes Slurm allocated to job {job} (1 "
        f"outside this srun step {job}.0: idle unless another step uses them); a request that fits "
        "this plan next time: `sbatch --nodes=1 --gpus-per-node=1` (or `srun --nodes=1 "
        "--gpus-per-node=1`)"], lines
    assert "worker 2 n[1-2] 1 NumNodes=2" in lines and info["NumNodes"] == "2", (lines, info)


def test_without_the_key_the_line_says_what_fits_and_the_job_keeps_its_nodes(slurm_nodes):
    info, lines, _ = submit(slurm_nodes, "key-off", policy=None)
    assert said(lines) == [idle(info["JobId"])], lines
    assert "worker 2 n[1-2] 2 NumNodes=2" in lines and info["NumNodes"] == "2", (lines, info)
