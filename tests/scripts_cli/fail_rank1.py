"""Trains a tiny DDP model; rank 1 raises at step 3."""
import os

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if rank == 1 and step == 3:
        raise RuntimeError("boom in rank 1")
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
dist.destroy_process_group()
