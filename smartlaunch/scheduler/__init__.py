"""Batch schedulers behind one interface (`api.Scheduler`). Adding one (PBS, Kubernetes) is a
module beside slurm.py and an entry in SCHEDULERS (and, for its GPU allocation, one function in
smartlaunch/allocation.py's ALLOCATORS: topology needs it and sits below this layer).

The pipeline asks `detect` for the job's nodes and rendezvous.
"""
from __future__ import annotations

import os
from typing import Mapping

from smartlaunch import allocation
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


gpu_allocation = allocation.gpu_allocation   # the rules live below topology (allocation.py)
