"""Batch schedulers behind one interface (`api.Scheduler`). Adding one (PBS, Kubernetes) is a
module beside slurm.py and an entry in SCHEDULERS.

Below topology in the layers: the topology layer asks `gpu_allocation` which GPUs the job
was given; the pipeline asks `detect` for the job's nodes and rendezvous.
"""
from __future__ import annotations

import os
from typing import Mapping

from smartlaunch.scheduler import slurm
from smartlaunch.scheduler.api import DeviceProbe, GpuAllocation, JobContext, Scheduler

SCHEDULERS: tuple[Scheduler, ...] = (slurm,)   # type: ignore[assignment]  (modules)


def detect(environ: Mapping[str, str] | None = None) -> JobContext | None:
    """The job this process runs in, from the first scheduler that recognises it."""
    env = os.environ if environ is None else environ
    for s in SCHEDULERS:
        ctx = s.detect(env)
        if ctx is not None:
            return ctx
    return None


def gpu_allocation(environ: Mapping[str, str], *,
                   device_probe: DeviceProbe | None = None) -> GpuAllocation | None:
    for s in SCHEDULERS:
        alloc = s.gpu_allocation(environ, device_probe=device_probe)
        if alloc is not None:
            return alloc
    return None
