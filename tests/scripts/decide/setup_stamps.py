"""A torchrun-style DDP script that stamps when it has set itself up and when its first
forward returned, for the tests of a trial set up beside the dry run (tests/test_trial_early.py).

Writes $ENV_DUMP/<dry|trial><RANK>.json (trials also trial-w<WORLD_SIZE>-r<RANK>.json): {"set_up": wall time, "first_forward": wall time,
"cmdline": ...}. SETUP_S: seconds of set-up (a large model's build) before the first forward.
STEP_S: seconds each step sleeps (device work the host waits for: DDP then scales).
Trial ranks also leave $ENV_DUMP/started<RANK> at their start. OOM_ONCE=1: the dry run's first
run, once a trial's rank 0 has started beside it, fails as a CUDA out-of-memory error does (its
flag file in $ENV_DUMP remembers it ran), as one sharing its GPU with the trial's ranks could;
OOM_ONCE=now: at once.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dump = os.environ["ENV_DUMP"]
kind = "trial" if os.environ.get("SMARTLAUNCH_TRIAL") else "dry"
flag = os.path.join(dump, "oom-once")
if kind == "trial":
    open(os.path.join(dump, f"started{os.environ['RANK']}"), "w").close()
if kind == "dry" and os.environ.get("OOM_ONCE") in ("1", "now") and not os.path.exists(flag):
    t0 = time.time()            # fails once the trial's ranks run beside it
    while os.environ["OOM_ONCE"] == "1" and not os.path.exists(os.path.join(dump, "started0")) \
            and time.time() - t0 < 60:
        time.sleep(0.05)
    open(flag, "w").close()
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
    sys.exit(1)
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo", init_method="env://")
time.sleep(float(os.environ.get("SETUP_S", "0")))
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
model = DDP(model) if world > 1 else model
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with open("/proc/self/cmdline", "rb") as f:
    stamps = {"set_up": time.time(), "cmdline": f.read().decode().split("\0")}
step_s = float(os.environ.get("STEP_S", "0"))
for step in range(10_000):
    time.sleep(step_s)
    loss = model(torch.randn(16, 32)).sum()
    if step == 0:
        stamps["first_forward"] = time.time()
        with open(os.path.join(dump, f"{kind}{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(stamps, f)
        if kind == "trial":     # several trial sizes: one file per world size and rank too
            with open(os.path.join(dump, f"trial-w{world}-r{os.environ['RANK']}.json"), "w") as f:
                json.dump(stamps, f)
    opt.zero_grad()
    loss.backward()
    opt.step()
if world > 1:
    dist.destroy_process_group()
