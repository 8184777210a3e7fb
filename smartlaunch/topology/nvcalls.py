"""Calling NVML without letting its errors escape: unreadable fields become a default, errors that
mean the device is gone raise DeviceLost."""
from __future__ import annotations

from typing import Any

# NVML return codes (nvml.h; stable across releases).
ERROR_NO_PERMISSION = 4
ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, ERROR_GPU_NOT_FOUND = 15, 16, 28
LOST_CODES = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, ERROR_GPU_NOT_FOUND})


class DeviceLost(Exception):
    pass


class Calls:
    """Calls pynvml (or a look-alike) by name."""

    def __init__(self, nvml: Any):
        self.nvml = nvml

    def get(self, name: str, *args, default=None):
        fn = getattr(self.nvml, name, None)
        if fn is None:                       # an older nvidia-ml-py without this call
            return default
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) in LOST_CODES:
                raise DeviceLost(str(exc)) from exc
            return default
