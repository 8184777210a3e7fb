"""A DDP-ready training loop whose step takes SLEEP_MS milliseconds of host time per rank.

It sets up as torchrun scripts do (init_process_group, DDP) without reading the world size
itself; tests give a DDP launch a longer SLEEP_MS than a single one to stand for a job that
scales badly.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    sleep = float(os.environ.get("SLEEP_MS", "20")) / 1e3
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(sleep)
    del model, opt                     # free the reducer first (see examples/train.py)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
