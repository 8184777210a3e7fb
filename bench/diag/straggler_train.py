"""DDP training on GPUs with one rank made slower by extra matmuls (issue 18 bench).

  --slow-rank R     the rank that does extra work before each forward (-1: none)
  --extra N         extra 4096x4096 fp32 matmuls on that rank per step
  --seconds S       run time
Each rank prints its own CUDA-event truth at the end: base work (forward + backward) and the
extra matmuls, per step, so the launcher's measured slowdown can be compared with it.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--extra", type=int, default=4)
p.add_argument("--seconds", type=float, default=40.0)
p.add_argument("--batch", type=int, default=256)
a = p.parse_args()

dist.init_process_group("nccl")
rank, lr = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(lr)
dev = torch.device("cuda", lr)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU())
                              for _ in range(8)]).to(dev)
model = DDP(model, device_ids=[lr])
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(a.batch, 4096, device=dev)
m = torch.randn(4096, 4096, device=dev)
ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
base_ms, extra_ms, timed = 0.0, 0.0, 0
t0 = time.monotonic()
step = 0
while time.monotonic() - t0 < a.seconds:
    step += 1
    probe = step % 50 == 0
    if probe:
        torch.cuda.synchronize()
        ev[0].record()
    if rank == a.slow_rank:
        for _ in range(a.extra):
            m = torch.mm(m, m).clamp_(-1, 1)
    if probe:
        ev[1].record()
    loss = model(x).square().mean()
    loss.backward()
    if probe:
        ev[2].record()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step == 1 and rank == 0:
        print("first step done", flush=True)
    if probe:
        torch.cuda.synchronize()
        extra_ms += ev[0].elapsed_time(ev[1])
        base_ms += ev[1].elapsed_time(ev[2])
        timed += 1
torch.cuda.synchronize()
dt = time.monotonic() - t0
print(f"truth rank {rank}: steps {step} in {dt:.1f} s ({step / dt:.2f}/s); per step: extra "
      f"{extra_ms / max(timed, 1):.2f} ms, forward+backward incl. all-reduce wait "
      f"{base_ms / max(timed, 1):.2f} ms", flush=True)
dist.destroy_process_group()
