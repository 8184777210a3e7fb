"""Tiny CPU training step for the two-node rendezvous test: every rank writes what it saw."""
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(rank)
loss = model(torch.randn(8, 4)).pow(2).mean()
loss.backward()
opt.step()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
out = {"rank": rank, "world": world, "sum": t.item(), "group_rank": int(os.environ["GROUP_RANK"]),
       "weight": model.module.weight.detach().flatten().tolist()}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
# Free the DDP reducer before the group: with gloo on torch 2.13 a reducer alive at exit
# aborts now and then ("terminate called without an active exception"); see examples/train.py.
del model, opt, loss
import gc  # noqa: E402

gc.collect()
dist.barrier()
dist.destroy_process_group()
