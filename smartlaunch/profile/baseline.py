"""The node calibration's measurement: single GPU vs DDP×2 on synthetic models
(baseline_worker.py), run as comm.py runs its benchmark, and its cache:
<cache_dir>/node/<key>.json, key = cache.node_key + backend + format + torch version.
decide/calibrate.py derives the constants."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from smartlaunch.profile.cache import entry_path, node_key, torch_version
from smartlaunch.profile.comm import CommBenchError, backend_for, device_for, run_ranks
from smartlaunch.store import (
    MAX_SECONDS, cache_root, keep, load, number, obj, required, text,
)
from smartlaunch.wire import RECORD

TIME_LIMIT_S = 60.0       # the goal is <= 30 s; a node slower than twice that is failing
FORMAT = 2
# WIDTHxLAYERSxBATCH (baseline_worker.py). Two gradient sizes far apart: the difference of their
# DDP costs is the per-byte term, the rest is per step. The third has the small one's gradient
# bytes in many tensors: what DDP adds to it beyond the small model is per gradient tensor.
GPU_MODELS = ((1024, 1, 2048), (4096, 4, 2048), (32, 1024, 2048))  # 4 MiB, 256 MiB, 4 MiB/1024
CPU_MODELS = ((128, 1, 64), (512, 4, 64), (8, 256, 64))            # 64 KiB, 4 MiB, 64 KiB/256


@dataclass(frozen=True)
class SyntheticRun:
    """One model's measured times (seconds per step): rank 0 alone, and DDP over the group."""
    grad_bytes: int
    grad_tensors: int
    batch: int
    backward_share: float
    single_s: tuple[float, ...]
    ddp_s: tuple[float, ...]


@dataclass(frozen=True)
class BaselineRun:
    gpus: tuple[int, ...]
    backend: str
    models: tuple[SyntheticRun, ...]
    elapsed_s: float


def measure_baseline(gpus: tuple[int, ...], *, device: str, environ, windows: int = 5,
                     window_s: float | None = None, time_limit_s: float = TIME_LIMIT_S,
                     models=None) -> BaselineRun:
    """The synthetic models on `gpus` (CUDA ordinals), single then DDP. device "cuda": NCCL, one
    process per GPU; "cpu": gloo, len(gpus) processes."""
    if len(gpus) < 2:
        raise CommBenchError(f"a node calibration needs at least 2 GPUs, got {list(gpus)}; "
                             "pass --gpus with two indices")
    backend = backend_for(device)
    models = models or (GPU_MODELS if device == "cuda" else CPU_MODELS)
    window_s = window_s or (0.2 if device == "cuda" else 0.1)
    spec = ",".join(f"{w}x{l}x{b}" for w, l, b in models)
    t0 = time.monotonic()
    data = run_ranks("smartlaunch.profile.baseline_worker", gpus, device, environ,
                     ["--models", spec, "--windows", str(windows), "--window-s", str(window_s)],
                     time_limit_s=time_limit_s, what="node calibration",
                     hint="check the GPUs are idle and healthy and the NCCL_* environment.")
    try:
        runs = tuple(SyntheticRun(int(m["grad_bytes"]), int(m["grad_tensors"]), int(m["batch"]),
                                  float(m["backward_share"]), tuple(map(float, m["single_s"])),
                                  tuple(map(float, m["ddp_s"]))) for m in data["models"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CommBenchError(f"node calibration over GPUs {list(gpus)} wrote no usable result "
                             f"({exc!r}); run `smartlaunch-node calibrate --debug`") from exc
    return BaselineRun(tuple(gpus), backend, runs, time.monotonic() - t0)


def baseline_key(topology, environ) -> str:
    return node_key(topology, environ, backend=backend_for(device_for(topology)), format=FORMAT,
                    torch=torch_version())


# The calibrated constants' sane ranges (decide/cost.py's units): above, a measurement gone wrong.
CONSTANT_RANGES = {"contention_s_per_byte": 1e-8, "ddp_overhead_s": 1.0, "per_tensor_s": 0.01}


def constants_path(policy, key: str, environ, *, create: bool = False) -> Path:
    """Where this node's calibration is kept; its folder made only to write there."""
    return entry_path(policy, environ, "node", key, create=create)


def store_constants(policy, topology, environ, record: dict) -> Path | None:
    """Keep a calibration record (decide/calibrate.py's) for this node: its path, or None when the
    cache cannot take it. BadRecord, nothing kept, when out of range."""
    data = calibration_from_dict({**record, "measured_at": time.time(),
                                  "fingerprint": topology.fingerprint()})
    path = constants_path(policy, baseline_key(topology, environ), environ, create=True)
    return path if keep(cache_root(policy, environ), path, data) else None


def calibration_from_dict(d) -> dict:
    """A stored calibration record, checked: BadRecord naming the first field of the wrong type or
    out of range (CONSTANT_RANGES), or missing."""
    d = obj(d, RECORD)
    text(required(d, "fingerprint"), "fingerprint", 256)
    number(required(d, "measured_at"), "measured_at", 0.0)
    constants = obj(required(d, "constants"), "constants")
    for k, high in CONSTANT_RANGES.items():     # one missing stays the shipped one (cost.py)
        if k in constants:
            number(constants[k], f"constants.{k}", 0.0, high)
    spread = obj(d.get("spread", {}), "spread")
    for k in CONSTANT_RANGES:
        v = spread.get(k)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):  # 1 window: NaN
            number(v, f"spread.{k}", 0.0, MAX_SECONDS)
    if "date" in d:
        text(d["date"], "date", 64)
    return d


def load_constants(policy, topology, environ) -> dict | None:
    """This node's calibration record, or None: never measured, another topology, transport or
    torch, too old, or damaged (said once)."""
    if topology is None or not topology.gpus:
        return None
    path = constants_path(policy, baseline_key(topology, environ), environ)
    data = load(path, calibration_from_dict, "node calibration",
                then="using the shipped constants; `smartlaunch-node calibrate` measures them "
                     "again")
    if data is None or data["fingerprint"] != topology.fingerprint():
        return None
    if not 0 <= time.time() - data["measured_at"] <= policy.paths.comm_cache_max_age_s:
        return None
    return data
