"""Where a large model's set-up goes, one process against torchrun's ranks (issue 15, item 7).

A 1.0B GPT's set-up (bench/common.py `gpt-1b-b4`) took 17.7 s in the dry run but 33.9-39.1 s
in a DDP x2 trial's ranks (2x H200, 2026-11-23). This builds the same model the way
bench/suite/gpt.py does and stamps each phase, so the two can be compared phase by phase:

    python bench/setup_phases.py --out single.json
    torchrun --nproc-per-node 2 bench/setup_phases.py --out ddp.json     # OMP_NUM_THREADS=1

Each rank writes one JSON line (rank, world, OMP_NUM_THREADS, torch threads, seconds per phase)
to --out (appended; "-": stdout, for runs inside smartlaunch's sandbox, bench/diag/trial_setup.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()
import torch                                                     # noqa: E402
import torch.distributed as dist                                 # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite"))
from gpt import GPT                                              # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--width", type=int, default=1792)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads before set-up")
    a = p.parse_args()
    stamps = {"import_torch": time.perf_counter() - T0}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.threads:
        torch.set_num_threads(a.threads)

    def mark(name: str, t: float) -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        stamps[name] = now - t
        return now

    t = time.perf_counter()
    dev = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.zeros(1, device=dev)
    t = mark("cuda_init", t)
    if world > 1:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    t = mark("init_process_group", t)
    torch.manual_seed(rank)
    model = GPT(50304, 512, a.layers, a.heads, a.width)
    t = mark("build_cpu", t)
    model = model.to(dev)
    t = mark("to_device", t)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local] if dev.type == "cuda" else None)
    t = mark("ddp_wrap", t)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tok = torch.randint(0, 50304, (4, 513), device=dev)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu")
    for i in range(2):
        with ctx:
            out = model(tok[:, :-1])
            loss = torch.nn.functional.cross_entropy(out.flatten(0, 1).float(), tok[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = mark(f"step{i}", t)
    stamps["total"] = time.perf_counter() - T0
    row = {"rank": rank, "world": world, "omp": os.environ.get("OMP_NUM_THREADS"),
           "threads": torch.get_num_threads(), "seconds": {k: round(v, 3) for k, v in stamps.items()}}
    if a.out == "-":
        print("PHASES " + json.dumps(row), flush=True)
    else:
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
