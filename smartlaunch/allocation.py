"""Which GPUs a batch scheduler gave this job on this node, read from the job's environment,
and `idle_line`: what of the job's allocation a plan leaves idle."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from smartlaunch.errors import SlurmError
from smartlaunch.vocab import RangeError, parse_ranges

# Slurm's step ids of a batch script / salloc shell / extern step: not an srun step.
_BATCH_STEPS = ("batch", "extern", "interactive", "4294967291", "4294967292", "4294967294")


DeviceProbe = Callable[[tuple[int, ...]], "bool | None"]


@dataclass(frozen=True)
class GpuAllocation:
    gpus: tuple[int, ...]        # physical GPU indices given to this job on this node, in order
    source: str                  # the variable that said so ("SLURM_STEP_GPUS")
    renumbered: bool = False     # CUDA_VISIBLE_DEVICES counts 0..n-1 within the allocation


def parse_id_list(text: str, what: str = "id list") -> tuple[int, ...]:
    """'0-2,5' -> (0, 1, 2, 5). Order kept (Slurm lists GPUs in allocation order)."""
    try:
        return tuple(parse_ranges(text))
    except RangeError as exc:
        if exc.descending:
            raise SlurmError(f"{what} {text!r} has a descending range; check the Slurm "
                             f"environment") from None
        raise SlurmError(f"{what} {text!r} is not a list of numbers like '0-2,5'; "
                         f"check the Slurm environment of this job") from None


def slurm_gpu_allocation(environ: Mapping[str, str], *,
                         device_probe: DeviceProbe | None = None) -> GpuAllocation | None:
    """The job's GPUs on this node (physical gres indices), None where Slurm names none."""
    gpus, var = _allocated_gpus(environ, _in_step(environ))
    if not var:
        return None
    return GpuAllocation(gpus, var, _is_constrained(gpus, _visible(environ), device_probe))


def _in_step(env) -> bool:
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    return bool(step) and step not in _BATCH_STEPS


def _visible(env) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES entries as Slurm (or the user) set them."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    return tuple(s.strip() for s in raw.split(",")) if raw else ()


def _allocated_gpus(env, in_step: bool) -> tuple[tuple[int, ...], str]:
    order = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS") if in_step else ("SLURM_JOB_GPUS",)
    for var in order:
        if env.get(var):
            gpus = parse_id_list(env[var], var)
            on_node = _int(env, "SLURM_GPUS_ON_NODE")
            if on_node is not None and on_node != len(gpus) and var == "SLURM_JOB_GPUS":
                raise SlurmError(f"{var}={env[var]} lists {len(gpus)} GPU(s) but "
                                 f"SLURM_GPUS_ON_NODE={on_node}; the job environment was "
                                 f"edited — start from a clean `srun`/`sbatch` environment")
            return gpus, var
    return (), ""


def _is_constrained(gpus, visible, probe) -> bool:
    """Whether CUDA_VISIBLE_DEVICES counts 0..n-1 (a device constraint) rather than naming
    physical ids; where the user changed it, the device probe decides."""
    if not gpus or not visible or not all(v.isdigit() for v in visible):
        return False
    ints = tuple(int(v) for v in visible)
    if ints == gpus:
        return False
    if ints == tuple(range(len(gpus))):
        return True
    verdict = (probe or _device_probe)(gpus)
    if verdict is not None:
        return verdict
    return not all(i in gpus for i in ints) and all(i < len(gpus) for i in ints)


def _device_probe(gpus) -> bool | None:
    """True if a GPU device node outside the allocation exists but the cgroup denies it."""
    for name in sorted(os.listdir("/dev")) if os.path.isdir("/dev") else ():
        if not name.startswith("nvidia") or not name[6:].isdigit() or int(name[6:]) in gpus:
            continue
        try:
            os.close(os.open(f"/dev/{name}", os.O_RDONLY))
            return False
        except PermissionError:
            return True
        except OSError:
            continue
    return None


def _int(env, key) -> int | None:
    v = env.get(key)
    if v is None or v == "":
        return None
    try:
        return int(v.split("(")[0])
    except ValueError:
        raise SlurmError(f"{key}={v!r} is not a number; check the Slurm environment") from None

ALLOCATORS: tuple[Callable[..., "GpuAllocation | None"], ...] = (slurm_gpu_allocation,)


def gpu_allocation(environ: Mapping[str, str], *,
                   device_probe: DeviceProbe | None = None) -> GpuAllocation | None:
    """The first scheduler allocation the environment names, None outside any."""
    for allocate in ALLOCATORS:
        alloc = allocate(environ, device_probe=device_probe)
        if alloc is not None:
            return alloc
    return None


IDLE_RULE = "slurm allocation: idle GPUs or nodes"


class JobAllocation(Protocol):
    """What the scheduler gave the whole job (scheduler/slurm.SlurmContext has these)."""
    job_id: str
    step_id: str | None            # None in a batch script / salloc shell
    nnodes: int                    # nodes taking part in this launch
    job_nnodes: int                # nodes of the whole allocation
    gpus: tuple[int, ...]          # GPUs allocated on this node


def nodes_used(ctx: "JobAllocation", plan) -> int:
    """Nodes this launch runs on."""
    if plan.node_variants:
        return sum(1 for share in plan.node_variants if share)
    if plan.multi_node:
        top = (plan.nnodes or "1").rpartition(":")[2]
        if top.isdigit():
            return int(top)
    return ctx.nnodes


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def idle_line(ctx: "JobAllocation | None", plan) -> str:
    """One sentence when the plan leaves GPUs Slurm allocated on this node or nodes of the job
    idle, with the request that would fit next time; '' otherwise."""
    if ctx is None:
        return ""
    gpu_idle = bool(ctx.gpus) and len(plan.gpus) < len(ctx.gpus)
    used = nodes_used(ctx, plan)
    node_idle = max(0, ctx.job_nnodes - used)
    if not (gpu_idle or node_idle):
        return ""
    parts = []
    if gpu_idle:
        free = ", ".join(f"GPU{g}" for g in plan.left_free) or "none usable"
        parts.append(f"{len(plan.gpus)} of the {len(ctx.gpus)} GPUs Slurm allocated on this "
                     f"node ({len(ctx.gpus) - len(plan.gpus)} idle for the whole job; GPUs left "
                     f"free: {free})")
    if node_idle:
        why = "idle for the whole job" if ctx.step_id is None else \
            f"outside this srun step {ctx.job_id}.{ctx.step_id}: idle unless another step uses them"
        parts.append(f"{used} of the {ctx.job_nnodes} nodes Slurm allocated to job {ctx.job_id} "
                     f"({node_idle} {why})")
    per_node = max(1, len(plan.gpus)) if gpu_idle else len(ctx.gpus)
    gpus = [f"--gpus-per-node={per_node}"] if per_node else []
    sbatch = " ".join([f"--nodes={used if node_idle else ctx.job_nnodes}", *gpus])
    srun = " ".join(([f"--nodes={used}"] if node_idle else []) + gpus)
    return (f"the plan uses {' and '.join(parts)}; a request that fits this plan next time: "
            f"`sbatch {sbatch}` (or `srun {srun}`)")
