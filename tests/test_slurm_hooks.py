"""Node hooks without a cluster: health rules, prolog/epilog/baseline, the shell wrappers."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers_slurm import HOOKS, fake_topology, topology_running
from smartlaunch.errors import ExitCode, HealthError
from smartlaunch.slurm import health, hooks
from helpers_common import own_lines

ROOT = os.geteuid() == 0


def config(tmp_path, topo: str, **extra) -> str:
    state = tmp_path / "state"
    lines = [f"SMARTLAUNCH_STATE_DIR={state}", f"SMARTLAUNCH_FAKE_TOPOLOGY={fake_topology(topo)}",
             "SMARTLAUNCH_KILL_GRACE_S=1"] + [f"{k}={v}" for k, v in extra.items()]
    p = tmp_path / "hooks.env"
    p.write_text("\n".join(lines) + "\n")
    p.chmod(0o644)
    return str(p)


def node(topo: str):
    return hooks.read_node(hooks.HookConfig(fake_topology=fake_topology(topo)))


def codes(findings, severity=None):
    return sorted((f.code, f.gpu) for f in findings if severity is None or f.severity.value == severity)


def test_health_rules_against_baseline():
    base = node("healthy")
    assert health.check(base, base) == []
    assert codes(health.check(base, None)) == [("no_baseline", None)]
    deg = health.check(node("degraded"), base)
    assert codes(deg, "critical") == [("p2p_lost", 0), ("pcie_width_degraded", 1)]
    assert "x8, baseline x16" in next(f.message for f in deg if f.code == "pcie_width_degraded")
    assert codes(health.check(node("lost-gpu"), base), "critical") == [("gpu_lost", 0)]
    # Only the job's GPUs are judged: GPU 0 lost does not fail a job on GPU 1.
    assert health.check(node("lost-gpu"), base, [1]) == []


def test_prolog_healthy_writes_snapshot_and_passes(clean_env, tmp_path):
    cfg = config(tmp_path, "healthy")
    assert hooks.run("baseline", cfg) == 0
    assert hooks.run("prolog", cfg, {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000",
                                         "SLURM_JOB_USER": "ann", "SLURM_JOB_GPUS": "0,1"}) == 0
    state = tmp_path / "state"
    assert (state / "topology.json").exists() and (state / "baseline.json").exists()
    assert "prolog job 7: 0 finding(s)" in (state / "hooks.log").read_text()


def test_prolog_critical_fault_is_one_line_health_error(clean_env, tmp_path):
    with pytest.raises(HealthError) as exc:
        hooks.run("prolog", config(tmp_path, "lost-gpu"), {"SLURM_JOB_GPUS": "0,1"})
    msg = str(exc.value)
    assert "GPU 0" in msg and "state=resume" in msg and "\n" not in msg
    assert exc.value.exit_code == ExitCode.HEALTH


def test_baseline_then_degraded_link_fails_via_node_cli(clean_env, tmp_path):
    cfg = config(tmp_path, "healthy")
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_GPUS": "0,1"}
    out = subprocess.run([sys.executable, "-m", "smartlaunch.node_cli", "baseline", "--config",
                          cfg], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "2 GPU(s)" in out.stdout, out.stderr
    cfg = config(tmp_path, "degraded")
    out = subprocess.run([sys.executable, "-I", "-m", "smartlaunch.slurm.hooks", "prolog",
                          "--config", cfg], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == ExitCode.HEALTH
    assert "PCIe link is x8, baseline x16" in out.stderr or "P2P between GPU 0 and 1" in out.stderr
    assert own_lines(out.stderr)[-1].startswith("smartlaunch prolog: error:")


def test_baseline_refuses_a_faulty_node(clean_env, tmp_path):
    with pytest.raises(HealthError, match="not recording a baseline"):
        hooks.run("baseline", config(tmp_path, "lost-gpu"))


@pytest.mark.skipif(not ROOT, reason="ownership checks apply when the hooks run as root")
def test_config_must_be_root_owned_and_not_writable(tmp_path):
    cfg = config(tmp_path, "healthy")
    os.chmod(cfg, 0o666)
    with pytest.raises(HealthError, match="must be owned by root"):
        hooks.HookConfig.load(cfg)
    os.chmod(cfg, 0o644)
    (tmp_path / "bad.env").write_text("PYTHONPATH=/home/u\n")
    with pytest.raises(HealthError, match="known key"):
        hooks.HookConfig.load(str(tmp_path / "bad.env"))


@pytest.mark.skipif(not ROOT, reason="needs root to start a process as another user")
def test_epilog_kills_only_the_job_users_leftovers(clean_env, tmp_path):
    nobody = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    mine = subprocess.Popen(["sleep", "60"])            # root's: never killed
    node = tmp_path / "node.json"
    node.write_text(topology_running("healthy", {nobody.pid: 1, mine.pid: 0}))
    try:
        cfg = config(tmp_path, "healthy", SMARTLAUNCH_FAKE_TOPOLOGY=str(node))
        rc = hooks.run("epilog", cfg, {"SLURM_JOB_ID": "9", "SLURM_JOB_UID": "65534",
                                        "SLURM_JOB_USER": "nobody", "SLURM_JOB_GPUS": "0,1"})
        assert rc == 0
        assert nobody.wait(timeout=5) == -15
        assert mine.poll() is None
        assert f"SIGTERM leftover pid {nobody.pid} on GPU 1" in (tmp_path / "state" / "hooks.log").read_text()
    finally:
        for p in (nobody, mine):
            if p.poll() is None:
                p.kill()
                p.wait()


HOSTILE = {
    "SLURM_JOB_COMMENT": "$(touch {d}/pwned)", "SLURM_JOB_NAME": "; touch {d}/pwned2",
    "SLURM_JOB_WORK_DIR": "`touch {d}/pwned3`", "SLURM_JOB_ID": "12$(touch {d}/pwned4)",
    "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "eve' ; touch x",
}


@pytest.mark.parametrize("mode", ["prolog", "epilog"])
def test_hook_scripts_pass_named_data_to_an_isolated_interpreter(tmp_path, mode):
    """The wrapper must run nothing from the job's text and pass only named variables."""
    hook = tmp_path / mode
    shutil.copy(HOOKS / mode, hook)
    record = tmp_path / "record"
    fake_py = tmp_path / "fake-python"
    fake_py.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                       f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ), "
                       f"'cwd': os.getcwd()}}, open({str(record)!r}, 'w'))\n")
    fake_py.chmod(0o755)
    (tmp_path / "hooks.env").write_text(f"SMARTLAUNCH_PYTHON={fake_py}\n"
                                        f"SMARTLAUNCH_PYTHON=$(touch {tmp_path}/pwned5)\n")
    env = {k: v.format(d=tmp_path) for k, v in HOSTILE.items()}     # no PATH, as slurmd
    out = subprocess.run(["/bin/sh", str(hook)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert not list(tmp_path.glob("pwned*")) and not (tmp_path / "x").exists()
    import json
    got = json.loads(record.read_text())
    assert got["argv"] == ["-I", "-m", "smartlaunch.slurm.hooks", mode, "--config",
                           str(tmp_path / "hooks.env")]
    assert got["cwd"] == "/"
    assert got["env"]["SLURM_JOB_ID"] == f"12$(touch {tmp_path}/pwned4)"     # data, verbatim
    assert not {"SLURM_JOB_COMMENT", "SLURM_JOB_NAME", "SLURM_JOB_WORK_DIR"} & set(got["env"])
    assert got["env"]["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"
    assert set(got["env"]) <= {"PATH", "LANG", "SLURM_JOB_ID", "SLURM_JOB_UID", "SLURM_JOB_USER",
                               "SLURM_JOB_GPUS", "SLURMD_NODENAME", "SLURM_JOB_NODELIST"}


def _recording_python(path, record) -> str:
    path.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    path.chmod(0o755)
    return str(path)


def test_a_hook_started_by_a_relative_path_reads_the_hooks_env_beside_it(tmp_path):
    # `sh sub/prolog` by hand: the wrapper's `cd /` used to come first, so it looked for
    # /sub/hooks.env and took /etc's. A CDPATH must not redirect the lookup either.
    record = tmp_path / "record"
    for d in ("sub", "decoy/sub"):
        (tmp_path / d).mkdir(parents=True)
        shutil.copy(HOOKS / "prolog", tmp_path / d / "prolog")
        py = _recording_python(tmp_path / d / "python", record if d == "sub" else tmp_path / "x")
        (tmp_path / d / "hooks.env").write_text(f"SMARTLAUNCH_PYTHON={py}\n")
    out = subprocess.run(["/bin/sh", "sub/prolog"], env={"CDPATH": str(tmp_path / "decoy")},
                         cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    import json
    assert json.loads(record.read_text()) == ["-I", "-m", "smartlaunch.slurm.hooks", "prolog",
                                              "--config", str(tmp_path / "sub" / "hooks.env")]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("python, says", [
    ("no-smartlaunch", "cannot import smartlaunch; set SMARTLAUNCH_PYTHON= in {conf}"),
    ("/nonexistent/python3", "/nonexistent/python3 cannot import smartlaunch; set SMARTLAUNCH_PYTHON="),
])
def test_hook_with_a_python_without_smartlaunch_names_the_setting(tmp_path, python, says):
    # Was: "No module named 'smartlaunch'" from -m, exit 1, no word of hooks.env.
    hook = tmp_path / "prolog"
    shutil.copy(HOOKS / "prolog", hook)
    if python == "no-smartlaunch":    # this very interpreter without its site-packages
        python = tmp_path / "bare-python"
        python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
        python.chmod(0o755)
    conf = tmp_path / "hooks.env"
    conf.write_text(f"SMARTLAUNCH_PYTHON={python}\nSMARTLAUNCH_STATE_DIR={tmp_path}/state\n")
    out = subprocess.run(["/bin/sh", str(hook)], env={}, cwd=tmp_path, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == ExitCode.HEALTH == 10, out.stderr
    lines = own_lines(out.stderr)
    assert len(lines) == 1 and lines[0].startswith("smartlaunch prolog: error: "), lines
    assert says.format(conf=conf) in lines[0], lines
    assert not (tmp_path / "state").exists()


def test_epilog_releases_the_jobs_leases(clean_env, tmp_path, monkeypatch):
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.topology.fake import from_json

    lease_dir = tmp_path / "leases"
    topo = from_json("h200-nv18-pair", {})
    # Real lease records, as two launches of jobs 9 and 10 write them.
    with LeaseManager(str(lease_dir)) as m:
        monkeypatch.setenv("SLURM_JOB_ID", "9")
        job9 = m.acquire(topo, [0], 1, wait=False, timeout_s=0)
        monkeypatch.setenv("SLURM_JOB_ID", "10")
        job10 = m.acquire(topo, [1], 1, wait=False, timeout_s=0)
        before = sorted(p.name for p in lease_dir.glob("*.holder"))
        assert len(before) == 2
        cfg = config(tmp_path, "healthy", SMARTLAUNCH_LEASE_DIR=str(lease_dir))
        assert hooks.run("epilog", cfg, {"SLURM_JOB_ID": "9", "SLURM_JOB_UID": "65534",
                                          "SLURM_JOB_USER": "nobody"}) == 0
        left = sorted(p.name for p in lease_dir.glob("*.holder"))
        assert left == [n for n in before if n.startswith("gpu-" + topo.gpu(1).uuid)]
        job9.release()
        job10.release()
    assert "released 1 lease(s)" in (tmp_path / "state" / "hooks.log").read_text()
