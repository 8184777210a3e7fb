"""NCCL variables for a DDP plan, chosen by the link class of its GPU group. The user's
environment wins over the policy, enforced variables over both; NCCL_NVLS_ENABLE is never
turned on by us; nothing disables a P2P path the topology reports as working."""
from __future__ import annotations

from collections.abc import Mapping

from smartlaunch.decide.plan import EnvVar, Plan
from smartlaunch.policy.api import Policy
from smartlaunch.policy.enforce import enforced_env
from smartlaunch.topology.api import Topology, link_family
from smartlaunch.vocab import FAMILY_P2P_LEVEL, P2P_LEVELS, p2p_level

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
        if name in enforced:
            continue
        if name == NVLS:
            continue                                # only the environment decides NVLS
        if _disables_p2p(name, value, working_p2p):
            continue
        if name in environ:
            out[name] = EnvVar(name, environ[name], f"kept from environment (policy {src} wanted {value})")
        else:
            out[name] = EnvVar(name, value, src)
    if NVLS in environ:
        out[NVLS] = EnvVar(NVLS, environ[NVLS], "kept from environment")
    for name, value in enforced.items():
        value = str(value)
        if name == NVLS and value != "0" and environ.get(NVLS) != value:
            continue                                # never turn NVLS on, even by enforcement
        out[name] = EnvVar(name, value, "admin enforce")
    return tuple(out.values())


def policy_env(policy: Policy, environ: Mapping[str, str]) -> tuple[EnvVar, ...]:
    """`launch.env` for every worker, by the same precedence as nccl_env."""
    enforced = enforced_env(policy)
    out = []
    for name, value in policy.launch.env.items():
        value = str(value)
        src = f"policy launch.env.{name} ({policy.source_of(f'launch.env.{name}')})"
        if name == NVLS and value != "0" and environ.get(NVLS) != value:
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
    gpus = sorted(plan.gpus)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
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
