"""NUMA inside the worker: the bindings decide chose travel in SMARTLAUNCH_NUMA; the worker hook
finds its own entry and re-executes under numactl or sets its CPU affinity."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # the worker hook imports this module: no decide layer in every rank
    from smartlaunch.decide.plan import NumaBinding

ENV_VAR = "SMARTLAUNCH_NUMA"
APPLIED_VAR = "SMARTLAUNCH_NUMA_APPLIED"    # set when the worker re-executed under numactl


def encode(bindings: Sequence[NumaBinding]) -> str:
    """The value of SMARTLAUNCH_NUMA: what each worker needs to bind itself."""
    return json.dumps([{"local_rank": b.local_rank, "node": b.numa_node, "cpus": list(b.cpus),
                        "mechanism": b.mechanism} for b in bindings if b.mechanism != "none"],
                      separators=(",", ":"))


def binding_for(environ: Mapping[str, str]) -> dict | None:
    """This worker's entry: the only one, or the one of its LOCAL_RANK."""
    raw = environ.get(ENV_VAR)
    if not raw:
        return None
    try:
        entries = json.loads(raw)
    except ValueError:
        return None
    if len(entries) == 1:
        return entries[0]
    lr = int(environ.get("LOCAL_RANK", "0"))
    return next((e for e in entries if e.get("local_rank") == lr), None)


def numactl_argv(entry: dict, argv: Sequence[str]) -> list[str]:
    """--physcpubind (not --cpunodebind): the node may hold CPUs outside this job's cpuset."""
    from smartlaunch.topology.cpus import format_cpulist    # here: every rank imports numa.py
    return [shutil.which("numactl") or "numactl", f"--physcpubind={format_cpulist(entry['cpus'])}",
            f"--membind={entry['node']}", "--", *argv]


def apply_affinity(entry: dict) -> None:
    cpus = set(entry["cpus"]) & os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
