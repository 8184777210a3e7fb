"""Fill a Plan's launch details (NCCL variables, NUMA bindings) before any launcher runs, so
`--explain` shows exactly what the workers will get and why."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from smartlaunch.decide.plan import Plan, Strategy
from smartlaunch.errors import PolicyError
from smartlaunch.launch import nccl, numa
from smartlaunch.policy.api import Policy
from smartlaunch.topology.api import Topology
from smartlaunch.vocab import NUMA_MODES


def prepare(plan: Plan, topology: Topology, policy: Policy, environ: Mapping[str, str]) -> Plan:
    mode = policy.launch.numa_binding
    if mode not in NUMA_MODES:
        raise PolicyError(f"launch.numa_binding={mode!r} is not one of {', '.join(NUMA_MODES)}: "
                          "fix it in the policy file")
    env = _merge(plan.env, nccl.policy_env(policy, environ))
    if plan.strategy == Strategy.DDP:
        env = _merge(env, nccl.nccl_env(plan, topology, policy, environ))
    return dataclasses.replace(plan, env=env, numa=numa.plan_bindings(plan, topology, mode))


def _merge(first, second):
    """Later entries win by name; order of first appearance kept (explain reads in order)."""
    merged = {e.name: e for e in first}
    merged.update({e.name: e for e in second})
    return tuple(merged.values())
