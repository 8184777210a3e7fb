"""Trains only with exactly 2 processes, as Lightning's `Trainer(devices=2)` does under torchrun
("devices=2 ... does not match the world size (1)"). Each rank writes OUT_DIR/rank<R>.txt."""
import os
import sys

import torch
import torch.distributed as dist

DEVICES = 2
world = int(os.environ.get("WORLD_SIZE", "1"))
if world != DEVICES:
    raise ValueError(f"You set devices={DEVICES} in the Trainer, but the number of processes "
                     f"launched does not match the world size ({world})")
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
with open(os.path.join(sys.argv[1], f"rank{rank}.txt"), "w") as f:
    f.write(f"{rank} of {dist.get_world_size()}\n")
del model, opt                 # free the reducer first (see examples/train.py)
dist.barrier()
dist.destroy_process_group()
