"""Checkpoints every step to ckpt/state.pt and resumes from it at start, like long jobs do;
keeps Lightning-style log dirs (lightning_logs/version_N, the next free N) and appends
"start <step>" to runs.txt for every run; a library-style cache under $HOME. Rank 0 writes.

    python resume_every_step.py [STEPS]
"""
import os
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
torch.manual_seed(0)
model = torch.nn.Linear(32, 8)
if world > 1:
    torch.distributed.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if os.path.exists("ckpt/state.pt"):
    state = torch.load("ckpt/state.pt")
    start = state["step"]
    opt.load_state_dict(state["opt"])
if rank == 0:
    version = 0
    while os.path.exists(f"lightning_logs/version_{version}"):
        version += 1
    os.makedirs(f"lightning_logs/version_{version}/checkpoints")
    with open(f"lightning_logs/version_{version}/hparams.yaml", "w") as f:
        f.write(f"steps: {steps}\n")
    with open("runs.txt", "a") as f:
        f.write(f"start {start}\n")
    cache = os.path.join(os.path.expanduser("~"), ".cache", "somelib")
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, "index.json"), "w") as f:
        f.write("{}\n")
    os.makedirs("ckpt", exist_ok=True)
for step in range(start, steps):
    opt.zero_grad()
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    if rank == 0:
        torch.save({"step": step + 1, "opt": opt.state_dict()}, "ckpt/state.pt.tmp")
        os.replace("ckpt/state.pt.tmp", "ckpt/state.pt")
if world > 1:
    del model, opt                 # free the reducer first (see examples/train.py)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
