"""Which GPUs a batch scheduler gave this job on this node, read from the job's environment.

Ground floor: the topology layer needs the allocation to know which GPUs the job may see
(CUDA_VISIBLE_DEVICES may count inside it), and the scheduler layer (smartlaunch.scheduler,
above launch) builds its job context on the same rules, so they live once, here, below both.
A PBS or Kubernetes allocation is one more function in ALLOCATORS.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from smartlaunch.errors import SlurmError
from smartlaunch.vocab import RangeError, parse_ranges

# Slurm's step ids of a batch script / salloc shell / extern step: not an srun step.
_BATCH_STEPS = ("batch", "extern", "interactive", "4294967291", "4294967292", "4294967294")


DeviceProbe = Callable[[tuple[int, ...]], "bool | None"]


@dataclass(frozen=True)
class GpuAllocation:
    gpus: tuple[int, ...]        # physical GPU indices given to this job on this node, in order
    source: str                  # the variable that said so ("SLURM_STEP_GPUS")
    # CUDA_VISIBLE_DEVICES counts within the allocation (0..n-1, a device cgroup renumbers)
    # rather than naming physical indices.
    renumbered: bool = False


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


def slurm_gpu_allocation(environ: Mapping[str, str], *, device_probe: DeviceProbe | None = None
                   ) -> GpuAllocation | None:
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
    """Slurm writes CUDA_VISIBLE_DEVICES as the physical ids (no constraint) or 0..n-1
    (constraint). If the user changed it, ask the device probe; failing that, read it as
    physical."""
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
