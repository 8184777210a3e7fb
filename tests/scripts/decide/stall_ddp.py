"""gloo DDP on CPU that stops making progress after STALL_AFTER steps: rank 1 then sleeps (a
loader that stopped delivering, a rank stuck in its own code); rank 0 waits in the next
all-reduce. Writes its pid to STALL_PIDFILE.<pid>."""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

with open(os.environ["STALL_PIDFILE"] + f".{os.getpid()}", "w") as f:
    f.write(str(os.getpid()))
dist.init_process_group("gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
after = int(os.environ.get("STALL_AFTER", "3"))
for step in range(10_000):
    if step == after and dist.get_rank() == 1:
        time.sleep(600)
    loss = model(torch.randn(16, 32)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
