"""A torchrun-style script for the trial spawner's contract tests (gloo on CPU, env://).

Writes its environment, pid, command line, rank and world size to $ENV_DUMP/rank<RANK>.json after joining
the group. DUMP_ONLY=1: leaves then. FAIL_RANK=r: that rank exits 3 before its first step
(the others wait in DDP's first broadcast). Otherwise trains a small DDP model (ddp_loop.py).
"""
import json
import os
import sys

import torch.distributed as dist

from ddp_loop import train

dist.init_process_group("gloo", init_method="env://")
with open("/proc/self/cmdline", "rb") as f:        # a warm rank: python -m smartlaunch.warm
    cmdline = f.read().decode().split("\0")
seen = dict(os.environ, _world=dist.get_world_size(), _rank=dist.get_rank(), _pid=os.getpid(),
            _cmdline=cmdline)
with open(os.path.join(os.environ["ENV_DUMP"], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
if os.environ.get("DUMP_ONLY") == "1":
    dist.destroy_process_group()
    sys.exit(0)
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    sys.exit(3)
train()
