"""One rank of the node calibration (started by smartlaunch.profile.baseline, one per GPU). Each
model WIDTHxLAYERSxBATCH (square bias-free Linear layers, SGD, synthetic data) runs `single` (rank 0
alone: its backward share, then `windows` windows of free-running steps) then `ddp` (every rank, a
window's time the slowest rank's); rank 0 sizes the windows and writes the JSON result."""
from __future__ import annotations

import argparse
import math
import time

from smartlaunch.profile.comm_worker import join_group, write_result

WARMUP_STEPS = 3


def parse_models(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in spec.split("x")) for spec in text.split(",")]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True, choices=("nccl", "gloo"))
    ap.add_argument("--device-index", type=int, default=None)
    ap.add_argument("--models", required=True)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-s", type=float, default=0.2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    device, sync = join_group(args.backend, args.device_index)
    rank = dist.get_rank()
    try:
        results = [_measure(torch, dist, device, sync, spec, args, rank)
                   for spec in parse_models(args.models)]
        if rank == 0:
            write_result(args.out, {"models": results, "world_size": dist.get_world_size(),
                                    "backend": args.backend, "torch": torch.__version__})
        # Leave together: tearing gloo down while a peer still writes can abort the peer.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _build(torch, device, width: int, layers: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                  for _ in range(layers)])
    # Identity weights keep the activations' scale through many layers (no denormals).
    with torch.no_grad():
        for layer in model:
            torch.nn.init.eye_(layer.weight)
    model = model.to(device)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def _step(model, opt, x):
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()


def _windows(model, opt, x, sync, steps: int, windows: int) -> list[float]:
    """Seconds per step of each window of `steps` free-running steps."""
    out = []
    for _ in range(windows):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(model, opt, x)
        sync()
        out.append((time.perf_counter() - t0) / steps)
    return out


def _measure(torch, dist, device, sync, spec, args, rank) -> dict:
    width, layers, batch = spec
    x = torch.randn(batch, width, device=device)
    steps = torch.zeros(1, dtype=torch.int64, device=device)
    single: list[float] = []
    share = None
    if rank == 0:
        model, opt = _build(torch, device, width, layers)
        sync()
        t0 = time.perf_counter()
        for _ in range(WARMUP_STEPS):
            _step(model, opt, x)
        sync()
        warm = (time.perf_counter() - t0) / WARMUP_STEPS
        steps[0] = max(3, math.ceil(args.window_s / max(warm, 1e-6)))
        share = _backward_share(model, opt, x, sync)
        single = _windows(model, opt, x, sync, int(steps[0]), args.windows)
        del model, opt
    dist.barrier()
    dist.broadcast(steps, src=0)
    from torch.nn.parallel import DistributedDataParallel as DDP
    model, _ = _build(torch, device, width, layers)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    for _ in range(WARMUP_STEPS):
        _step(ddp, opt, x)
    mine = _windows(ddp, opt, x, sync, int(steps[0]), args.windows)
    worst = torch.tensor(mine, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    params = list(model.parameters())
    return {"width": width, "layers": layers, "batch": batch, "steps_per_window": int(steps[0]),
            "grad_bytes": sum(p.numel() * p.element_size() for p in params),
            "grad_tensors": len(params), "single_s": single, "ddp_s": worst.tolist(),
            "backward_share": share}


def _backward_share(model, opt, x, sync, reps: int = 3) -> float:
    """Backward's share of a synced step, median of `reps` (synthetic: the syncs are ours)."""
    shares = []
    for _ in range(reps):
        opt.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()
        sync()
        t3 = time.perf_counter()
        shares.append((t2 - t1) / max(t3 - t0, 1e-9))
    shares.sort()
    return shares[len(shares) // 2]


if __name__ == "__main__":
    main()
