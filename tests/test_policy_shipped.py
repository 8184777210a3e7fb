"""The policies shipped in smartlaunch/policy/shipped/: valid, and default.yaml is exactly the
built-in policy."""
from __future__ import annotations

import os
import re

import pytest

from smartlaunch.errors import PolicyError
from smartlaunch.policy.load import builtin_values, read_policy_file, validate_file
from helpers_policy import POLICIES, load_with_admin

SHIPPED = sorted(p.name for p in POLICIES.glob("*.yaml"))


def test_the_four_policies_are_shipped():
    assert {"default.yaml", "workstation-pcie.yaml", "nvlink-server.yaml",
            "shared-cluster.yaml"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_policy_validates(name):
    parsed = validate_file(str(POLICIES / name))
    assert parsed.values or parsed.enforce


@pytest.mark.parametrize("name", ["default.yaml", "workstation-pcie.yaml", "nvlink-server.yaml"])
def test_user_policies_load_as_user_files(name, clean_env):
    environ = dict(os.environ)
    del environ["SMARTLAUNCH_LEASE_DIR"]     # set by clean_env; env outranks a user file
    policy = load_with_admin(None, str(POLICIES / name), environ=environ)
    parsed = read_policy_file(str(POLICIES / name), allow_enforce=False)
    for key in parsed.values:
        assert policy.source_of(key) == f"user:{POLICIES / name}"


def test_default_yaml_equals_the_built_in_defaults_exactly():
    # Same keys (none missing, none extra) and the same values and types: the doc cannot drift.
    parsed = validate_file(str(POLICIES / "default.yaml"))
    assert not parsed.enforce
    builtin = builtin_values()
    assert parsed.values == builtin
    assert {k: type(v) for k, v in parsed.values.items()} == \
        {k: type(v) for k, v in builtin.items()}


def test_every_key_in_default_yaml_is_documented_by_a_comment():
    lines = (POLICIES / "default.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s+)([a-z_]+):", line)     # keys inside a section (not NCCL_* values)
        if m and not lines[i - 1].strip().startswith("#"):
            undocumented.append(line.strip())
    assert undocumented == []


def test_default_yaml_never_disables_p2p():
    assert "NCCL_P2P_DISABLE:" not in (POLICIES / "default.yaml").read_text()
    phb = builtin_values()["launch.nccl.PHB"]
    assert phb == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "33554432",
                   "NCCL_NTHREADS": "16", "NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "8"}


def test_shared_cluster_is_an_admin_policy_with_the_promised_rules(clean_env):
    admin = str(POLICIES / "shared-cluster.yaml")
    policy = load_with_admin(admin)
    assert policy.enforced["decision.max_gpus"] == 4
    assert policy.enforced["decision.min_efficiency"] == 0.7
    assert "SYS" not in policy.decision.ddp_link_classes
    assert policy.decision.prefer_independent_for_sweeps is True
    assert policy.source_of("decision.prefer_independent_for_sweeps") == f"enforced:{admin}"
    assert policy.launch.hang_timeout_s <= 600 and policy.dryrun.time_limit_s <= 300
    # Its non-enforced default (0.75) is above the enforced floor, so the admin layer keeps it.
    assert policy.decision.min_efficiency == 0.75
    assert policy.source_of("decision.min_efficiency") == f"admin:{admin}"


def test_shared_cluster_is_refused_as_a_user_policy(clean_env):
    with pytest.raises(PolicyError, match=r"shared-cluster.yaml:\d+: enforce: only the admin"):
        load_with_admin(None, str(POLICIES / "shared-cluster.yaml"))
