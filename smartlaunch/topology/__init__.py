"""Topology layer: `discover()` returns the `Topology` of the GPUs this job may use."""
from smartlaunch.topology.api import (  # noqa: F401
    GPU, Finding, GPUProcess, Link, Severity, Topology, cpu_only, link_family, link_rank,
)
