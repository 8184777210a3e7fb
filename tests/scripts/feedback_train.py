"""A DDP-ready training loop whose step takes SLEEP_MS milliseconds of host time per rank.

It sets up as torchrun scripts do (init_process_group, DDP) without reading the world size
itself; tests give a DDP launch a longer SLEEP_MS than a single one to stand for a job that
scales badly. TENANT_FIXTURE (a fake topology's JSON): after step TENANT_STEP (5), rank 0 of a
run of TENANT_WORLD ranks (any) writes another user's process onto GPU 0 there, as a job that
starts on the GPU mid-run.
"""
import argparse
import json
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
    for step in range(args.steps):
        if step == int(os.environ.get("TENANT_STEP", "5")) and os.environ.get("TENANT_FIXTURE") \
                and os.environ.get("RANK") == "0" \
                and os.environ.get("TENANT_WORLD", "any") in ("any", os.environ.get("WORLD_SIZE")):
            plant(os.environ["TENANT_FIXTURE"])
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(sleep)
    del model, opt                     # free the reducer first (see examples/train.py)
    dist.barrier()
    dist.destroy_process_group()


def plant(path):
    with open(path) as f:
        topo = json.load(f)
    topo["gpus"][0]["processes"] = [{"pid": 4242, "user": "mallory", "used_mib": 1000}]
    with open(path + ".new", "w") as f:
        json.dump(topo, f)
    os.replace(path + ".new", path)


if __name__ == "__main__":
    main()
