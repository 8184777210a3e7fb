"""What a batch scheduler tells a launch: which GPUs of this node the job was given, and
where it sits among the job's nodes. Nothing else in smartlaunch reads a scheduler's variables.
"""
from __future__ import annotations

import argparse
from typing import Mapping, Protocol

from smartlaunch.allocation import DeviceProbe, GpuAllocation


class JobContext(Protocol):
    """One launch inside a scheduler job: this node's place among the job's nodes."""
    job_id: str
    nnodes: int
    node_rank: int
    hosts: tuple[str, ...]
    rdzv_endpoint: str
    rdzv_id: str
    gpus: tuple[int, ...]
    constrained: bool

    def fill_torchrun_args(self, args: argparse.Namespace, given: set[str]) -> list[str]:
        """Set nnodes/node_rank/rdzv_* the user did not give; notes for --explain."""

    def to_dict(self) -> dict: ...


class Scheduler(Protocol):
    """The module-level functions of one implementation (see scheduler/slurm.py)."""
    NAME: str

    def detect(self, environ: Mapping[str, str] | None = None, **kw) -> JobContext | None:
        """This process's job, None when not running under this scheduler."""

    def gpu_allocation(self, environ: Mapping[str, str], *,
                       device_probe: DeviceProbe | None = None) -> GpuAllocation | None:
        """The GPUs this scheduler gave the job on this node, None if it says nothing."""
