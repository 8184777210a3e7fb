"""One rank of the all-reduce benchmark (started by smartlaunch.profile.comm, one per GPU). Each
size: warm-up, then `iters` timed all-reduces after a barrier; the per-rank median (or min) is max-
reduced over ranks and rank 0 writes [[bytes, seconds], ...] to --out. --gate: wait for the go once
the group is up. --groups "0,1,2,3;0,1": one curve per group of ranks, each over its own
communicator; --out then holds [{"ranks", "points"}, ...]."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def join_group(backend: str, device_index: int | None):
    """This rank's device and a device sync, the process group initialised: NCCL on one GPU, or gloo
    on the CPU (no sync needed)."""
    import torch
    import torch.distributed as dist
    if backend == "nccl":
        device = torch.device("cuda", device_index)
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")
        sync = lambda: None  # noqa: E731
    dist.init_process_group(backend, **({"device_id": device} if backend == "nccl" else {}))
    return device, sync


def write_result(path: str, data) -> None:
    """`data` as JSON at `path`, whole or not at all (written beside it, then renamed)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True, choices=("nccl", "gloo"))
    ap.add_argument("--device-index", type=int, default=None)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--stat", default="median", choices=("median", "min"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--gate", action="store_true", help="joined, wait for the go to measure")
    ap.add_argument("--groups", default=None,
                    help='one curve per group of ranks, e.g. "0,1,2,3;0,1" (see above)')
    args = ap.parse_args(argv)
    import torch.distributed as dist
    from smartlaunch.profile.control import Control

    control = Control.from_env()
    device, sync = join_group(args.backend, args.device_index)
    try:
        if args.gate and control is not None:   # the group is up: wait for the go
            control.gate()
            dist.barrier()
        sizes = [int(s) for s in args.sizes.split(",")]
        tick = control if dist.get_rank() == 0 else None
        if args.groups:
            result = _each_group(args, sizes, device, sync, tick)
        else:
            result = [[s, t] for s, t in zip(sizes, _sweep(args, sizes, device, sync, tick))]
        if dist.get_rank() == 0:
            write_result(args.out, result)
            if control is not None:
                control.done()
    finally:
        dist.destroy_process_group()


def _sweep(args, sizes, device, sync, tick, group=None, done: int = 0, total: int = 0):
    """Seconds per size over `group` (None: every rank), the slowest rank's median (or min). tick:
    rank 0's control, None elsewhere."""
    import torch
    import torch.distributed as dist
    medians = []
    for k, nbytes in enumerate(sizes, 1):
        if tick is not None:
            tick.step(done + k, total or len(sizes))
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf, group=group)
        sync()
        times = []
        for _ in range(args.iters):
            dist.barrier(group=group)  # start together: rank skew would count as all-reduce time
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=group)
            sync()
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times) if args.stat == "median" else min(times))
        del buf
    worst = torch.tensor(medians, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return worst.tolist()


def _each_group(args, sizes, device, sync, tick) -> list[dict]:
    """--groups: each group's curve in turn; every rank makes every group (new_group is collective),
    only members measure, a gloo broadcast of the times keeps the groups apart."""
    import torch
    import torch.distributed as dist
    groups = [[int(r) for r in g.split(",")] for g in args.groups.split(";") if g]
    cpu = dist.new_group(backend="gloo")
    subs = [dist.new_group(ranks=g) for g in groups]
    me, out = dist.get_rank(), []
    for i, (ranks, sub) in enumerate(zip(groups, subs)):
        points = torch.zeros(len(sizes), dtype=torch.float64)
        if me in ranks:
            points = torch.tensor(_sweep(args, sizes, device, sync, tick, sub,
                                         i * len(sizes), len(groups) * len(sizes)),
                                  dtype=torch.float64)
        dist.broadcast(points, src=ranks[0], group=cpu)
        out.append({"ranks": ranks, "points": [[s, t] for s, t in zip(sizes, points.tolist())]})
    return out


if __name__ == "__main__":
    main()
