"""Every key an admin can enforce holds against the user's file, the environment and the
command line, read through the real loading path: the admin file installed at
/etc/smartlaunch/policy.yaml (issue 13)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from smartlaunch.policy.load import builtin_values
from helpers_policy import ADMIN_POLICY_PATH, as_admin_installed, needs_admin_install, write
from helpers_common import fixture_path

# key -> (the admin's enforced value, what the user's file asks, the effective value).
# A cap ("max") or floor ("min") holds against a user asking beyond it; a list ("subset") is
# cut down; every other key is replaced by the admin's value.
CASES = {
    "decision.min_efficiency": (0.8, 0.5, 0.8),
    "decision.uncertainty_band": (0.05, 0.3, 0.05),
    "decision.trials": (False, True, False),
    "decision.trial_steps": (30, 5, 30),
    "decision.trial_seconds": (2.0, 0.1, 2.0),
    "decision.prestart": (False, True, False),
    "decision.allowed_strategies": (["single", "ddp"], ["single", "independent", "ddp"],
                                    ("single", "ddp")),
    "decision.max_gpus": (2, 8, 2),
    "decision.world_sizes": ([1, 2, 4], [1, 2, 3, 4, 8], (1, 2, 4)),
    "decision.ddp_link_classes": (["NV"], ["NV", "SYS"], ("NV",)),
    "decision.prefer_independent_for_sweeps": (True, False, True),
    "decision.memory_headroom": (0.5, 0.95, 0.5),
    "decision.avoid_busy_gpus": (True, False, True),
    "decision.avoid_unhealthy_gpus": (True, False, True),
    "decision.fallback_strategy": ("single", "ddp", "single"),
    "launch.nccl.NV": ({"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring"}),
    "launch.nccl.PIX": ({"NCCL_PROTO": "Simple"}, {"NCCL_PROTO": "LL"}, {"NCCL_PROTO": "Simple"}),
    "launch.nccl.PXB": ({"NCCL_PROTO": "Simple"}, {}, {"NCCL_PROTO": "Simple"}),
    "launch.nccl.PHB": ({"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring"}),
    "launch.nccl.NODE": ({"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring"}),
    "launch.nccl.SYS": ({"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring"}),
    "launch.numa_binding": ("off", "node", "off"),
    "launch.rank_failure_timeout_s": (5.0, 60.0, 5.0),
    "launch.hang_timeout_s": (100.0, 900.0, 100.0),
    "launch.hang_step_multiple": (10.0, 50.0, 10.0),
    "launch.startup_grace_s": (60.0, 900.0, 60.0),
    "launch.signal_grace_s": (5.0, 30.0, 5.0),
    "launch.straggler_threshold": (0.2, 0.5, 0.2),
    "launch.straggler_window_s": (60.0, 10.0, 60.0),
    "launch.gpu_sample_s": (10.0, 2.0, 10.0),
    "launch.clock_drift_threshold": (0.2, 0.05, 0.2),
    "launch.log_dir": ("/admin/logs", "/user/logs", "/admin/logs"),
    "launch.quiet": (False, True, False),
    "launch.flight_recorder": (False, True, False),
    "launch.env.NCCL_DEBUG": ("WARN", "INFO", "WARN"),
    "dryrun.time_limit_s": (60.0, 600.0, 60.0),
    "dryrun.warmup_steps": (3, 1, 3),
    "dryrun.measure_steps": (10, 100, 10),
    "dryrun.measure_seconds": (0.2, 2.0, 0.2),
    "dryrun.precision": (0.0, 0.05, 0.0),
    "dryrun.isolation": ("require", "off", "require"),
    "jobs.fail_fast": (True, False, True),
    "jobs.jobs_per_gpu": (1, 4, 1),
    "jobs.wait_timeout_s": (60.0, 7200.0, 60.0),
    "jobs.share_gpus": (False, True, False),
    "paths.cache_dir": ("/admin/cache", "/user/cache", "/admin/cache"),
    "paths.lease_dir": ("/admin/leases", "/user/leases", "/admin/leases"),
    "paths.comm_cache_max_age_s": (3600.0, 86400.0, 3600.0),
    "paths.decision_log": ("/admin/decisions.jsonl", "/user/decisions.jsonl",
                           "/admin/decisions.jsonl"),
    "paths.node_cache": ("/admin/node", "/user/node", "/admin/node"),
    "slurm.release_unused": (True, False, True),
}
# The environment variables that set a key (they rank above the user file, below enforce).
ENV_OVER = {"paths.cache_dir": ("SMARTLAUNCH_CACHE_DIR", "/env/cache"),
            "paths.lease_dir": ("SMARTLAUNCH_LEASE_DIR", "/env/leases"),
            "launch.log_dir": ("SMARTLAUNCH_LOG_DIR", "/env/logs")}


def nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def test_the_table_names_every_policy_key():
    keys = set(builtin_values()) | {"launch.env.NCCL_DEBUG"}
    assert set(CASES) == keys


@needs_admin_install
def test_every_enforced_key_holds_through_the_installed_admin_file(clean_env):
    admin = write(clean_env, "admin.yaml", yaml.safe_dump(
        {"enforce": nested({k: a for k, (a, _, _) in CASES.items()})}))
    user = write(clean_env, "user.yaml", yaml.safe_dump(nested({k: u for k, (_, u, _) in CASES.items()})))
    env = dict(os.environ, **dict(ENV_OVER.values()), NCCL_DEBUG="INFO")
    out = subprocess.run(as_admin_installed([sys.executable, "-m", "smartlaunch.node_cli", "policy",
                                             "show", "--policy", user], admin, clean_env / "ns"),
                         cwd=clean_env, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    lines = out.stdout.splitlines()
    for key, (_, _, want) in CASES.items():
        node = shown
        for part in key.split("."):
            node = node[part]
        got = tuple(node) if isinstance(want, tuple) else node
        assert got == want, key
        leaf = key.split(".")[-1]
        if not isinstance(want, dict):
            assert any(line.strip().startswith(f"{leaf}:") and
                       f"# enforced:{ADMIN_POLICY_PATH}" in line for line in lines), key


def explain(argv, admin, clean_env, **env_extra):
    env = dict(os.environ, SMARTLAUNCH_FAKE_TOPOLOGY=fixture_path("h200-nv18-pair"), **env_extra)
    cmd = as_admin_installed([sys.executable, "-m", "smartlaunch.cli", "--explain=json", *argv],
                             admin, clean_env / "ns")
    out = subprocess.run(cmd, cwd=clean_env, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return {e["name"]: e for e in json.loads(out.stdout)["env"]}


@needs_admin_install
def test_enforced_nccl_variable_wins_over_the_users_environment_in_the_ddp_plan(clean_env):
    admin = write(clean_env, "admin.yaml", """\
        enforce:
          launch:
            nccl: {NV: {NCCL_ALGO: Ring}}
            env: {NCCL_DEBUG: WARN}
        """)
    script = write(clean_env, "train.py", "")
    env = explain(["--strategy", "ddp", "--nproc-per-node", "2", script], admin, clean_env,
                  NCCL_ALGO="Tree", NCCL_DEBUG="INFO")
    assert (env["NCCL_ALGO"]["value"], env["NCCL_ALGO"]["source"]) == ("Ring", "admin enforce")
    assert (env["NCCL_DEBUG"]["value"], env["NCCL_DEBUG"]["source"]) == ("WARN", "admin enforce")


@needs_admin_install
def test_enforced_worker_variables_reach_a_single_gpu_job(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  launch:\n    env: {OMP_NUM_THREADS: '2'}\n")
    out = clean_env / "env.json"
    script = write(clean_env, "dump.py", f"import json, os, sys\n"
                   f"json.dump(dict(os.environ), open({str(out)!r}, 'w'))\n")
    env = explain(["--strategy", "single", script], admin, clean_env, OMP_NUM_THREADS="16")
    assert env["OMP_NUM_THREADS"]["value"] == "2"
    run = subprocess.run(as_admin_installed([sys.executable, "-m", "smartlaunch.cli", "--strategy",
                                             "single", script], admin, clean_env / "ns2"),
                         cwd=clean_env, env=dict(os.environ, OMP_NUM_THREADS="16"),
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(out.read_text())["OMP_NUM_THREADS"] == "2"
