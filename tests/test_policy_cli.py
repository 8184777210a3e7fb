"""`smartlaunch-node policy check [FILE]` and `policy show`, as real processes."""
from __future__ import annotations

import os
import subprocess
import sys

import yaml

from smartlaunch.policy.load import builtin_values, validate_file
from helpers_policy import (
    ADMIN_POLICY_PATH, POLICIES, as_admin_installed, load_with_admin, needs_admin_install, write,
)
from helpers_common import own_lines

ADMIN = ADMIN_POLICY_PATH


def node(*args: str, env: dict[str, str] | None = None, cwd, admin: str | None = "keep",
         mode: str = "0644") -> subprocess.CompletedProcess:
    """`smartlaunch-node policy ARGS`; admin: a file installed as the admin policy, None for
    none, "keep" for whatever this machine has (commands that read only the named file)."""
    argv = [sys.executable, "-m", "smartlaunch.node_cli", "policy", *args]
    if admin != "keep":
        argv = as_admin_installed(argv, admin, os.path.join(cwd, "ns"), mode)
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_check_valid_file(clean_env):
    path = str(POLICIES / "workstation-pcie.yaml")
    out = node("check", path, cwd=clean_env)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"OK: {path}\n", "")


def test_check_admin_file_says_where_enforce_counts(clean_env):
    path = str(POLICIES / "shared-cluster.yaml")
    out = node("check", path, cwd=clean_env)
    assert out.returncode == 0
    assert out.stdout.startswith(f"OK: {path} (enforces ")
    assert "honoured only in /etc/smartlaunch/policy.yaml" in out.stdout


def test_check_invalid_file_exits_with_the_policy_code(clean_env):
    path = write(clean_env, "bad.yaml", "decision:\n  trials: true\n  min_efficency: 0.5\n")
    out = node("check", path, cwd=clean_env)
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.startswith(f"smartlaunch-node: error: {path}:3: decision.min_efficency: "
                                 "unknown key; did you mean 'min_efficiency'?")
    assert len(own_lines(out.stderr)) == 1


def _refused(clean_env, text: str) -> tuple:
    """`policy check` of a bad file: exit 3, nothing on stdout; (its path, its own lines)."""
    path = write(clean_env, "bad.yaml", text)
    out = node("check", path, cwd=clean_env)
    assert out.returncode == 3 and out.stdout == ""
    return path, own_lines(out.stderr)


def test_check_names_every_problem_one_line_each(clean_env):
    path, lines = _refused(clean_env, "decision:\n  min_efficency: 0.5\n  trials: maybe\n"
                                      "launch:\n  numa_binding: bind\njobz: {}\n")
    assert [line.split(": ")[2] for line in lines] == [
        f"{path}:2", f"{path}:3", f"{path}:5", f"{path}:6"], lines
    assert all(line.startswith("smartlaunch-node: error: ") for line in lines)
    assert "decision.trials: expected true or false, got str 'maybe'" in lines[1]


def test_check_names_every_bad_element_of_a_list(clean_env):
    # Was: world_sizes named [1] only, so fixing it showed [2] on the next run.
    _, lines = _refused(clean_env, 'decision:\n  world_sizes: [2, "x", 3.5, 2, 0]\n'
                                   '  allowed_strategies: [single, dpp, 3]\n')
    assert [line.split(": ")[3] for line in lines] == [
        "decision.world_sizes[1]", "decision.world_sizes[2]", "decision.world_sizes[3]",
        "decision.world_sizes[4]", "decision.allowed_strategies[1]",
        "decision.allowed_strategies[2]"], lines
    assert "world_sizes[3]: 2 is listed twice" in lines[2]
    assert "world_sizes[4]: 0 is out of range" in lines[3]


def test_check_says_one_key_not_one_keys(clean_env):
    path = write(clean_env, "admin.yaml", "enforce:\n  decision:\n    max_gpus: 2\n")
    out = node("check", path, cwd=clean_env)
    assert out.returncode == 0 and f"OK: {path} (enforces 1 key; " in out.stdout


@needs_admin_install
def test_check_without_file_validates_every_layer(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  decision: {max_gpus: 4}\n")
    user = write(clean_env, "smartlaunch.yaml", "decision: {max_gpus: 2}\n")
    out = node("check", cwd=clean_env, admin=admin)
    assert (out.returncode, out.stdout) == (0, f"OK: {ADMIN}\nOK: {user}\n")
    write(clean_env, "smartlaunch.yaml", "decision: {max_gpus: many}\n")
    out = node("check", cwd=clean_env, admin=admin)
    assert out.returncode == 3 and "smartlaunch.yaml:1: decision.max_gpus: expected an " \
        "integer or null, got str 'many'" in out.stderr


@needs_admin_install
def test_check_without_any_file(clean_env):
    out = node("check", cwd=clean_env, admin=None)
    assert (out.returncode, out.stdout) == (0, "OK: built-in defaults (no policy file found)\n")


@needs_admin_install
def test_show_prints_the_effective_policy_with_sources(clean_env):
    admin = write(clean_env, "admin.yaml", """\
        jobs: {wait_timeout_s: 60}
        enforce:
          decision: {min_efficiency: 0.7, max_gpus: 4}
          launch: {env: {NCCL_DEBUG: WARN}}
        """)
    user = write(clean_env, "mine.yaml", "decision: {min_efficiency: 0.5, trial_steps: 7}\n")
    env = dict(os.environ, SMARTLAUNCH_LOG_DIR="/logs here")
    out = node("show", "--policy", user, env=env, cwd=clean_env, admin=admin)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"  min_efficiency: 0.7  # enforced:{ADMIN}  (user:{user} set 0.5; the admin rule " \
        f"enforce.decision.min_efficiency=0.7 in {ADMIN} wins)" in lines
    assert f"  trial_steps: 7  # user:{user}" in lines
    assert f"  wait_timeout_s: 60.0  # admin:{ADMIN}" in lines
    assert '  log_dir: /logs here  # env:SMARTLAUNCH_LOG_DIR' in lines
    assert f"    NCCL_DEBUG: WARN  # enforced:{ADMIN}" in lines
    assert "      NCCL_BUFFSIZE: \"33554432\"" in lines
    # The output is itself a valid policy equal to the effective one.
    shown = write(clean_env, "shown.yaml", out.stdout)
    policy = load_with_admin(admin, user, environ=env, cwd=str(clean_env))
    expected = builtin_values()
    expected.update({"decision.min_efficiency": 0.7, "decision.max_gpus": 4,
                     "decision.trial_steps": 7, "jobs.wait_timeout_s": 60.0,
                     "launch.log_dir": "/logs here", "launch.env.NCCL_DEBUG": "WARN",
                     "paths.lease_dir": os.environ["SMARTLAUNCH_LEASE_DIR"]})
    assert validate_file(shown).values == expected
    assert policy.decision.min_efficiency == 0.7
    assert yaml.safe_load(out.stdout)["decision"]["allowed_strategies"] == \
        ["single", "independent", "ddp"]


@needs_admin_install
def test_show_refuses_an_unsafe_admin_file(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  decision: {max_gpus: 4}\n")
    out = node("show", cwd=clean_env, admin=admin, mode="0666")
    assert out.returncode == 3 and "is group/world-writable (mode 0666)" in out.stderr
