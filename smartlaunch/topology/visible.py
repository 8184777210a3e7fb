"""Which physical GPUs this job may use, in CUDA ordinal order, mimicking the CUDA driver:

- CUDA_VISIBLE_DEVICES unset: every GPU; empty: none. Entries are indices, GPU UUIDs (or a
  unique prefix) or MIG instances ("MIG-<uuid>", "MIG-GPU-<uuid>/<gi>/<ci>"), order kept.
- CUDA stops at the first entry naming no device; the devices before it stay visible (we say
  why in a message). An entry that is no index or UUID at all ("cuda:0") is a UsageError.
- A scheduler's GPU allocation (smartlaunch.allocation) narrows the pool; when NVML shows more
  GPUs than allocated there is no device cgroup and the allocation names physical indices."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from smartlaunch import allocation
from smartlaunch.errors import UsageError
from smartlaunch.topology.api import Finding, Severity

_UUID_HEX = re.compile(r"^[0-9a-fA-F-]+$")


@dataclass(frozen=True)
class PhysicalGPU:
    """One GPU as NVML enumerates it."""
    nvml_index: int
    uuid: str
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Visibility:
    nvml_indices: tuple[int, ...]        # CUDA ordinal i -> nvml_indices[i]
    mig: dict[int, str] = field(default_factory=dict)   # nvml index -> MIG UUID it was picked by
    messages: tuple[str, ...] = ()       # entries dropped, and why (CUDA would drop them too)
    source: str = "all"                  # "all", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", ...


def resolve_visible(physical: Sequence, environ: Mapping[str, str]) -> list[int]:
    """NVML indices of the GPUs this job may use, in CUDA ordinal order. `physical`: PhysicalGPU
    objects or (nvml_index, uuid, mig_uuids) tuples. Raises UsageError/SlurmError for values that
    are not IDs at all."""
    return list(resolve_visibility(physical, environ).nvml_indices)


def resolve_visibility(physical: Sequence, environ: Mapping[str, str]) -> Visibility:
    """Like resolve_visible, plus the messages and MIG picks the backends report."""
    gpus = sorted((_as_physical(p) for p in physical), key=lambda p: p.nvml_index)
    messages: list[str] = []
    pool, pool_source, renumbered = _scheduler_pool(gpus, environ, messages)
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return Visibility(tuple(p.nvml_index for p in pool), messages=tuple(messages),
                          source=pool_source or "all")
    return _apply_cvd(cvd, pool, gpus, renumbered, messages)


def _as_physical(p) -> PhysicalGPU:
    if isinstance(p, PhysicalGPU):
        return p
    idx, uuid, *rest = p
    return PhysicalGPU(int(idx), str(uuid), tuple(rest[0]) if rest else ())


def _scheduler_pool(gpus: list[PhysicalGPU], environ, messages) -> tuple[list, str | None, bool]:
    """The GPUs CUDA_VISIBLE_DEVICES indexes into, and whether the scheduler renumbered them."""
    alloc = allocation.gpu_allocation(environ)
    if alloc is None:
        return gpus, None, False
    ids, var, raw = list(alloc.gpus), alloc.source, environ.get(alloc.source, "")
    by_index = {p.nvml_index: p for p in gpus}
    if all(i in by_index for i in ids):
        allocated = [by_index[i] for i in sorted(set(ids))]
        # More GPUs open to us than allocated: no device cgroup, physical indices.
        if len(gpus) > len(allocated):
            return allocated, var, alloc.renumbered
        return gpus, var, False
    if len(gpus) == len(ids):
        return gpus, var, False
    missing = sorted(set(ids) - set(by_index))
    messages.append(f"{var}={raw} names GPU(s) {missing} that NVML does not show; "
                    f"using the {len(ids) - len(missing)} that exist")
    return [by_index[i] for i in sorted(set(ids)) if i in by_index], var, False


def _apply_cvd(cvd: str, pool: list[PhysicalGPU], gpus: list[PhysicalGPU], renumbered: bool,
               messages: list[str]) -> Visibility:
    entries = [e.strip() for e in cvd.split(",")]
    if cvd.strip() in ("", "NoDevFiles"):
        if cvd.strip():
            messages.append("CUDA_VISIBLE_DEVICES=NoDevFiles: Slurm found no GPU devices for this job")
        return Visibility((), messages=tuple(messages), source="CUDA_VISIBLE_DEVICES")
    for e in entries:
        if not _well_formed(e):
            raise UsageError(
                f"CUDA_VISIBLE_DEVICES={cvd!r}: {e!r} is neither a GPU index nor a GPU/MIG UUID; "
                f"write indices or UUIDs separated by commas, e.g. CUDA_VISIBLE_DEVICES=0,1")
    picked: list[int] = []
    mig: dict[int, str] = {}
    for pos, e in enumerate(entries):
        target, why = _lookup(e, pool if renumbered else gpus)
        if target is not None and target not in pool:
            target, why = None, "is not in this job's Slurm allocation"
        if target is not None and target.nvml_index in picked:
            target, why = None, "repeats a GPU already listed"
        if target is None and not picked and gpus and why.startswith(_NO_SUCH_DEVICE):
            raise UsageError(_hides_all(cvd, e, why, pool if renumbered else gpus))
        if target is None:
            rest = ",".join(entries[pos:])
            messages.append(f"CUDA_VISIBLE_DEVICES={cvd}: {e!r} {why}; CUDA ignores it and "
                            f"everything after it ({rest})")
            break
        picked.append(target.nvml_index)
        if e.upper().startswith("MIG-"):
            mig[target.nvml_index] = e
    return Visibility(tuple(picked), mig=mig, messages=tuple(messages),
                      source="CUDA_VISIBLE_DEVICES")


# _lookup's reasons for an entry that names no device at all.
_NO_SUCH_DEVICE = ("is out of range", "matches no device", "names a GPU that", "is an ambiguous")


def _hides_all(cvd: str, entry: str, why: str, gpus: list[PhysicalGPU]) -> str:
    """CUDA would see no device at all: on a node with GPUs a typo, not a request for the CPU (spelt
    '', -1 or NoDevFiles)."""
    names = ", ".join(f"{pos} ({p.uuid[:12]}…)" for pos, p in enumerate(gpus))
    return (f"CUDA_VISIBLE_DEVICES={cvd}: {entry!r} {why}, so CUDA would see no GPU; name "
            f"GPUs of this node (indices or UUIDs: {names}), or set CUDA_VISIBLE_DEVICES=-1 "
            f"or empty to run on the CPU")


def _well_formed(e: str) -> bool:
    if re.fullmatch(r"-?\d+", e):
        return True
    up = e.upper()
    if up.startswith("MIG-GPU-"):          # MIG-GPU-<uuid>/<gi>/<ci>
        return bool(re.fullmatch(r"MIG-GPU-[0-9A-F-]+(/\d+/\d+)?", up))
    if up.startswith(("GPU-", "MIG-")):
        return len(e) > 4 and bool(_UUID_HEX.match(e[4:]))
    return False


def _lookup(e: str, pool: list[PhysicalGPU]) -> tuple[PhysicalGPU | None, str]:
    if re.fullmatch(r"-?\d+", e):
        i = int(e)
        if i < 0:
            return None, "is negative (the usual way to hide all GPUs)"
        if i >= len(pool):
            return None, f"is out of range: there are {len(pool)} GPU(s) to choose from"
        return pool[i], ""
    up = e.upper()
    if up.startswith("MIG-GPU-"):
        parent = e[4:].split("/")[0]
        hits = [p for p in pool if p.uuid.upper() == parent.upper()]
        return (hits[0], "") if hits else (None, "names a GPU that is not available to this job")
    if up.startswith("MIG-"):
        hits = [p for p in pool if any(m.upper().startswith(up) for m in p.mig_uuids)]
    else:
        hits = [p for p in pool if p.uuid.upper().startswith(up)]
    if len(hits) > 1:
        return None, f"is an ambiguous prefix ({len(hits)} devices match)"
    if not hits:
        return None, "matches no device available to this job"
    return hits[0], ""


def visibility_findings(vis: Visibility, names: Mapping[int, str],
                        environ: Mapping[str, str]) -> list[Finding]:
    """What the backends report about visibility. `names`: nvml index -> model name of every GPU
    this process can open (mixed models: CUDA's order differs)."""
    out = [Finding(Severity.WARNING, "cuda_visible_devices", m) for m in vis.messages]
    for pos, nvml_index in enumerate(vis.nvml_indices):
        if nvml_index in vis.mig:
            out.append(Finding(Severity.INFO, "mig_instance",
                               f"GPU{pos} is MIG instance {vis.mig[nvml_index]}; memory and "
                               f"utilization shown are those of the whole GPU", pos))
    models = {n for n in names.values() if n and n != "??"}
    if len(models) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        out.append(Finding(Severity.WARNING, "cuda_device_order",
                           f"this node mixes GPU models ({', '.join(sorted(models))}) and CUDA numbers "
                           f"them fastest first, NVML by PCI bus: set CUDA_DEVICE_ORDER=PCI_BUS_ID "
                           f"so GPU indices mean the same to CUDA and to smartlaunch"))
    return out


def visibility_note(vis: Visibility, environ: Mapping[str, str], n_physical: int) -> str:
    """One line for a Topology without GPUs, saying which setting hid them."""
    if vis.nvml_indices:
        return ""
    if n_physical == 0:
        return "NVML found no GPU on this machine"
    if vis.source == "CUDA_VISIBLE_DEVICES":
        return (f"CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', '')!r} hides all "
                f"{n_physical} GPU(s) of this machine")
    return f"{vis.source} leaves this job none of the {n_physical} GPU(s)"
