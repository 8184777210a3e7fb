"""Step time of a script with one bare optimizer step post-hook (a CUDA event per step, no
other hook): the floor against which the dry run's profile is compared (issue 15, the
many-tensor model's profile read 94 ms against its own 72 ms).

    python bench/diag/bare_steps.py SKIP SCRIPT [ARGS...]   -> prints "bare_step_ms=..."
"""
import atexit
import os
import runpy
import statistics
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

skip = int(sys.argv[1])
events = []


def on_step(opt, args, kwargs):
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    events.append(e)


def report():
    torch.cuda.synchronize()
    ev = events[skip:]
    d = [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]
    if d:
        print(f"bare_step_ms={statistics.median(d):.3f} mean={sum(d) / len(d):.3f} n={len(d)}",
              flush=True)


register_optimizer_step_post_hook(on_step)
atexit.register(report)
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
