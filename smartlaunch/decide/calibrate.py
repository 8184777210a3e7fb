"""The node calibration's derivation: contention (κ), per-step DDP overhead and cost per
gradient tensor, from three synthetic runs (small S, large L, many tensors M).

Per window, r_m = measured DDP step - predict_ddp with the three constants at 0
= κ f G_m + per_tensor n_m + overhead (f = 2(N-1)/N). d_L = r_L - r_S and d_M = r_M - r_S give
κ and per_tensor; overhead = r_S - κ f G_S - per_tensor n_S. Each is the median over windows;
a negative median, or a per-tensor median within one standard deviation of 0, is kept as 0.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from smartlaunch.decide.cost import CostModel, predict_ddp
from smartlaunch.profile.api import CommCurve, ModelProfile, ProfileStatus
from smartlaunch.profile.baseline import BaselineRun, SyntheticRun

KEYS = ("contention_s_per_byte", "per_tensor_s", "ddp_overhead_s")


def roles(models) -> tuple[SyntheticRun, SyntheticRun, SyntheticRun]:
    """(small, large, many): many has the most tensors, small the fewer bytes."""
    if len(models) != 3:
        raise ValueError(f"a calibration needs 3 synthetic models, got {len(models)}")
    many = max(models, key=lambda m: m.grad_tensors)
    small, large = sorted((m for m in models if m is not many), key=lambda m: m.grad_bytes)
    return small, large, many


def derive(run: BaselineRun, curve: CommCurve, model: CostModel = CostModel()) -> dict:
    """The calibration record: constants, their spread, and each model's times."""
    small, large, many = roles(run.models)
    n = len(run.gpus)
    f = 2 * (n - 1) / n
    bare = dataclasses.replace(model, contention_s_per_byte=0.0, ddp_overhead_s=0.0,
                               per_tensor_s=0.0)
    base = [predict_ddp(_profile(m), curve, n, bare).step_s for m in (small, large, many)]
    windows = min(len(small.ddp_s), len(large.ddp_s), len(many.ddp_s))
    # d_L = κ a + p b,  d_M = κ c + p d
    a, b = f * (large.grad_bytes - small.grad_bytes), large.grad_tensors - small.grad_tensors
    c, d = f * (many.grad_bytes - small.grad_bytes), many.grad_tensors - small.grad_tensors
    det = a * d - b * c
    if windows < 1 or a <= 0 or d <= 0 or det <= 0:
        raise ValueError("the synthetic runs hold no DDP window, or their gradient sizes and "
                         "tensor counts do not separate the constants")
    per = {k: [] for k in KEYS}
    for i in range(windows):
        r_s, r_l, r_m = (m.ddp_s[i] - base[j] for j, m in enumerate((small, large, many)))
        d_l, d_m = r_l - r_s, r_m - r_s
        kappa = (d_l * d - b * d_m) / det
        tensor = (a * d_m - c * d_l) / det
        per["contention_s_per_byte"].append(kappa)
        per["per_tensor_s"].append(tensor)
        per["ddp_overhead_s"].append(r_s - kappa * f * small.grad_bytes
                                     - tensor * small.grad_tensors)
    median = {k: statistics.median(v) for k, v in per.items()}
    spread = {k: statistics.stdev(v) if len(v) > 1 else float("nan") for k, v in per.items()}
    clamped = sorted(k for k, v in median.items() if v < 0)
    noise = ["per_tensor_s"] if 0 <= median["per_tensor_s"] <= spread["per_tensor_s"] else []
    constants = {k: 0.0 if k in clamped or k in noise else v for k, v in median.items()}
    fitted = dataclasses.replace(model, **constants)
    rows = [{"grad_bytes": m.grad_bytes, "grad_tensors": m.grad_tensors, "batch": m.batch,
             "backward_share": m.backward_share,
             "single_ms": statistics.median(m.single_s) * 1e3,
             "ddp_ms": statistics.median(m.ddp_s) * 1e3,
             "predicted_ddp_ms": predict_ddp(_profile(m), curve, n, fitted).step_s * 1e3}
            for m in (small, large, many)]
    return {"constants": constants, "spread": spread, "clamped_to_zero": clamped,
            "within_noise": noise, "measured_median": median, "windows": windows,
            "gpus": list(run.gpus), "backend": run.backend,
            "date": time.strftime("%Y-%m-%d"), "elapsed_s": round(run.elapsed_s, 2),
            "models": rows}


def _profile(m: SyntheticRun) -> ModelProfile:
    t1 = statistics.median(m.single_s)
    return ModelProfile(ProfileStatus.OK, grad_bytes=m.grad_bytes, num_grad_tensors=m.grad_tensors,
                        batch_size=m.batch, step_time_s=t1, backward_s=m.backward_share * t1,
                        steps_measured=len(m.single_s))
