"""Host time spent inside the worker hook's per-step hooks, on CPU: each hook wrapped in a
perf_counter accumulator, a small 20-tensor model stepped 5,000 times; microseconds per step.
`empty` is the wrapper's own cost (subtract it from each line).

    python bench/diag/hook_self_time.py
"""
import tempfile, time, torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from smartlaunch.launch.worktime import WorkTimer, WorkWriter, work_path
from smartlaunch.launch.progress import ProgressWriter, progress_path
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(10)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(4, 8)
acc = {}
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter()
        try: return fn(*a, **k)
        finally: acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
    return w
timer = WorkTimer(WorkWriter(work_path(tempfile.mkdtemp(), 0)))
for n in ("_on_grad", "_backward_done", "_drain", "_mark"):
    setattr(timer, n, timed(n, getattr(timer, n)))
register_optimizer_step_post_hook(timed("_after_step", timer._after_step))
pw = ProgressWriter(progress_path(tempfile.mkdtemp(), 0), 0, 0)
register_optimizer_step_post_hook(timed("progress", lambda o, a, k: pw.step()))
empty = timed("empty", lambda: None)
N = 5000
for i in range(N):
    model(x).sum().backward(); opt.step(); opt.zero_grad(); empty()
for k, v in sorted(acc.items()): print(f"{k:15s} {v / N * 1e6:7.2f} us/step")
print("hooked params now:", len(timer._handles))
