"""Topology layer: `discover()` returns the `Topology` of the GPUs this job may use."""
from __future__ import annotations

import os
from typing import Mapping

from smartlaunch.topology.api import (  # noqa: F401
    GPU, Finding, GPUProcess, Link, Severity, Topology, cpu_only, others_on, shared_text,
)
from smartlaunch.vocab import link_family, link_rank  # noqa: F401

FAKE_ENV = "SMARTLAUNCH_FAKE_TOPOLOGY"
NO_NVML_PREFIX = "no NVIDIA driver/NVML on this machine"


def discover(environ: Mapping[str, str] | None = None) -> Topology:
    """The machine as this job sees it, read now; SMARTLAUNCH_FAKE_TOPOLOGY (fixture name or
    JSON path) selects the fake backend. Without NVML: `cpu_only`, the reason in `note`. Bad
    CUDA_VISIBLE_DEVICES/Slurm values or a missing fake raise UsageError/SlurmError."""
    env = os.environ if environ is None else environ
    if env.get(FAKE_ENV):
        from smartlaunch.topology.fake import from_json
        return from_json(env[FAKE_ENV], env)
    from smartlaunch.topology.nvml import NvmlBackend, NvmlUnavailable
    try:
        return NvmlBackend().read(env)
    except NvmlUnavailable as exc:
        return cpu_only(f"{NO_NVML_PREFIX} ({exc.reason})")


class _FixtureReadings:
    """LiveReadings for a fake topology: the fixture read again."""

    def __init__(self, environ: Mapping[str, str]):
        self._environ = environ

    def read(self, topology: Topology, indices) -> Topology:
        return discover(self._environ)

    def close(self) -> None:
        pass


def live_readings(environ: Mapping[str, str] | None = None):
    """A reader of a running job's GPUs: `.read(topology, indices) -> Topology` with their
    live readings (nvml.LiveReadings), `.close()`. A fake topology's fixture is read again."""
    env = os.environ if environ is None else environ
    if env.get(FAKE_ENV):
        return _FixtureReadings(env)
    from smartlaunch.topology.nvml import LiveReadings
    return LiveReadings()


def sharing(topology, gpus, environ, readings=None) -> str | None:
    """Processes on `gpus` now that smartlaunch did not start and that were not there when
    `topology` was read (topology.api.others_on), as one text; None when none, or when NVML
    cannot say. readings: a live_readings the caller keeps open (else one for this call)."""
    if not topology.gpus:
        return None
    own = readings is None
    readings = live_readings(environ) if own else readings
    try:
        now = readings.read(topology, tuple(gpus))
        return shared_text({g: o for g in gpus
                            if (o := others_on(now.gpu(g), topology.gpu(g)))})
    except Exception:           # a reading is a check, never a reason to fail the job
        return None
    finally:
        if own:
            readings.close()
