"""A tiny training script for the early dry-run tests: says which process ran it (stdout, and
$ENV_DUMP/dry.json, which a sandboxed dry run can still write: /dev/shm is shared), then trains."""
import json
import os

import torch

with open("/proc/self/cmdline", "rb") as f:        # an early dry run: python -u -m smartlaunch.warm
    cmdline = f.read().decode().split("\0")
print(f"early-dump pid {os.getpid()}", flush=True)
with open(os.path.join(os.environ["ENV_DUMP"], "dry.json"), "w") as f:
    json.dump({"pid": os.getpid(), "cmdline": cmdline, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
               "dryrun": os.environ.get("SMARTLAUNCH_DRYRUN")}, f)
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(2000):
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
