"""Batch schedulers behind one interface (`api.Scheduler`): one module each, listed in
SCHEDULERS (and, for its GPU allocation, one function in allocation.ALLOCATORS)."""
from __future__ import annotations

import os
from typing import Mapping

from smartlaunch.scheduler import slurm
from smartlaunch.scheduler.api import JobContext, Scheduler

SCHEDULERS: tuple[Scheduler, ...] = (slurm,)   # type: ignore[assignment]  (modules)


def detect(environ: Mapping[str, str] | None = None) -> JobContext | None:
    """The job this process runs in, from the first scheduler that recognises it."""
    env = os.environ if environ is None else environ
    for s in SCHEDULERS:
        ctx = s.detect(env)
        if ctx is not None:
            return ctx
    return None
