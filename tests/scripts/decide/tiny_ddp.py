"""A torchrun-style script: gloo DDP on CPU, batch 16; HANG=1 blocks before the first step."""
import os
import time

if os.environ.get("HANG") == "1":      # stuck before the first step (data loading, say)
    with open(os.environ["HANG_PIDFILE"] + f".{os.getpid()}", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)

import torch.distributed as dist

from ddp_loop import train

dist.init_process_group("gloo")
train()
