"""A small training script that stamps its progress, for the early all-reduce sweep's tests
(tests/test_early_comm.py): $STAMPS/stamps.json gets its command line (the dry run's, with or
without --gate) and the wall time after its set-up, just before and just after its first
forward. FAIL_AT_SETUP=1: exits 5 before any forward."""
import json
import os
import sys
import time

import torch
from torch import nn


def stamp(**kv):
    path = os.path.join(os.environ["STAMPS"], "stamps.json")
    seen = {}
    if os.path.exists(path):
        with open(path) as f:
            seen = json.load(f)
    seen.update(kv)
    with open(path + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".tmp", path)


with open("/proc/self/cmdline", "rb") as f:
    stamp(setup=time.time(), cmdline=f.read().decode().split("\0"))
if os.environ.get("FAIL_AT_SETUP") == "1":
    sys.exit(5)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 32)
for step in range(100_000):
    if step == 0:
        stamp(before_forward=time.time())
    loss = model(x).sum()
    if step == 0:
        stamp(after_forward=time.time())
    opt.zero_grad()
    loss.backward()
    opt.step()
