"""The second half of decide's output: the NCCL variables and NUMA bindings the workers get.
Both are choices (a link class's NCCL table, which CPUs a rank runs on), so they are made here,
before any launcher runs, and `--explain` shows exactly what the workers will get and why.
"""
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
    """units: the strategy units by name (strategies.REGISTRY). numactl: its path ("" when absent); None looks it up on PATH. torchrun_numa: the
    user's own torchrun --numa-binding, which torch's agent applies to DDP ranks instead."""
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
    """A variant's DDP group (decide/pack.py) gets what a DDP plan on its GPUs would: the NCCL
    table of its link class, one NUMA binding per local rank (none when torchrun's own
    --numa-binding binds the ranks)."""
    g = plan.groups[i]
    one = plan.group_plan(i)
    env = _merge(plan.env, nccl.nccl_env(one, topology, policy, environ))
    numa = () if torchrun_numa is not None else bindings(one, topology, mode, numactl)
    return dataclasses.replace(g, env=env, numa=numa)


def bindings(plan: Plan, topology: Topology, mode: str, numactl: str | None = None
             ) -> tuple[NumaBinding, ...]:
    """One per local rank (independent: one per GPU of the pool). A single job's fallback GPUs
    get theirs too, each as if it were the job's only GPU, so a job that moves is bound to the
    node of the GPU it really runs on."""
    if numactl is None:                   # one PATH lookup, not one per fallback GPU
        numactl = shutil.which("numactl") or ""
    own = numa.plan_bindings(plan, topology, mode, numactl=numactl)
    spare = (numa.plan_bindings(dataclasses.replace(plan, gpus=(g,)), topology, mode,
                                numactl=numactl) for g in plan.fallback_gpus)
    return own + tuple(b for one in spare for b in one)


def _merge(first, second):
    """Later entries win by name; order of first appearance kept (explain reads in order)."""
    merged = {e.name: e for e in first}
    merged.update({e.name: e for e in second})
    return tuple(merged.values())
