"""A rank that skips one all-reduce (issue 18 bench): the classic `if rank == 0: all_reduce(metric)`.

Every step all-reduces the loss over NCCL for logging; at step --skip-step rank 1 skips it and
goes on to a CPU-side barrier (gloo), where it waits for rank 0, which waits inside the NCCL
all-reduce that rank 1 never entered.
"""
import argparse
import os

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--skip-step", type=int, default=200)
a = p.parse_args()
dist.init_process_group("nccl")
rank, lr = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(lr)
cpu_group = dist.new_group(backend="gloo")
dev = torch.device("cuda", lr)
model = torch.nn.Linear(1024, 1024).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 1024, device=dev)
for step in range(1, 100000):
    loss = model(x).square().mean()
    loss.backward()
    for q in model.parameters():
        dist.all_reduce(q.grad)
    opt.step()
    opt.zero_grad()
    if not (rank == 1 and step == a.skip_step):
        dist.all_reduce(loss.detach())
        loss.item()
    if step % 100 == 0:
        dist.barrier(group=cpu_group)      # a checkpoint-style sync on the CPU group
