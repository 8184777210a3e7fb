"""Host cost of the work timer (worktime.py) per optimizer step, on CPU.

A model with many small parameter tensors makes the per-parameter gradient hook visible: the
hook is a Python call per parameter per backward. Prints microseconds per step with and without
the timer, alternating rounds, the fastest of 7 (the machine is shared).
"""
import sys
import tempfile
import time

import torch

from smartlaunch.launch.worktime import WorkTimer, WorkWriter, work_path


def run(n_layers: int, steps: int, timed: bool) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(n_layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    handle = None
    if timed:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        timer = WorkTimer(WorkWriter(work_path(tempfile.mkdtemp(), 0)))
        handle = register_optimizer_step_post_hook(timer._after_step)
    x = torch.randn(4, 8)
    for i in range(steps + 5):
        if i == 5:
            t0 = time.perf_counter()
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    dt = (time.perf_counter() - t0) / steps
    if handle:
        handle.remove()
    return dt


if __name__ == "__main__":
    torch.set_num_threads(1)
    for n in (int(a) for a in (sys.argv[1:] or ["10", "150"])):
        off, on = [], []
        for i in range(7):
            for timed in ((False, True) if i % 2 else (True, False)):
                (on if timed else off).append(run(n, 200, timed))
        a, b = min(off), min(on)
        print(f"{2 * n} parameter tensors: step {a * 1e6:.0f} us without, {b * 1e6:.0f} us with the timer "
              f"(+{(b - a) * 1e6:.0f} us, {(b - a) / (2 * n) * 1e6:.2f} us per tensor)")
