"""`smartlaunch-node calibrate`: measure this node's cost-model constants (on two leased
GPUs, as a launch leases them) and cache them."""
from __future__ import annotations

import json
import os
import sys

from smartlaunch.errors import UsageError
from smartlaunch.store import BadRecord


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure this node's constants for the cost "
                              "model (DDP overhead, all-reduce contention, cost per gradient "
                              "tensor) and cache them")
    p.add_argument("--gpus", default=None, help="two comma-separated GPU indices (default: the "
                   "first two)")
    p.add_argument("--windows", type=int, default=5, help="measured windows per model (the "
                   "spread is over these); default 5")
    p.add_argument("--policy", default=None, help="policy file (paths.cache_dir, lease_dir, "
                   "jobs.wait_timeout_s)")
    p.add_argument("--no-wait", action="store_true", help="fail at once when another job "
                   "holds the GPUs instead of waiting for them")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--out", default=None, help="also write the record (JSON) to this file, "
                   "to keep or to compare with another node's")
    p.set_defaults(func=calibrate)


def calibrate(args) -> int:
    from smartlaunch.decide.calibrate import derive
    from smartlaunch.decide.cost import CostModel, calibrated
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.policy.load import load_policy
    from smartlaunch.profile.baseline import measure_baseline, store_constants
    from smartlaunch.profile.cache import nccl_env, torch_version
    from smartlaunch.profile.comm import comm_curve, device_for
    from smartlaunch.topology import discover
    environ = os.environ
    topo = discover(environ)
    policy = load_policy(args.policy, environ=environ)
    gpus = _gpus(args, [g.index for g in topo.gpus])
    _check_out(args.out)
    with LeaseManager.from_policy(policy, say=_say) as leases:
        lease = leases.acquire(topo, gpus, 2, wait=not args.no_wait,
                               timeout_s=policy.jobs.wait_timeout_s, status=_say)
        with lease:
            run = measure_baseline(tuple(gpus), device=device_for(topo), environ=environ,
                                   windows=args.windows)
            largest = max(m.grad_bytes for m in run.models)
            curve = comm_curve(topo, tuple(gpus), policy, environ, max_bytes=largest)
    record = derive(run, curve)
    record.update(gpu_name=topo.gpu(gpus[0]).name, nccl=nccl_env(environ), torch=torch_version())
    try:
        path = store_constants(policy, topo, environ, record)
        kept = f"cached in {path}" if path else "not cached: the cache directory is not writable"
    except BadRecord as exc:
        path, kept = None, f"not cached: out of range ({exc})"
    if args.out:
        try:
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1, sort_keys=True)
        except OSError as e:     # the measurement may be cached already: say where it is
            raise UsageError(f"--out {args.out}: {e.strerror}; the record is {kept}; "
                             f"give a writable path to copy it") from None
    if args.json:
        print(json.dumps(record, indent=1, sort_keys=True))
        return 0
    _, text = calibrated(CostModel(), record)
    _, shipped = calibrated(CostModel(), None)
    print(f"node calibration on GPUs {','.join(map(str, gpus))} ({record['gpu_name']}, "
          f"{run.backend}), {record['windows']} windows per model, {run.elapsed_s:.1f} s:")
    print(f"  {text}")
    print(f"  shipped: {shipped.split(' (')[0]} (docs/decision.md says where they were fitted)")
    for row in record["models"]:
        size = (f"{row['grad_bytes'] / 2 ** 20:.0f} MiB" if row["grad_bytes"] >= 2 ** 20 else
                f"{row['grad_bytes'] / 2 ** 10:.0f} KiB")
        print(f"  synthetic {size} of gradients in {row['grad_tensors']} "
              f"tensor{'s' if row['grad_tensors'] > 1 else ''}: single {row['single_ms']:.2f} ms, "
              f"DDP×2 {row['ddp_ms']:.2f} ms measured, {row['predicted_ddp_ms']:.2f} ms predicted "
              f"with these constants")
    if record["clamped_to_zero"]:
        print(f"  note: {', '.join(record['clamped_to_zero'])} measured below 0 (noise larger "
              f"than the effect): kept as 0")
    if record["within_noise"]:
        m, sd = record["measured_median"]["per_tensor_s"], record["spread"]["per_tensor_s"]
        print(f"  note: per_tensor_s measured {m * 1e6:.2g} ± {sd * 1e6:.2g} µs, within its "
              f"spread of 0: kept as 0")
    print(f"  cached in {path}; decisions on this node use it (--explain says so)" if path else
          f"  {kept}; decisions on this node keep the shipped constants")
    return 0


def _gpus(args, known: list[int]) -> list[int]:
    try:
        gpus = known[:2] if args.gpus is None else [int(x) for x in args.gpus.split(",")
                                                     if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {args.gpus!r} is not a list of GPU indices; e.g. --gpus 0,1")
    stray = sorted(set(gpus) - set(known))
    if stray:
        raise UsageError(f"GPUs {stray} are not visible (visible: {known}); fix --gpus")
    if len(set(gpus)) != 2:
        fix = ("name two of them, e.g. --gpus " + ",".join(map(str, known[:2]))) \
            if len(known) >= 2 else ("run it on a node with at least 2 GPUs visible (check "
                                     "CUDA_VISIBLE_DEVICES and `smartlaunch-node topo`)")
        raise UsageError(f"calibrate measures DDP×2 and needs 2 distinct GPUs; this node shows "
                         f"{known or 'none'} and --gpus gave {gpus or 'none'}; {fix}")
    if not 2 <= args.windows <= 50:
        raise UsageError(f"--windows {args.windows}: use 2 to 50 (the spread needs two)")
    return gpus


def _check_out(path: str | None) -> None:
    """An --out that cannot be written is said before measuring."""
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--out {path} is a directory; name a file, e.g. "
                         f"{os.path.join(path, 'calibration.json')}")
    if not os.path.isdir(parent):
        raise UsageError(f"--out {path}: the directory {parent} does not exist; create it or "
                         f"give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path}: this user may not write in {parent}; give a path "
                         f"you may write")


def _say(line: str) -> None:
    print(f"smartlaunch-node: {line}", file=sys.stderr, flush=True)
