"""Child side of the dry run: run the user's entrypoint unchanged, with hooks installed first.

    python -m smartlaunch.profile.dryrun [--out PATH] [--warmup N] [--measure N]
                                         [--min-seconds S] [--cpu-shim] [--module] SCRIPT [ARGS...]

Hooks (all global, none needs the script's cooperation):
- an optimizer step post-hook: one step = one `step()` of the first optimizer that steps
  (or one `smartlaunch.profile_step()` once the script calls it); device-synchronized times
  between steps after `warmup` steps, `measure` intervals measured, more while the window
  is shorter than `min-seconds` (at most MAX_STEPS);
- module forward pre/post hooks until the first step: the root modules called (depth 0), the
  batch size (leading dimension of a root's first tensor input, with grad enabled), DDP/FSDP;
  afterwards only the roots keep two cheap hooks that time forward and backward.
After the last measured step the result is written (JSON, atomically) to --out and the script
ends with SystemExit(0); a script that swallows it is ended with os._exit(0) at its next step.
SIGTERM (the parent's time limit) writes what was measured so far before exiting.
"""
from __future__ import annotations

import atexit
import json
import os
import resource
import signal
import statistics
import sys
import time

from smartlaunch.profile import envwatch

MAX_STEPS = 5000          # --min-seconds never measures more steps than this
USAGE = ("usage: python -m smartlaunch.profile.dryrun [--out PATH] [--warmup N] [--measure N] "
         "[--min-seconds S] [--cpu-shim] [--module] SCRIPT [ARGS...]")


class Recorder:
    def __init__(self, out: str, warmup: int, measure: int, min_seconds: float = 0.0):
        import torch
        self.torch = torch
        self.out, self.warmup, self.measure = out, max(0, warmup), max(1, measure)
        # Only for one process: ranks of a DDP trial must stop at the same step, so trials
        # size their window in steps (decide.trial) and leave this 0.
        self.min_seconds = max(0.0, min_seconds)
        self.t_start = time.perf_counter()
        self.optimizers_built = 0
        self.primary = None              # the optimizer whose steps count, or "marker"
        self.steps = 0
        self.t_last: float | None = None
        self.t_first_step: float | None = None
        self.intervals: list[float] = []
        self.roots: dict[int, object] = {}
        self.batch_size: int | None = None
        self.depth = 0
        self.handles: list = []
        self.fwd_cur = 0.0               # forward seconds inside the current step
        self.bwd_cur = 0.0
        self.fwd: list[float] = []
        self.bwd: list[float] = []
        self.params: list = []           # the primary optimizer's params
        self.done = False
        self.written = False
        # Measured steps run free: no device sync per step, which would serialise the CPU's
        # kernel launches with the GPU and inflate launch-bound steps (measured on H200: an
        # LSTM at 8.9 ms synced vs 5.1 ms free). The forward/backward split, which needs
        # syncs, is taken during warm-up; the window is synced only at its two ends.
        self.split_timing = True
        self.t_window: float | None = None
        self.synced: list[float] = []    # warm-up step intervals, device-synced

    # ---- time ---------------------------------------------------------------------------
    def now(self) -> float:
        cuda = self.torch.cuda
        if cuda.is_available() and cuda.is_initialized():
            cuda.synchronize()
        return time.perf_counter()

    # ---- discovery hooks (until the first step) -----------------------------------------
    def install(self) -> None:
        torch = self.torch
        rec = self
        orig_init = torch.optim.Optimizer.__init__

        def init(opt, *args, **kwargs):
            rec.optimizers_built += 1
            return orig_init(opt, *args, **kwargs)

        torch.optim.Optimizer.__init__ = init
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(self.on_optimizer_step)
        mm = torch.nn.modules.module
        self.handles.append(mm.register_module_forward_pre_hook(self.on_pre))
        try:
            self.handles.append(mm.register_module_forward_hook(self.on_post, always_call=True))
        except TypeError:  # older signature without always_call
            self.handles.append(mm.register_module_forward_hook(self.on_post))
        import smartlaunch
        smartlaunch._step_hook = self.on_marker

    def on_pre(self, module, args):
        if self.depth == 0 and self.t_first_step is None:
            self.roots.setdefault(id(module), module)
            if self.batch_size is None and self.torch.is_grad_enabled():
                self.batch_size = _leading_dim(args)
        self.depth += 1

    def on_post(self, module, args, output):
        self.depth = max(0, self.depth - 1)

    # ---- timing hooks on the roots (after the first step) --------------------------------
    def time_roots(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        for root in self.model_roots():
            self.handles.append(root.register_forward_pre_hook(self.on_root_pre))
            self.handles.append(root.register_forward_hook(self.on_root_post))

    def on_root_pre(self, module, args):
        if self.split_timing and self.torch.is_grad_enabled():
            module._smartlaunch_t0 = self.now()

    def on_root_post(self, module, args, output):
        t0 = getattr(module, "_smartlaunch_t0", None)
        if t0 is None:
            return
        module._smartlaunch_t0 = None
        self.fwd_cur += self.now() - t0
        out = _first_grad_tensor(output)
        if out is not None and out.grad_fn is not None:
            try:
                out.grad_fn.register_prehook(self.on_backward_start)
            except Exception:  # some grad_fn types take no hooks; backward stays unknown
                pass

    def on_backward_start(self, grad_outputs):
        t0 = self.now()
        rec = self

        def at_end():
            rec.bwd_cur += rec.now() - t0

        self.torch.autograd.Variable._execution_engine.queue_callback(at_end)

    # ---- steps ------------------------------------------------------------------------------
    def on_optimizer_step(self, opt, args, kwargs):
        if self.primary is None:
            self.primary = opt
            self.params = [p for g in opt.param_groups for p in g["params"]]
        if opt is self.primary:
            self.on_step()

    def on_marker(self):
        if self.primary != "marker":  # a marker overrides optimizer steps: restart counting
            self.primary, self.steps, self.t_last, self.intervals = "marker", 0, None, []
            self.fwd, self.bwd = [], []
        self.on_step()

    def on_step(self):
        if self.done:  # the script swallowed our SystemExit
            self.write()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        self.steps += 1
        if self.split_timing:
            t = self.now()
            if self.t_first_step is None:
                self.t_first_step = t
                self.depth = 0
                self.time_roots()
            elif self.steps > 1:
                self.fwd.append(self.fwd_cur)
                self.bwd.append(self.bwd_cur)
                self.synced.append(t - self.t_last)
            if self.steps >= self.warmup + 1:
                self.split_timing = False
                self.t_window = self.now()
            self.t_last, self.fwd_cur, self.bwd_cur = self.now(), 0.0, 0.0
            return
        t = time.perf_counter()
        self.intervals.append(t - self.t_last)
        self.t_last = t
        if len(self.intervals) >= self.measure and (
                t - self.t_window >= self.min_seconds or len(self.intervals) >= MAX_STEPS):
            self.window_s = self.now() - self.t_window
            self.done = True
            self.write(reason="measured")
            raise SystemExit(0)

    # ---- result -----------------------------------------------------------------------------
    def model_roots(self) -> list:
        ids = {id(p) for p in self.params}
        roots = [m for m in self.roots.values() if not ids or any(id(p) in ids for p in m.parameters())]
        return roots

    def result(self) -> dict:
        torch = self.torch
        params = self.params
        if self.primary == "marker" or not params:
            params = [p for m in self.model_roots() for p in m.parameters()]
        trainable = _unique(p for p in params if p.requires_grad)
        every = _unique(list(params) + [p for m in self.model_roots() for p in m.parameters()])
        dtypes: dict[str, int] = {}
        for p in every:
            key = str(p.dtype).replace("torch.", "")
            dtypes[key] = dtypes.get(key, 0) + p.numel()
        r: dict = {
            "steps_seen": self.steps,
            "optimizers_built": self.optimizers_built,
            "marker": self.primary == "marker",
            "total_params": sum(p.numel() for p in every),
            "trainable_params": sum(p.numel() for p in trainable),
            "grad_bytes": sum(p.numel() * p.element_size() for p in trainable),
            "num_grad_tensors": len(trainable),
            "param_dtypes": dtypes,
            "batch_size": self.batch_size,
            "wrapped": _wrapper(self.roots.values()),
            "steps_measured": len(self.intervals),
            "measure_asked": self.measure,
            "peak_host_mem_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "device": "cpu",
        }
        if self.t_first_step is not None:
            r["startup_s"] = self.t_first_step - self.t_start
        if self.intervals:
            xs = sorted(self.intervals)
            # Host-side intervals of free-running steps are only approximately device
            # time; the synced window is exact, so it gives the step time.
            window = getattr(self, "window_s", None)
            r["step_time_s"] = window / len(xs) if window else statistics.median(xs)
            p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
            r["step_time_p90_s"] = max(p90, r["step_time_s"])
        if self.fwd and r.get("step_time_s"):
            # The split was timed on synced warm-up steps; keep its shares, scaled to the
            # free-running step, so backward_s / step_time_s stays the measured share.
            scale = r["step_time_s"] / statistics.median(self.synced) if self.synced else 1.0
            if any(self.fwd):
                r["forward_s"] = statistics.median(self.fwd) * scale
            if any(self.bwd):
                r["backward_s"] = statistics.median(self.bwd) * scale
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            dev = torch.cuda.current_device()
            r["device"] = f"cuda:{dev} ({torch.cuda.get_device_name(dev)})"
            r["peak_gpu_mem_bytes"] = torch.cuda.max_memory_reserved(dev)
            r["peak_gpu_mem_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        return r

    def write(self, reason: str = "exit") -> None:
        """reason: "measured" (we end the script), "exit" (it ended), "signal" (time limit)."""
        if self.written or not self.out:
            return
        self.written = True
        try:
            data = self.result()
        except Exception as exc:  # never turn a finished run into a crash
            data = {"steps_seen": self.steps, "error": f"{type(exc).__name__}: {exc}"}
        data["reason"] = reason
        data["world_size_read"] = envwatch.reads()
        tmp = f"{self.out}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.out)


def _leading_dim(args) -> int | None:
    import torch
    stack = list(args) if isinstance(args, (tuple, list)) else [args]
    while stack:
        a = stack.pop(0)
        if isinstance(a, torch.Tensor):
            return int(a.shape[0]) if a.dim() > 0 else None
        if isinstance(a, (tuple, list)):
            stack[:0] = list(a)
        elif isinstance(a, dict):
            stack[:0] = list(a.values())
    return None


def _first_grad_tensor(output):
    import torch
    stack = [output]
    while stack:
        a = stack.pop(0)
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return a
        elif isinstance(a, (tuple, list)):
            stack[:0] = list(a)
        elif isinstance(a, dict):
            stack[:0] = list(a.values())
    return None


def _unique(params) -> list:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _wrapper(modules) -> str | None:
    for m in modules:
        names = {c.__name__ for c in type(m).__mro__}
        if "DistributedDataParallel" in names:
            return "DDP"
        if "FullyShardedDataParallel" in names or "FSDPModule" in names:
            return "FSDP"
    return None


def parse(argv: list[str]) -> dict:
    opts = {"out": os.environ.get("SMARTLAUNCH_DRYRUN_OUT", ""), "warmup": 5, "measure": 20,
            "min_seconds": 0.0,
            "module": False, "cpu_shim": os.environ.get("SMARTLAUNCH_DRYRUN_CPU_SHIM") == "1"}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a in ("--out", "--warmup", "--measure") and i + 1 < len(argv):
            key = a[2:]
            opts[key] = argv[i + 1] if key == "out" else int(argv[i + 1])
            i += 2
        elif a == "--min-seconds" and i + 1 < len(argv):
            opts["min_seconds"] = float(argv[i + 1])
            i += 2
        elif a in ("--module", "-m"):
            opts["module"] = True
            i += 1
        elif a == "--cpu-shim":
            opts["cpu_shim"] = True
            i += 1
        elif a == "--no-python":
            raise SystemExit("smartlaunch dry run: --no-python entrypoints cannot be profiled")
        else:
            raise SystemExit(f"smartlaunch dry run: unknown option {a}\n{USAGE}")
    if i >= len(argv):
        raise SystemExit(USAGE)
    opts["script"], opts["args"] = argv[i], argv[i + 1:]
    return opts


def main(argv: list[str] | None = None) -> None:
    opts = parse(sys.argv[1:] if argv is None else argv)
    rec = Recorder(opts["out"], opts["warmup"], opts["measure"], opts["min_seconds"])
    if opts["cpu_shim"]:
        from smartlaunch.profile import cpu_shim
        cpu_shim.install()
    rec.install()
    envwatch.install()
    atexit.register(rec.write)  # the script ended on its own: report what was seen

    def on_term(signum, frame):
        rec.write(reason="signal")
        sys.stdout.flush()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    from smartlaunch.entry import run_entrypoint
    run_entrypoint(opts["script"], opts["args"], module=opts["module"])


if __name__ == "__main__":
    main()
