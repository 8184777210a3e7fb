"""The second half of decide's output: what the workers get beside the Plan's command.

NCCL variables for a DDP plan, chosen by the link class of its GPU group. The user's
environment wins over the policy, enforced variables over both; NCCL_NVLS_ENABLE is never
turned on by us; nothing disables a P2P path the topology reports as working.

NUMA bindings: which CPUs (and memory node) each local rank uses: those of the NUMA node
of the GPU it really uses, within this job's cpuset (launch/numa.py applies them)."""
from __future__ import annotations

import dataclasses
import itertools
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from smartlaunch.decide.api import Units
from smartlaunch.decide.plan import EnvVar, NumaBinding, Plan, Reason
from smartlaunch.errors import PolicyError
from smartlaunch.policy.api import Policy
from smartlaunch.policy.enforce import enforced_env
from smartlaunch.topology.api import Topology, link_family
from smartlaunch.topology.cpus import parse_cpulist
from smartlaunch.vocab import FAMILY_P2P_LEVEL, NUMA_MODES, P2P_LEVELS, p2p_level


def prepare(plan: Plan, topology: Topology, policy: Policy, environ: Mapping[str, str], *,
            units: Units, numactl: str | None = None, torchrun_numa: str | None = None) -> Plan:
    """numactl: its path ("" when absent; None: looked up). torchrun_numa: the user's own
    torchrun --numa-binding, which then binds collective ranks instead."""
    mode = policy.launch.numa_binding
    if mode not in NUMA_MODES:
        raise PolicyError(f"launch.numa_binding={mode!r} is not one of {', '.join(NUMA_MODES)}: "
                          "fix it in the policy file")
    env = _merge(plan.env, policy_env(policy, environ))
    if units[plan.strategy].COLLECTIVE:
        env = _merge(env, nccl_env(plan, topology, policy, environ))
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
    env = _merge(plan.env, nccl_env(one, topology, policy, environ))
    numa = () if torchrun_numa is not None else bindings(one, topology, mode, numactl)
    return dataclasses.replace(g, env=env, numa=numa)


def bindings(plan: Plan, topology: Topology, mode: str, numactl: str | None = None
             ) -> tuple[NumaBinding, ...]:
    """One per local rank, plus one per fallback GPU as if it were the job's only GPU."""
    if numactl is None:                   # one PATH lookup, not one per fallback GPU
        numactl = shutil.which("numactl") or ""
    own = plan_bindings(plan, topology, mode, numactl=numactl)
    spare = (plan_bindings(dataclasses.replace(plan, gpus=(g,)), topology, mode,
                                numactl=numactl) for g in plan.fallback_gpus)
    return own + tuple(b for one in spare for b in one)


def _merge(first, second):
    """Later entries win by name; order of first appearance kept."""
    merged = {e.name: e for e in first}
    merged.update({e.name: e for e in second})
    return tuple(merged.values())


# ---- NCCL variables -------------------------------------------------------------------------
NVLS = "NCCL_NVLS_ENABLE"


def nccl_env(plan: Plan, topology: Topology, policy: Policy, environ: Mapping[str, str],
             enforced: Mapping[str, str] | None = None) -> tuple[EnvVar, ...]:
    family = link_family(plan.link_class) if plan.link_class else None
    enforced = dict(enforced_env(policy, family) if enforced is None else enforced)
    table = policy.launch.nccl.get(family, {}) if family else {}
    src = _policy_source(policy, family)
    working_p2p = _working_p2p_families(plan, topology)
    out: dict[str, EnvVar] = {}
    for name, value in table.items():
        value = str(value)
        # only the environment decides NVLS; nothing disables a working P2P path
        if name in enforced or name == NVLS or _disables_p2p(name, value, working_p2p):
            continue
        if name in environ:
            out[name] = EnvVar(name, environ[name], f"kept from environment (policy {src} wanted {value})")
        else:
            out[name] = EnvVar(name, value, src)
    if NVLS in environ:
        out[NVLS] = EnvVar(NVLS, environ[NVLS], "kept from environment")
    for name, value in enforced.items():
        value = str(value)
        if _turns_nvls_on(name, value, environ):     # not even by enforcement
            continue
        out[name] = EnvVar(name, value, "admin enforce")
    return tuple(out.values())


def _turns_nvls_on(name: str, value: str, environ: Mapping[str, str]) -> bool:
    """Whether name=value would turn NVLS on where the environment does not."""
    return name == NVLS and value != "0" and environ.get(NVLS) != value


def policy_env(policy: Policy, environ: Mapping[str, str]) -> tuple[EnvVar, ...]:
    """`launch.env` for every worker, by the same precedence as nccl_env."""
    enforced = enforced_env(policy)
    out = []
    for name, value in policy.launch.env.items():
        value = str(value)
        src = f"policy launch.env.{name} ({policy.source_of(f'launch.env.{name}')})"
        if _turns_nvls_on(name, value, environ):
            continue
        if name in enforced:
            out.append(EnvVar(name, enforced[name], "admin enforce"))
        elif name in environ:
            out.append(EnvVar(name, environ[name], f"kept from environment ({src} wanted {value})"))
        else:
            out.append(EnvVar(name, value, src))
    return tuple(out)


def _policy_source(policy: Policy, family: str | None) -> str:
    key = f"launch.nccl.{family}"
    origin = policy.sources.get(key) or policy.source_of("launch.nccl")
    return f"policy {key} ({origin})"


def _working_p2p_families(plan: Plan, topology: Topology) -> set[str]:
    fams: set[str] = set()
    for a, b in itertools.combinations(sorted(plan.gpus), 2):
        try:
            link = topology.link(a, b)
        except KeyError:
            continue
        if link.p2p:
            fams.add(link.family)
    return fams


def _disables_p2p(name: str, value: str, working: set[str]) -> bool:
    if not working:
        return False
    if name == "NCCL_P2P_DISABLE":
        return value.strip().lower() not in ("0", "", "false", "no")
    if name == "NCCL_P2P_LEVEL":
        # P2P is used when the path is at most this far.
        level = p2p_level(value)
        if level is None:
            return False
        return any(P2P_LEVELS.index(FAMILY_P2P_LEVEL[f]) > P2P_LEVELS.index(level)
                   for f in working if f in FAMILY_P2P_LEVEL)
    return False


# ---- NUMA bindings --------------------------------------------------------------------------
SINGLE_NODE_NOTE = "single NUMA node: no binding needed"


def core_groups(cpus: Sequence[int], siblings: Callable[[int], tuple[int, ...]] | None = None
                ) -> list[tuple[int, ...]]:
    """CPUs grouped by physical core (without sibling information, each CPU alone)."""
    siblings = siblings or _sysfs_siblings
    allowed, seen, groups = set(cpus), set(), []
    for c in sorted(cpus):
        if c in seen:
            continue
        group = tuple(sorted(s for s in (siblings(c) or (c,)) if s in allowed)) or (c,)
        seen.update(group)
        groups.append(group)
    return groups


def _sysfs_siblings(cpu: int) -> tuple[int, ...]:
    p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        return parse_cpulist(p.read_text()) or (cpu,)
    except OSError:
        return (cpu,)


def plan_bindings(plan: Plan, topology: Topology, mode: str, *, numactl: str | None = None,
                  siblings: Callable[[int], tuple[int, ...]] | None = None
                  ) -> tuple[NumaBinding, ...]:
    """One binding per entry of plan.gpus (local rank = position)."""
    if plan.device != "cuda" or not plan.gpus:
        return ()
    numactl = numactl if numactl is not None else (shutil.which("numactl") or "")
    nodes = {n: c for n, c in topology.numa_nodes.items() if n >= 0}
    out: list[NumaBinding] = []
    for lr, idx in enumerate(plan.gpus):
        try:
            g = topology.gpu(idx)
        except KeyError:
            out.append(NumaBinding(lr, idx, -1, (), mode, "none", f"GPU {idx} not in topology: not bound"))
            continue
        if mode == "off":
            out.append(NumaBinding(lr, idx, g.numa_node, (), mode, "none",
                                   "launch.numa_binding=off: not bound"))
            continue
        if g.numa_node < 0 or len(nodes) <= 1:
            out.append(NumaBinding(lr, idx, -1, (), mode, "none", SINGLE_NODE_NOTE))
            continue
        cpus = tuple(g.cpus or nodes.get(g.numa_node, ()))
        if not cpus:
            out.append(NumaBinding(lr, idx, g.numa_node, (), mode, "none",
                                   f"no CPU of NUMA node {g.numa_node} is allowed to this job: not bound"))
            continue
        out.append(NumaBinding(lr, idx, g.numa_node, cpus, mode, "", ""))
    if mode == "exclusive-cores":
        out = _split_cores(out, siblings)
    return tuple(_with_mechanism(b, numactl) for b in out)


def _split_cores(bindings: list[NumaBinding], siblings) -> list[NumaBinding]:
    """Ranks on one node share its cores in contiguous, disjoint groups of whole cores."""
    by_node: dict[int, list[int]] = {}
    for i, b in enumerate(bindings):
        if b.cpus:
            by_node.setdefault(b.numa_node, []).append(i)
    out = list(bindings)
    for node, members in by_node.items():
        cores = core_groups(bindings[members[0]].cpus, siblings)
        k = len(members)
        if len(cores) < k:
            for i in members:
                out[i] = dataclasses.replace(out[i], note=f"{len(cores)} cores on node {node} "
                                             f"for {k} ranks: sharing the node's CPUs")
            continue
        for j, i in enumerate(members):
            lo, hi = j * len(cores) // k, (j + 1) * len(cores) // k
            mine = tuple(c for core in cores[lo:hi] for c in core)
            out[i] = dataclasses.replace(out[i], cpus=mine,
                                         note=f"cores {hi - lo} of {len(cores)} on node {node}")
    return out


def _with_mechanism(b: NumaBinding, numactl: str) -> NumaBinding:
    if b.mechanism == "none":
        return b
    if numactl:
        mechanism, note = "numactl", f"CPUs and memory on node {b.numa_node}"
    else:
        mechanism = "sched_setaffinity"
        note = "numactl not installed: CPU affinity only, memory not bound"
    return dataclasses.replace(b, mechanism=mechanism, note=f"{b.note}; {note}" if b.note else note)
