"""Against a real single-node Slurm (tests/helpers_slurm.py): allocation -> context, GPU
renumbering, job_submit.lua, prolog drain, epilog cleanup, hostile job text.

Device-constraint renumbering is simulated (CUDA_VISIBLE_DEVICES set inside the step as
task/cgroup with ConstrainDevices=yes would): the test cluster runs task/affinity, and the
dummy /dev/nvidiaN nodes have no driver behind them."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from helpers_slurm import LUA_CAP, fake_topology, slurm_cluster, topology_running  # noqa: F401

ENV_CMD = [sys.executable, "-m", "smartlaunch.scheduler"]


def srun_json(cluster, *args: str, inner: list[str] | None = None) -> dict:
    out = cluster.client("srun", "-N1", *args, *(inner or ENV_CMD), timeout=60)
    assert out.returncode == 0, out.stderr + cluster.logs()
    return json.loads(out.stdout)


def test_srun_step_context_from_the_allocation(slurm_cluster):
    ctx = srun_json(slurm_cluster, "--gres=gpu:1")
    host = slurm_cluster.host
    assert (ctx["nnodes"], ctx["node_rank"], ctx["hosts"]) == (1, 0, [host])
    assert ctx["step_id"] == "0" and ctx["rdzv_id"] == f"{ctx['job_id']}.0"
    assert ctx["rdzv_endpoint"].startswith("localhost:")
    assert ctx["gpus"] == [0] and ctx["physical_gpus"] == [0] and ctx["constrained"] is False
    # task/affinity bound the single task to one of the node's CPUs.
    assert len(ctx["cpus"]) == 1


def test_batch_script_context(slurm_cluster, tmp_path):
    out_file = slurm_cluster.dir / "shared" / "batch.json"
    sub = slurm_cluster.client("sbatch", "--parsable", "--gpus=1", f"--output={out_file}",
                               "--wrap", " ".join(ENV_CMD))
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    info = slurm_cluster.wait_job(job)
    assert info["JobState"] == "COMPLETED", info
    ctx = json.loads(out_file.read_text())
    assert ctx["job_id"] == job and ctx["step_id"] is None and ctx["rdzv_id"] == job
    assert ctx["gpus"] == [0] and ctx["physical_gpus"] == [0] and ctx["nnodes"] == 1


def test_renumbering_with_and_without_device_constraint(slurm_cluster):
    holder = slurm_cluster.client("sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null",
                                  "--wrap", "sleep 30")
    assert holder.returncode == 0, holder.stderr
    job = holder.stdout.strip()
    try:
        deadline = time.monotonic() + 20
        while slurm_cluster.job(job).get("JobState") != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        # Without constraint Slurm writes the physical index: GPU 1 is CUDA_VISIBLE_DEVICES=1.
        plain = srun_json(slurm_cluster, "--gres=gpu:1")
        assert plain["gpus"] == [1] and plain["visible"] == ["1"]
        assert plain["constrained"] is False and plain["physical_gpus"] == [1]
        # With ConstrainDevices=yes Slurm renumbers to 0 (simulated inside the real step).
        inner = ["/usr/bin/env", "CUDA_VISIBLE_DEVICES=0", *ENV_CMD]
        cons = srun_json(slurm_cluster, "--gres=gpu:1", inner=inner)
        assert cons["gpus"] == [1] and cons["constrained"] is True and cons["physical_gpus"] == [1]
    finally:
        slurm_cluster.client("scancel", job)


@pytest.mark.parametrize("request_args", [["--gpus=2"], ["--gres=gpu:2"], ["--gpus-per-node=2"]])
def test_job_submit_lua_rejects_above_the_cap(slurm_cluster, request_args):
    out = slurm_cluster.client("sbatch", *request_args, "--output=/dev/null", "--wrap", "true")
    assert out.returncode != 0
    assert f"asks for 2 GPUs" in out.stderr and f"the limit is {LUA_CAP} per job" in out.stderr


def test_job_submit_lua_accepts_within_the_cap(slurm_cluster):
    out = slurm_cluster.client("srun", "-N1", "--gpus=1", "true")
    assert out.returncode == 0, out.stderr


def test_prolog_critical_fault_drains_the_node(slurm_cluster):
    c = slurm_cluster
    c.quiesce()           # an earlier job's epilog must not see the faulty fixture
    c.set_hooks_env({"SMARTLAUNCH_FAKE_TOPOLOGY": fake_topology("lost-gpu")})
    job = None
    try:
        sub = c.client("sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null",
                       "--wrap", "true")
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.strip()
        deadline = time.monotonic() + 30
        node = c.node()
        while "DRAIN" not in node.get("State", "") and time.monotonic() < deadline:
            time.sleep(0.2)
            node = c.node()
        assert "DRAIN" in node["State"], node
        assert node.get("Reason", "").startswith("Prolog error"), node
        slurmd_log = (c.dir / "slurmd.log").read_text()
        # slurmd logs our exit code (HEALTH = 10) and the one-line reason.
        assert f"[job {job}] prolog failed status=10:0" in slurmd_log, slurmd_log[-2000:]
        assert "smartlaunch prolog: error: GPU 0 (" in slurmd_log
        # What Slurm 22.05 does with the job: requeued and held (it never ran).
        info = c.job(job)
        deadline = time.monotonic() + 15
        while info.get("JobState") not in ("PENDING", "COMPLETED", "FAILED") and \
                time.monotonic() < deadline:
            time.sleep(0.2)
            info = c.job(job)
        assert info["JobState"] == "PENDING" and int(info["Restarts"]) >= 1, info
        assert info["Reason"] == "launch_failed_requeued_held" and info["Priority"] == "0", info
        log = (c.state_dir / "prolog-last.json").read_text()
        assert "gpu_lost" in log and f'"job_id": "{job}"' in log
    finally:
        if job:
            c.client("scancel", job)
        c.quiesce()
        c.set_hooks_env({"SMARTLAUNCH_FAKE_TOPOLOGY": fake_topology("healthy")})
        c.resume()


def test_epilog_stops_a_leftover_of_the_jobs_user(slurm_cluster):
    c = slurm_cluster
    c.quiesce()
    # The node as NVML will show it once the job's child runs on GPU 0: the job fills in the
    # pid, the epilog reads the processes from the fake topology as it would from NVML.
    template = c.dir / "shared" / "node-running.template"
    template.write_text(topology_running("healthy", {999999: 0}, pid_text="CHILD_PID"))
    template.chmod(0o644)
    node = c.dir / "shared" / "node.json"
    node.write_text(Path(fake_topology("healthy")).read_text())
    node.chmod(0o666)
    c.set_hooks_env({"SMARTLAUNCH_FAKE_TOPOLOGY": str(node), "SMARTLAUNCH_KILL_GRACE_S": "1"})
    try:
        # A daemonized child escapes proctrack/linuxproc: only the epilog can stop it.
        script = f"(setsid sleep 300 & sed \"s/CHILD_PID/$!/\" {template} > {node})"
        sub = c.client("sbatch", "--parsable", "--uid=nobody", "--gres=gpu:1",
                       f"--chdir={c.dir / 'shared'}", "--output=/dev/null", "--wrap", script)
        assert sub.returncode == 0, sub.stderr
        job = sub.stdout.strip()
        assert c.wait_job(job)["JobState"] == "COMPLETED"
        pid = json.loads(node.read_text())["gpus"][0]["processes"][0]["pid"]
        deadline = time.monotonic() + 15
        log = c.state_dir / "hooks.log"
        while f"SIGTERM leftover pid {pid}" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f"epilog job {job}: SIGTERM leftover pid {pid} on GPU 0" in log.read_text()
        assert not _alive(pid)
    finally:
        c.quiesce()
        c.set_hooks_env({"SMARTLAUNCH_FAKE_TOPOLOGY": fake_topology("healthy")})


def test_hostile_job_text_runs_nothing(slurm_cluster):
    c = slurm_cluster
    d = c.dir / "shared"
    comment = f"$(touch {d}/pwned)"
    name = f"; touch {d}/pwned2"
    sub = c.client("sbatch", "--parsable", f"--comment={comment}", f"--job-name={name}",
                   "--output=/dev/null", "--wrap", "true")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    assert c.wait_job(job)["JobState"] == "COMPLETED"
    time.sleep(0.5)          # the epilog runs after the job is complete
    assert f"prolog job {job}:" in (c.state_dir / "hooks.log").read_text()
    assert not list(d.glob("pwned*")) and not list(c.dir.glob("pwned*"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
