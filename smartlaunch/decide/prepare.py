"""The second half of decide's output: the NCCL variables and NUMA bindings the workers get."""
from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping

from smartlaunch.decide import nccl, numa
from smartlaunch.decide.api import Units
from smartlaunch.decide.plan import NumaBinding, Plan, Reason
from smartlaunch.errors import PolicyError
from smartlaunch.policy.api import Policy
from smartlaunch.topology.api import Topology
from smartlaunch.vocab import NUMA_MODES


def prepare(plan: Plan, topology: Topology, policy: Policy, environ: Mapping[str, str], *,
            units: Units, numactl: str | None = None, torchrun_numa: str | None = None) -> Plan:
    """numactl: its path ("" when absent; None: looked up). torchrun_numa: the user's own
    torchrun --numa-binding, which then binds collective ranks instead."""
    mode = policy.launch.numa_binding
    if mode not in NUMA_MODES:
        raise PolicyError(f"launch.numa_binding={mode!r} is not one of {', '.join(NUMA_MODES)}: "
                          "fix it in the policy file")
    env = _merge(plan.env, nccl.policy_env(policy, environ))
    if units[plan.strategy].COLLECTIVE:
        env = _merge(env, nccl.nccl_env(plan, topology, policy, environ))
        if torchrun_numa is not None:
            why = Reason(f"torchrun --numa-binding {torchrun_numa} given: torch's agent binds "
                         f"the ranks, smartlaunch does not", f"user: --numa-binding {torchrun_numa}")
            return dataclasses.replace(plan, env=env, numa=(), reasons=plan.reasons + (why,))
    plan = dataclasses.replace(plan, env=env, numa=bindings(plan, topology, mode, numactl))
    if plan.groups:
        plan = dataclasses.replace(plan, groups=tuple(
            _group(plan, i, topology, policy, environ, mode, numactl, torchrun_numa)
            for i in range(len(plan.groups))))
    return plan


def _group(plan: Plan, i: int, topology, policy, environ, mode, numactl, torchrun_numa):
    """A variant's DDP group gets what a DDP plan on its GPUs would."""
    g = plan.groups[i]
    one = plan.group_plan(i)
    env = _merge(plan.env, nccl.nccl_env(one, topology, policy, environ))
    numa = () if torchrun_numa is not None else bindings(one, topology, mode, numactl)
    return dataclasses.replace(g, env=env, numa=numa)


def bindings(plan: Plan, topology: Topology, mode: str, numactl: str | None = None
             ) -> tuple[NumaBinding, ...]:
    """One per local rank, plus one per fallback GPU as if it were the job's only GPU."""
    if numactl is None:                   # one PATH lookup, not one per fallback GPU
        numactl = shutil.which("numactl") or ""
    own = numa.plan_bindings(plan, topology, mode, numactl=numactl)
    spare = (numa.plan_bindings(dataclasses.replace(plan, gpus=(g,)), topology, mode,
                                numactl=numactl) for g in plan.fallback_gpus)
    return own + tuple(b for one in spare for b in one)


def _merge(first, second):
    """Later entries win by name; order of first appearance kept."""
    merged = {e.name: e for e in first}
    merged.update({e.name: e for e in second})
    return tuple(merged.values())
