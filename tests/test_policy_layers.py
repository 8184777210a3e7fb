"""Precedence: built-in < admin < user file < env < CLI, then the admin's enforce over all."""
from __future__ import annotations

import os

import pytest

from smartlaunch.errors import ExitCode, PolicyError
from smartlaunch.policy import Policy, apply_request, check_request, enforced_env
from smartlaunch.request import Request
from helpers_policy import load_with_admin, write


def env_without_dirs(**extra):
    environ = dict(os.environ)
    environ.pop("SMARTLAUNCH_LEASE_DIR", None)      # clean_env's; these tests set their own
    environ.update(extra)
    return environ


def test_no_files_gives_the_built_in_policy(clean_env):
    policy = load_with_admin(None, environ=env_without_dirs())
    default = Policy()
    assert (policy.decision, policy.launch, policy.dryrun, policy.jobs, policy.paths) == \
        (default.decision, default.launch, default.dryrun, default.jobs, default.paths)
    assert set(policy.sources.values()) == {"built-in"}
    assert "decision.min_efficiency" in policy.sources and "launch.nccl.PHB" in policy.sources
    assert policy.layers == ("built-in",) and policy.admin_path is None


def test_each_layer_overrides_the_one_below(clean_env):
    admin = write(clean_env, "admin.yaml", """\
        paths: {cache_dir: /admin/cache, lease_dir: /admin/leases}
        launch: {log_dir: /admin/logs, signal_grace_s: 5}
        decision: {max_gpus: 8, uncertainty_band: 0.2}
        """)
    user = write(clean_env, "user.yaml", """\
        paths: {cache_dir: /user/cache, lease_dir: /user/leases}
        launch: {log_dir: /user/logs}
        decision: {max_gpus: 6}
        """)
    environ = env_without_dirs(SMARTLAUNCH_CACHE_DIR="/env/cache",
                               SMARTLAUNCH_LOG_DIR="/env/logs", SMARTLAUNCH_LEASE_DIR="")
    policy = load_with_admin(admin, user, environ=environ)
    assert policy.launch.signal_grace_s == 5.0
    assert policy.source_of("launch.signal_grace_s") == f"admin:{admin}"
    assert policy.decision.uncertainty_band == 0.2
    assert (policy.paths.lease_dir, policy.source_of("paths.lease_dir")) == \
        ("/user/leases", f"user:{user}")          # an empty env variable sets nothing
    assert (policy.paths.cache_dir, policy.source_of("paths.cache_dir")) == \
        ("/env/cache", "env:SMARTLAUNCH_CACHE_DIR")
    assert (policy.launch.log_dir, policy.source_of("launch.log_dir")) == \
        ("/env/logs", "env:SMARTLAUNCH_LOG_DIR")
    assert policy.source_of("decision.max_gpus") == f"user:{user}"
    cli = apply_request(policy, Request(max_gpus=5))
    assert (cli.decision.max_gpus, cli.source_of("decision.max_gpus")) == \
        (5, "cli:--nproc-per-node")
    assert cli.source_of("paths.cache_dir") == "env:SMARTLAUNCH_CACHE_DIR"
    assert policy.layers == ("built-in", f"admin:{admin}", f"user:{user}",
                             "env:SMARTLAUNCH_CACHE_DIR", "env:SMARTLAUNCH_LOG_DIR")


def test_enforce_wins_over_user_file_env_and_cli(clean_env):
    admin = write(clean_env, "admin.yaml", """\
        enforce:
          paths: {lease_dir: /shared/leases}
          launch: {log_dir: /shared/logs}
          decision: {max_gpus: 4}
        """)
    user = write(clean_env, "user.yaml", "paths: {lease_dir: /mine}\ndecision: {max_gpus: 8}\n")
    environ = env_without_dirs(SMARTLAUNCH_LEASE_DIR="/env/leases",
                               SMARTLAUNCH_LOG_DIR="/env/logs")
    policy = load_with_admin(admin, user, environ=environ)
    where = f"enforced:{admin}"
    assert (policy.paths.lease_dir, policy.source_of("paths.lease_dir")) == ("/shared/leases", where)
    assert (policy.launch.log_dir, policy.source_of("launch.log_dir")) == ("/shared/logs", where)
    assert (policy.decision.max_gpus, policy.source_of("decision.max_gpus")) == (4, where)
    assert policy.notes["decision.max_gpus"] == (
        f"user:{user} set 8; the admin rule enforce.decision.max_gpus=4 in {admin} wins")
    assert policy.notes["paths.lease_dir"] == (
        f"env:SMARTLAUNCH_LEASE_DIR set /env/leases; the admin rule "
        f"enforce.paths.lease_dir=/shared/leases in {admin} wins")
    assert policy.enforced == {"paths.lease_dir": "/shared/leases",
                               "launch.log_dir": "/shared/logs", "decision.max_gpus": 4}
    with pytest.raises(PolicyError):
        apply_request(policy, Request(max_gpus=5))
    assert apply_request(policy, Request(max_gpus=3)).decision.max_gpus == 3
    assert policy.layers[-1] == where


def test_caps_and_floors_keep_a_stricter_user_value(clean_env):
    admin = write(clean_env, "admin.yaml", """\
        enforce:
          decision:
            max_gpus: 4
            min_efficiency: 0.7
            allowed_strategies: [single, independent]
            ddp_link_classes: [NV, PIX, PXB, PHB, NODE]
          launch: {hang_timeout_s: 600}
        """)
    user = write(clean_env, "user.yaml", """\
        decision:
          max_gpus: 2
          min_efficiency: 0.9
          allowed_strategies: [single, ddp]
          ddp_link_classes: [NV]
        launch: {hang_timeout_s: 900}
        """)
    policy = load_with_admin(admin, user, environ=env_without_dirs())
    d = policy.decision
    assert (d.max_gpus, d.min_efficiency, d.ddp_link_classes) == (2, 0.9, ("NV",))
    for key in ("decision.max_gpus", "decision.min_efficiency", "decision.ddp_link_classes"):
        assert policy.source_of(key) == f"user:{user}"
        assert policy.notes[key].startswith(f"user:{user} value is within the admin rule")
    # [single, ddp] cut down to what the admin allows; the hang timeout capped at 600 s.
    assert d.allowed_strategies == ("single",)
    assert policy.source_of("decision.allowed_strategies") == f"enforced:{admin}"
    assert policy.launch.hang_timeout_s == 600.0
    assert policy.rule("decision.allowed_strategies") == \
        f"decision.allowed_strategies=[single] (enforced:{admin})"


def test_rule_names_the_enforced_source_for_explain(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  decision: {min_efficiency: 0.7}\n")
    user = write(clean_env, "user.yaml", "decision: {min_efficiency: 0.5}\n")
    policy = load_with_admin(admin, user, environ=env_without_dirs())
    assert policy.rule("decision.min_efficiency") == \
        f"decision.min_efficiency=0.7 (enforced:{admin})"
    assert policy.rule("launch.nccl.PHB").startswith("launch.nccl.PHB={'NCCL_ALGO': 'Tree'")
    # A key left at null reads as a policy file writes it, never as Python's None.
    assert policy.rule("decision.max_gpus") == "decision.max_gpus=null (built-in)"


def test_user_file_discovery_order(clean_env):
    home_file = write(clean_env / "home", ".config/smartlaunch/policy.yaml",
                      "decision: {trial_steps: 30}\njobs: {jobs_per_gpu: 2}\n")
    environ = env_without_dirs()
    assert load_with_admin(None, environ=environ).source_of("decision.trial_steps") == f"user:{home_file}"
    cwd_file = write(clean_env, "smartlaunch.yaml", "decision: {trial_steps: 40}\n")
    policy = load_with_admin(None, environ=environ, cwd=str(clean_env))
    # Only the first file found is read: the home file's jobs_per_gpu is not merged in.
    assert (policy.decision.trial_steps, policy.jobs.jobs_per_gpu) == (40, 1)
    assert policy.source_of("decision.trial_steps") == f"user:{cwd_file}"
    given = write(clean_env, "given.yaml", "decision: {trial_steps: 50}\n")
    policy = load_with_admin(None, given, environ=environ, cwd=str(clean_env))
    assert (policy.decision.trial_steps, policy.source_of("decision.trial_steps")) == \
        (50, f"user:{given}")
    with pytest.raises(PolicyError, match=r"missing.yaml \(--policy\) not found"):
        load_with_admin(None, str(clean_env / "missing.yaml"), environ=environ)


def test_invalid_user_file_fails_the_load(clean_env):
    write(clean_env, "smartlaunch.yaml", "decision:\n  min_efficiency: lots\n")
    with pytest.raises(PolicyError, match=r"smartlaunch.yaml:2: decision.min_efficiency: "):
        load_with_admin(None, environ=env_without_dirs(), cwd=str(clean_env))


def test_fallback_outside_allowed_strategies_names_both_sources(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  decision:\n"
                                           "    allowed_strategies: [independent, ddp]\n")
    with pytest.raises(PolicyError) as err:
        load_with_admin(admin, environ=env_without_dirs())
    assert str(err.value) == (
        "decision.fallback_strategy=single (built-in) is not in decision.allowed_strategies="
        f"[independent, ddp] (enforced:{admin}); set fallback_strategy to one of independent, ddp")


def test_pointing_policy_at_the_admin_file_does_not_read_it_twice(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  decision: {max_gpus: 2}\n")
    policy = load_with_admin(admin, admin, environ=env_without_dirs())
    assert policy.layers == ("built-in", f"admin:{admin}", f"enforced:{admin}")


@pytest.fixture
def capped(clean_env):
    admin = write(clean_env, "admin.yaml", """\
        enforce:
          decision: {max_gpus: 4, allowed_strategies: [single, independent]}
          launch:
            env: {NCCL_DEBUG: WARN, NCCL_SOCKET_IFNAME: ib0}
            nccl: {PHB: {NCCL_ALGO: Ring}}
        launch:
          env: {OMP_NUM_THREADS: 4}
        """)
    return admin, load_with_admin(admin, environ=env_without_dirs())


def test_cli_request_beyond_the_gpu_cap_is_refused(capped):
    admin, policy = capped
    with pytest.raises(PolicyError) as err:
        check_request(policy, Request(max_gpus=8))
    assert str(err.value) == (
        "--nproc-per-node 8 exceeds the admin policy's cap (enforce.decision.max_gpus=4 in "
        f"{admin}); use --nproc-per-node 4 or fewer")
    assert err.value.exit_code == ExitCode.POLICY
    check_request(policy, Request(max_gpus=4))


def test_cli_strategy_forbidden_by_the_admin_is_refused(capped):
    admin, policy = capped
    with pytest.raises(PolicyError) as err:
        check_request(policy, Request(strategy="ddp"))
    assert str(err.value) == (
        "--strategy ddp is forbidden by the admin policy (enforce.decision.allowed_strategies="
        f"[single, independent] in {admin}); use --strategy auto, single or independent")
    check_request(policy, Request(strategy="auto"))
    forced = apply_request(policy, Request(strategy="independent"))
    assert forced.decision.allowed_strategies == ("independent",)
    assert forced.source_of("decision.allowed_strategies") == "cli:--strategy"


def test_single_allowed_strategy_message(clean_env):
    admin = write(clean_env, "admin.yaml", "enforce:\n  decision:\n"
                                           "    allowed_strategies: [single]\n")
    policy = load_with_admin(admin, environ=env_without_dirs())
    with pytest.raises(PolicyError, match=r"\[single\] in .*\); use --strategy auto or single$"):
        check_request(policy, Request(strategy="independent"))


def test_without_admin_rules_any_request_passes(clean_env):
    policy = load_with_admin(None, environ=env_without_dirs())
    check_request(policy, Request(max_gpus=64, strategy="ddp"))


def test_enforced_env_is_only_the_admins_mandatory_variables(capped):
    _, policy = capped
    assert enforced_env(policy) == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "ib0"}
    assert enforced_env(policy, "PHB") == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "ib0",
                                           "NCCL_ALGO": "Ring"}
    assert enforced_env(policy, "NV") == enforced_env(policy)
    # The admin's non-enforced env is a default, not mandatory.
    assert policy.launch.env["OMP_NUM_THREADS"] == "4"
    assert policy.launch.nccl["PHB"] == {"NCCL_ALGO": "Ring"}   # a family is replaced whole


def test_torchruns_shutdown_timeout_is_the_signal_grace_under_the_admins_cap(clean_env):
    # torchrun waits 30 s (--shutdown-timeout, TORCH_ELASTIC_SHUTDOWN_TIMEOUT) between SIGTERM
    # and SIGKILL; so does smartlaunch, and either setting is taken as torchrun takes it.
    import argparse
    policy = load_with_admin(None, environ=env_without_dirs())
    assert policy.launch.signal_grace_s == 30.0
    flag = Request(torchrun_args=argparse.Namespace(shutdown_timeout=90))
    got = apply_request(policy, flag, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"})
    assert (got.launch.signal_grace_s, got.source_of("launch.signal_grace_s")) == \
        (90.0, "cli:--shutdown-timeout")
    none = Request(torchrun_args=argparse.Namespace(shutdown_timeout=None))
    got = apply_request(policy, none, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"})
    assert (got.launch.signal_grace_s, got.source_of("launch.signal_grace_s")) == \
        (5.0, "env:TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    admin = write(clean_env, "admin.yaml", "enforce:\n  launch: {signal_grace_s: 60}\n")
    capped = load_with_admin(admin, environ=env_without_dirs())
    with pytest.raises(PolicyError, match=r"--shutdown-timeout=90 s exceeds the admin policy's "
                                          r"cap \(enforce.launch.signal_grace_s=60"):
        apply_request(capped, flag)
    assert apply_request(capped, none, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "45"}) \
        .launch.signal_grace_s == 45.0
