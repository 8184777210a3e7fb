"""A torchrun-style script: gloo DDP on CPU, batch 16; HANG=1 blocks before the first step."""
import os
import time

if os.environ.get("HANG") == "1":      # stuck before the first step (data loading, say)
    with open(os.environ["HANG_PIDFILE"] + f".{os.getpid()}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(10_000):
    loss = model(torch.randn(16, 32)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
