"""`smartlaunch-node calibrate`: this node's contention (κ) and per-step DDP overhead.

cost.py's κ and ddp_overhead_s depend on the machine (how NCCL's kernels share the GPU with
the backward they overlap, how fast the host runs the reducer) and were fitted on one 2x H200
box. This measures them on the node (profile/baseline.py: one GPU vs DDP×2 on two synthetic
models of known gradient size, a few windows each) and keeps them with the topology; every
later decision on the node reads them through cost.calibrated() and --explain says so.

Derivation, per window i (the same windows for both models):
    base_m   = predict_ddp(model m's single-GPU profile, this node's all-reduce curve, N) with
               κ = 0 and no per-step overhead: the step the model explains without them
               (the slower backward, the exposed all-reduce tail)
    r_m,i    = measured DDP step of window i - base_m              what is left to explain
    κ_i      = (r_L,i - r_S,i) / (f (G_L - G_S)),  f = 2(N-1)/N   per byte of ring traffic
    ovh_i    = r_S,i - κ_i f G_S                                   the rest is per step
Reported: median over windows ± their standard deviation; a negative median (noise larger
than the effect) is kept as 0, which calibrated() accepts, and said so.

The synthetic models' backward is sized to last several times their all-reduce on GPUs, so
the contention cap (cost.py) does not bind; NOT yet validated on GPUs (built and tested on the
CPU with gloo, issue 15).
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

from smartlaunch.decide.cost import CostModel, calibrated, predict_ddp
from smartlaunch.errors import UsageError
from smartlaunch.profile.api import CommCurve, ModelProfile, ProfileStatus
from smartlaunch.profile.baseline import BaselineRun, SyntheticRun


def derive(run: BaselineRun, curve: CommCurve, model: CostModel = CostModel()) -> dict:
    """The calibration record: constants, their spread, and each model's times."""
    if len(run.models) != 2:
        raise ValueError(f"a calibration needs 2 synthetic models, got {len(run.models)}")
    small, large = sorted(run.models, key=lambda m: m.grad_bytes)
    n = len(run.gpus)
    f = 2 * (n - 1) / n
    bare = dataclasses.replace(model, contention_s_per_byte=0.0, ddp_overhead_s=0.0)
    base = {id(m): predict_ddp(_profile(m), curve, n, bare).step_s for m in (small, large)}
    windows = min(len(small.ddp_s), len(large.ddp_s))
    if windows < 1 or large.grad_bytes <= small.grad_bytes:
        raise ValueError("the synthetic runs hold no DDP window or equal gradient sizes")
    kappas, overheads = [], []
    for i in range(windows):
        r_small = small.ddp_s[i] - base[id(small)]
        r_large = large.ddp_s[i] - base[id(large)]
        k = (r_large - r_small) / (f * (large.grad_bytes - small.grad_bytes))
        kappas.append(k)
        overheads.append(r_small - k * f * small.grad_bytes)
    constants = {"contention_s_per_byte": statistics.median(kappas),
                 "ddp_overhead_s": statistics.median(overheads)}
    clamped = sorted(k for k, v in constants.items() if v < 0)
    constants = {k: max(0.0, v) for k, v in constants.items()}
    spread = {"contention_s_per_byte": _sd(kappas), "ddp_overhead_s": _sd(overheads)}
    fitted = dataclasses.replace(model, **constants)
    rows = [{"grad_bytes": m.grad_bytes, "batch": m.batch, "backward_share": m.backward_share,
             "single_ms": statistics.median(m.single_s) * 1e3,
             "ddp_ms": statistics.median(m.ddp_s) * 1e3,
             "predicted_ddp_ms": predict_ddp(_profile(m), curve, n, fitted).step_s * 1e3}
            for m in (small, large)]
    return {"constants": constants, "spread": spread, "clamped_to_zero": clamped,
            "windows": windows, "gpus": list(run.gpus), "backend": run.backend,
            "date": time.strftime("%Y-%m-%d"), "elapsed_s": round(run.elapsed_s, 2),
            "models": rows}


def _profile(m: SyntheticRun) -> ModelProfile:
    t1 = statistics.median(m.single_s)
    return ModelProfile(ProfileStatus.OK, grad_bytes=m.grad_bytes, num_grad_tensors=m.grad_tensors,
                        batch_size=m.batch, step_time_s=t1, backward_s=m.backward_share * t1,
                        steps_measured=len(m.single_s))


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else float("nan")


# ---- the command ----------------------------------------------------------------------------
def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure this node's DDP overhead and contention "
                              "(κ) for the cost model, and cache them with the topology")
    p.add_argument("--gpus", default=None, help="two comma-separated GPU indices (default: the "
                   "first two)")
    p.add_argument("--windows", type=int, default=5, help="measured windows per model (the "
                   "spread is over these); default 5")
    p.add_argument("--policy", default=None, help="policy file (for paths.cache_dir)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.set_defaults(func=calibrate)


def calibrate(args) -> int:
    from smartlaunch.policy.load import load_policy
    from smartlaunch.profile.baseline import backend_for, measure_baseline, store_constants
    from smartlaunch.profile.comm import comm_curve
    from smartlaunch.topology import discover
    environ = os.environ
    topo = discover(environ)
    policy = load_policy(args.policy, environ=environ)
    known = [g.index for g in topo.gpus]
    try:
        gpus = known[:2] if args.gpus is None else [int(x) for x in args.gpus.split(",")
                                                     if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {args.gpus!r} is not a list of GPU indices; e.g. --gpus 0,1")
    if sorted(set(gpus) - set(known)):
        raise UsageError(f"GPUs {sorted(set(gpus) - set(known))} are not visible (visible: "
                         f"{known}); fix --gpus")
    if len(set(gpus)) != 2:
        raise UsageError(f"calibrate measures DDP×2 and needs 2 distinct GPUs; this node shows "
                         f"{known} and --gpus gave {gpus or 'none'}")
    if not 2 <= args.windows <= 50:
        raise UsageError(f"--windows {args.windows}: use 2 to 50 (the spread needs two)")
    device = "cuda" if backend_for(topo) == "nccl" else "cpu"
    run = measure_baseline(tuple(gpus), device=device, environ=environ, windows=args.windows)
    largest = max(m.grad_bytes for m in run.models)
    curve = comm_curve(topo, tuple(gpus), policy, environ, max_bytes=largest)
    record = derive(run, curve)
    record["gpu_name"] = topo.gpu(gpus[0]).name
    path = store_constants(policy, topo, environ, record)
    if args.json:
        print(json.dumps(record, indent=1, sort_keys=True))
        return 0
    _, text = calibrated(CostModel(), record)
    print(f"node calibration on GPUs {','.join(map(str, gpus))} ({record['gpu_name']}, "
          f"{run.backend}), {record['windows']} windows per model, {run.elapsed_s:.1f} s:")
    print(f"  {text}")
    print(f"  shipped: κ {CostModel().contention_s_per_byte * 1e12:.3g} ms/GB, DDP overhead "
          f"{CostModel().ddp_overhead_s * 1e3:.2f} ms per step (fitted on 2x H200)")
    for row in record["models"]:
        print(f"  synthetic {row['grad_bytes'] / 2 ** 20:.2f} MiB of gradients: single "
              f"{row['single_ms']:.2f} ms, DDP×2 {row['ddp_ms']:.2f} ms measured, "
              f"{row['predicted_ddp_ms']:.2f} ms predicted with these constants")
    if record["clamped_to_zero"]:
        print(f"  note: {', '.join(record['clamped_to_zero'])} measured below 0 (noise larger "
              f"than the effect): kept as 0")
    print(f"  cached in {path}; decisions on this node use it (--explain says so)")
    return 0
