"""Child side of the dry run: run the user's entrypoint unchanged, with global hooks installed.

- an optimizer step post-hook: one step = one `step()` of the first optimizer that steps (or one
  `smartlaunch.profile_step()`). After `warmup` steps a window opens (one device sync) and every
  step end is marked in device time (clock.py): `measure` steps, more while the window is shorter
  than `min-seconds` (at most MAX_STEPS); with `--precision P`, fewer once the mean step is known
  to P, and a warm-up that adapts (Recorder.warmed);
- module forward hooks until the first step (roots, DDP/FSDP, each root call's batch); in the
  warm-up steps after it, hooks on the model's roots count micro-batches and mark forward and
  backward; inside the window only the step hook runs.
However the script ends (measured, returned, sys.exit, an exception, SIGTERM) the window is
closed by a device sync (SIGTERM: only finished marks are read) and the result written; a window
that closed before its goal says so (`window_cut_short`)."""
from __future__ import annotations

import atexit
import json
import math
import os
import resource
import signal
import statistics
import sys
import time

from smartlaunch.entry import after_import, exit_now, report_uncaught, run_entrypoint
from smartlaunch.profile.clock import device_clock, read_window, relative_half_width
from smartlaunch.profile.dryrun_args import parse
from smartlaunch.profile.inputs import (WorldSizeWatch, first_grad_tensor, leading_dim,
                                        unique, wrapper_name)

MAX_STEPS = 5000          # --min-seconds never measures more steps than this
PRECISE_STEPS = 8         # --precision stops a window no shorter than this
SAME_STEP = 0.05          # two warm-up steps this close (relative) end the warm-up early
COMPILE_STEP = 2.0        # a warm-up step this many times its predecessor's: a (re)compile
MAX_CALLS = 10000         # grad-enabled model calls remembered per step (batch, micro-batches)


def _end_script() -> None:      # in-process use (tests): end the script the polite way
    raise SystemExit(0)


def compiled_any() -> bool:
    """torch.compile (dynamo) has traced at least one graph in this process."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(dynamo and dynamo.counters["stats"]["unique_graphs"])
    except Exception:   # another torch's counters: assume traced, keep the hooks (inert)
        return True


def compiled_call(torch, module) -> bool:
    """This forward runs under torch.compile, whose first call compiles before it computes: traced
    now (module.compile(), a compiled step function) or the wrapper torch.compile(model) returns."""
    if torch.compiler.is_compiling() or getattr(module, "_compiled_call_impl", None) is not None:
        return True
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")    # not imported: nothing compiled
    return eval_frame is not None and isinstance(module, getattr(eval_frame, "OptimizedModule", ()))


class Recorder:
    def __init__(self, out: str, warmup: int, measure: int, min_seconds: float = 0.0,
                 clock=None, control=None, exit=_end_script, gate: bool = False,
                 precision: float = 0.0, hold: bool = False,
                 started: tuple[float, float] | None = None,
                 world: WorldSizeWatch | None = None):
        """started: (time.perf_counter(), time.time()) when the script started, where that was
        before this (the script's own import of torch makes it); world: the watch of its world
        size reads, installed on os.environ since then."""
        import torch
        self.torch = torch
        self.out, self.warmup, self.measure = out, max(0, warmup), max(1, measure)
        # One process only (trial ranks must stop at the same step):
        self.min_seconds = max(0.0, min_seconds)
        self.precision = max(0.0, precision)
        self.read = 0                     # window marks known complete (a prefix)
        self.window_steps: list[float] = []   # their step times, for the precision stop
        self.clock = clock                # None: chosen when the window opens (clock.py)
        self.host = clock.now if clock is not None else time.perf_counter
        self.exit = exit                  # after the measured window is written
        self.t_start, self.wall_start = started if started and clock is None else (
            self.host(), time.time())
        self.optimizers_built = 0
        self.primary = None              # the optimizer whose steps count, or "marker"
        self.steps = 0
        self.step0 = 0                   # steps before this window's warm-up (a held window)
        self.hold = hold                 # after each window, wait for another (hold_on)
        self.t_first_step: float | None = None
        self.roots: dict[int, object] = {}
        self.depth = 0
        self.handles: list = []
        self.discovered = False          # the discovery hooks' work is done (time_roots)
        self.eager_root = False          # a root was called outside any compiled graph
        self.params: list = []           # the primary optimizer's params
        self.main_root: int | None = None
        self.calls: list[tuple[int, int | None]] = []       # (root id, batch) this step
        self.per_step: list[tuple[int, int | None]] = []    # (micro-batches, samples) per step
        self.micro_batch: int | None = None
        # Warm-up steps after the first: step-end marks and forward/backward spans (the split).
        # The window: step-end marks only, steps run free, read after the closing sync.
        self.warm: list = []
        self.warm_spans: list[list[tuple[str, object, object]]] = []
        self.cur: list[tuple[str, object, object]] = []
        self.t_window: float | None = None
        self.marks: list = []
        self.mark_hosts: list[float] = []  # host time just after each window mark was queued
        self.closed: str | None = None   # why the window closed: measured | exit | signal
        self.written = False
        self.world = world or WorldSizeWatch(lambda: self.t_first_step is None)
        self.gate, self.gate_wait_s = gate, None      # pass_gate
        self.gate_at_step = False       # the first forward ran under torch.compile
        self.control = control

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
        # The post hook sees keyword arguments (global pre hooks cannot): model(**inputs).
        self.handles.append(mm.register_module_forward_hook(
            self.on_post, with_kwargs=True, always_call=True))
        self.world.install(torch)
        import smartlaunch
        smartlaunch._step_hook = self.on_marker

    def pass_gate(self) -> None:
        """The first forward (or, where torch.compile runs it, the end of the first step) waits
        for the parent's go; a trial's go carries its step count."""
        if self.gate:
            self.gate = False
            if self.control is not None:
                self.gate_wait_s, opts = self.control.gate()
                self.measure = max(1, int(opts.get("measure") or self.measure))

    def skip(self) -> bool:
        """Nothing to do: discovery is over, or torch.compile is tracing modules inside a root
        already seen outside its graph (torch.compile(model)): nothing of ours then enters the
        graph or its guards, which read only eager_root, set once before. A root seen only
        inside a graph (module.compile(), a compiled step function) is discovered as before."""
        if self.torch.compiler.is_compiling():
            return self.eager_root or self.discovered
        return self.discovered

    def on_pre(self, module, args):
        if self.skip():
            return
        if compiled_call(self.torch, module):
            self.gate_at_step = True    # it compiles first (graph breaks too): gate at the step
        elif not self.gate_at_step:
            self.pass_gate()
        if self.depth == 0 and self.t_first_step is None:
            if not self.torch.compiler.is_compiling():
                self.eager_root = True
            self.roots.setdefault(id(module), module)
        self.depth += 1

    def on_post(self, module, args, kwargs, output):
        if self.skip():
            return
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.t_first_step is None and self.torch.is_grad_enabled() \
                and len(self.calls) < MAX_CALLS:
            self.calls.append((id(module), leading_dim(args, kwargs)))

    # ---- timing hooks on the roots (after the first step) --------------------------------
    def time_roots(self) -> None:
        """The discovery hooks end; timing hooks go on the roots. Where torch.compile has traced
        a graph, the global hooks stay installed and do nothing: its guards check their number,
        and removing them would recompile every graph in the next step."""
        self.discovered = True
        if not compiled_any():
            for h in self.handles:
                h.remove()
        self.handles = []
        for root in self.model_roots():
            self.handles.append(root.register_forward_pre_hook(self.on_root_pre, with_kwargs=True))
            self.handles.append(root.register_forward_hook(self.on_root_post))

    def on_root_pre(self, module, args, kwargs):
        if not self.torch.is_grad_enabled():
            return
        if len(self.calls) < MAX_CALLS:
            self.calls.append((id(module), leading_dim(args, kwargs)))
        if self.splitting():
            module._smartlaunch_t0 = self.clock.mark()

    def on_root_post(self, module, args, output):
        t0 = getattr(module, "_smartlaunch_t0", None)
        if t0 is None:
            return
        module._smartlaunch_t0 = None
        self.cur.append(("forward", t0, self.clock.mark()))
        out = first_grad_tensor(output)
        if out is not None and out.grad_fn is not None:
            try:
                out.grad_fn.register_prehook(self.on_backward_start)
            except Exception:  # some grad_fn types take no hooks; backward stays unknown
                pass

    def on_backward_start(self, grad_outputs):
        if not self.splitting():
            return
        t0 = self.clock.mark()
        rec = self

        def at_end():
            if rec.splitting():
                rec.cur.append(("backward", t0, rec.clock.mark()))

        self.torch.autograd.Variable._execution_engine.queue_callback(at_end)

    def splitting(self) -> bool:
        """Forward/backward marks are taken in the warm-up steps after the first."""
        return self.t_first_step is not None and self.t_window is None

    # ---- steps ------------------------------------------------------------------------------
    def on_optimizer_step(self, opt, args, kwargs):
        if self.primary is None:
            self.primary = opt
            self.params = [p for g in opt.param_groups for p in g["params"]]
        if opt is self.primary:
            self.on_step()

    def on_marker(self):
        if self.primary != "marker":  # a marker overrides optimizer steps: restart counting
            self.primary, self.steps, self.per_step = "marker", 0, []
            self.new_window()
        self.on_step()

    def new_window(self) -> None:
        """Forget the window and its warm-up: the next steps warm up and measure afresh."""
        self.t_window, self.closed, self.marks, self.mark_hosts = None, None, [], []
        self.read, self.window_steps = 0, []
        self.warm, self.warm_spans, self.cur = [], [], []

    def on_step(self):
        self.pass_gate()                # a script without modules: its first step waits
        self.steps += 1
        self.count_samples()
        if self.t_first_step is None:
            self.t_first_step = self.host()
            self.depth = 0
            if self.clock is None:
                self.clock = device_clock(self.torch)
            self.time_roots()
        if self.t_window is None:
            if self.warm:
                self.warm_spans.append(self.cur)
            self.warm.append(self.clock.mark())
            self.cur = []
            if self.warmed():
                self.open_window()
            if self.control is not None:
                self.control.step(self.steps, self.step0 + self.warmup + 1 + self.measure)
            return
        self.marks.append(self.clock.mark())
        n = len(self.marks) - 1
        t = self.host()
        self.mark_hosts.append(t)
        if self.control is not None:
            self.control.step(self.steps, self.goal(n, t - self.t_window))
        long_enough = t - self.t_window >= self.min_seconds
        if (n >= self.measure and (long_enough or n >= MAX_STEPS)) \
                or (self.precision and n >= PRECISE_STEPS and long_enough and self.precise()):
            self.close_window("measured")
            self.write(reason="measured")
            if not self.hold_on():
                self.exit()               # main(): the process at once (exit_now)

    def hold_on(self) -> bool:
        """Held (a trial the decision may measure again): wait at the gate for the next go, whose
        "measure" starts another window after `warmup` steps; False: no go came (the parent closed
        its end, or gave no step count), end now. Every rank gets the same go."""
        if not self.hold or self.control is None:
            return False
        _, opts = self.control.gate()
        try:
            steps = int(opts.get("measure") or 0)
        except (TypeError, ValueError):
            steps = 0
        if steps <= 0:
            return False
        self.measure, self.step0, self.written = steps, self.steps, False
        self.new_window()
        return True

    def warmed(self) -> bool:
        """The warm-up is over: `warmup` steps after the first; with a precision goal sooner,
        after 2, once the last two took the same device time (within SAME_STEP), or later, to
        twice `warmup`, while the last took COMPILE_STEP times the one before. Reads complete
        marks only."""
        past = self.steps - 1 - self.step0
        if not self.precision:
            return past >= self.warmup
        last = self._last_warm_steps()
        if last is not None:
            before, after = last
            if past >= 2 and abs(after - before) <= SAME_STEP * before:
                return True
            if self.warmup <= past < 2 * self.warmup and after > COMPILE_STEP * before:
                return False
        return past >= self.warmup

    def _last_warm_steps(self) -> tuple[float, float] | None:
        """Device times of the last two warm-up steps (after the first), when complete."""
        if len(self.warm) < 3:
            return None
        try:
            if not self.clock.done(self.warm[-1]):
                return None
            a, b, c = self.warm[-3:]
            return self.clock.seconds(a, b), self.clock.seconds(b, c)
        except Exception:   # a broken device: the plain count decides
            return None

    def precise(self) -> bool:
        """The window's mean step is known to `precision`, by the marks complete so far (no
        wait)."""
        try:
            while self.read < len(self.marks) and self.clock.done(self.marks[self.read]):
                if self.read:
                    self.window_steps.append(
                        self.clock.seconds(self.marks[self.read - 1], self.marks[self.read]))
                self.read += 1
        except Exception:   # a broken device: the step count decides
            return False
        if len(self.window_steps) < PRECISE_STEPS:
            return False
        hw = relative_half_width(self.window_steps)
        return hw is not None and hw <= self.precision

    def goal(self, n: int, spent: float) -> int:
        """Steps the dry run will have seen when the window closes (host-time estimate, for the
        display only)."""
        want = self.measure
        if self.min_seconds and spent > 0 and n > 0:
            want = max(want, n, math.ceil(n * self.min_seconds / spent))
        return self.step0 + self.warmup + 1 + min(MAX_STEPS, want)

    def open_window(self) -> None:
        for h in self.handles:            # nothing but the step hook inside the window
            h.remove()
        self.handles = []
        self.clock.sync()                 # the window starts with an empty queue
        self.t_window = self.host()
        self.marks = [self.clock.mark()]
        self.mark_hosts = [self.host()]

    def close_window(self, reason: str) -> None:
        """However the script ends: wait for the device (signal: do not, the GPU may be what hangs),
        then keep only finished marks."""
        if self.t_window is None or self.closed is not None:
            return
        self.closed = reason
        if reason != "signal":
            try:
                self.clock.sync()
            except Exception:   # a broken device (illegal access): keep only finished marks
                pass
        done = 0
        for m in self.marks:
            try:
                if not self.clock.done(m):
                    break
            except Exception:
                break
            done += 1
        self.marks = self.marks[:done]

    def count_samples(self) -> None:
        """Micro-batches and samples of the step that just ended: the grad-enabled calls of the main
        model (the root with the most of the optimizer's parameters)."""
        calls, self.calls = self.calls, []
        if self.main_root is None:
            roots = self.model_roots()
            if not roots:
                return
            main = max(roots, key=lambda m: sum(p.numel() for p in m.parameters()))
            self.main_root = id(main)
        batches = [b for mid, b in calls if mid == self.main_root]
        if not batches:
            return
        if self.micro_batch is None:
            self.micro_batch = batches[0]
        known = None if any(b is None for b in batches) else sum(batches)
        self.per_step.append((len(batches), known))

    # ---- result -----------------------------------------------------------------------------
    def model_roots(self) -> list:
        """The roots holding a parameter of the primary optimizer (all of them without one)."""
        ids = {id(p) for p in self.params}
        return [m for m in self.roots.values()
                if not ids or any(id(p) in ids for p in m.parameters())]

    def result(self) -> dict:
        torch = self.torch
        roots = self.model_roots()
        in_roots = [p for m in roots for p in m.parameters()]
        params = in_roots if self.primary == "marker" or not self.params else self.params
        trainable = unique(p for p in params if p.requires_grad)
        every = unique(list(params) + in_roots)
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
            # DDP (broadcast_buffers=True) sends rank 0's buffers at every forward.
            "buffer_bytes": sum(b.numel() * b.element_size()
                                for b in unique(b for m in roots for b in m.buffers())),
            "param_dtypes": dtypes,
            "wrapped": wrapper_name(self.roots.values()),
            "measure_asked": self.measure,
            "precise": self.closed == "measured" and len(self.marks) - 1 < self.measure,
            "peak_host_mem_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "device": "cpu",
            "reads_world_size": self.world.where,
            "gate_wait_s": self.gate_wait_s,        # the launcher's time, not the script's
        }
        r.update(self.work_per_step())
        if self.t_first_step is not None:
            # Wall-clock stamps for trial.trial_phases.
            r["wall_first_step"] = self.wall_start + self.t_first_step - self.t_start
            r["startup_s"] = self.t_first_step - self.t_start - (self.gate_wait_s or 0.0)
        r["wall_start"] = self.wall_start
        r["wall_written"] = time.time()
        r.update(self.window())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            dev = torch.cuda.current_device()
            r["device"] = f"cuda:{dev} ({torch.cuda.get_device_name(dev)})"
            r["peak_gpu_mem_bytes"] = torch.cuda.max_memory_reserved(dev)
            r["peak_gpu_mem_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        return r

    def work_per_step(self) -> dict:
        # Step 1 may hold set-up forwards (a sanity check with grad on): later steps decide.
        steps = self.per_step[1:] or self.per_step
        if not steps:
            return {"batch_size": None, "micro_batch_size": None, "micro_batches": None}
        micro = int(statistics.median_low(n for n, _ in steps))
        samples = [s for _, s in steps if s is not None]
        return {"batch_size": int(statistics.median_low(samples)) if samples else None,
                "micro_batch_size": self.micro_batch, "micro_batches": micro}

    def window(self) -> dict:
        out = {"timing": self.clock.name if self.clock else None,
               "window_cut_short": self.t_window is not None and self.closed != "measured"}
        marks = self.marks if self.closed is not None else self.marks[:1]
        out.update(read_window(self.clock, marks, self.warm, self.warm_spans,
                               self.mark_hosts[:len(marks)]))
        return out

    def write(self, reason: str = "exit") -> None:
        """reason: "measured" (we end the script), "exit" (it ended), "signal" (time limit)."""
        if self.written or not self.out:
            return
        self.written = True
        try:
            self.close_window(reason)
            data = self.result()
        except Exception as exc:  # never turn a finished run into a crash
            data = {"steps_seen": self.steps, "error": f"{type(exc).__name__}: {exc}"}
        data["reason"] = reason
        tmp = f"{self.out}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.out)
        if self.control is not None and reason == "measured":
            self.control.done()


def main(argv: list[str] | None = None) -> None:
    opts = parse(sys.argv[1:] if argv is None else argv)
    from smartlaunch.profile.control import Control
    control = Control.from_env()
    started = (time.perf_counter(), time.time())
    recs: list[Recorder] = []
    world = WorldSizeWatch(lambda: not recs or recs[0].t_first_step is None)
    world.install_environ()

    def watch(torch) -> None:
        """Once the script has imported torch: torch read its environment as the script set
        it, as in the launch (entry.after_import)."""
        recs.append(Recorder(opts["out"], opts["warmup"], opts["measure"], opts["min_seconds"],
                             control=control, exit=exit_now, gate=opts["gate"],
                             precision=opts["precision"], hold=opts["hold"], started=started,
                             world=world))
        if opts["cpu_shim"]:
            from smartlaunch.profile import cpu_shim
            cpu_shim.install()
        recs[0].install()

    after_import("torch", watch, "the dry run cannot watch this script")

    def write(reason: str = "exit") -> None:
        if recs:
            recs[0].write(reason)
        elif not os.path.exists(opts["out"]):      # torch never imported: no step, no optimizer
            tmp = f"{opts['out']}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"steps_seen": 0, "reason": reason,
                           "reads_world_size": world.where}, f)
            os.replace(tmp, opts["out"])

    atexit.register(write)  # the script ended on its own: report what was seen

    def on_term(signum, frame):
        try:
            write(reason="signal")
        except OSError:       # the parent gave up on us and removed the result directory
            pass
        sys.stdout.flush()
        os._exit(128 + signum)

    def on_interrupt(signum, frame):
        # smartlaunch passing on its Ctrl-C: abandoned, not failed (no traceback, no result).
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_interrupt)
    try:
        run_entrypoint(opts["script"], opts["args"], module=opts["module"])
    except SystemExit as end:
        code = end.code
    except BaseException as exc:    # printed as python would (its frames only), then exit 1
        sys.exit(report_uncaught(exc))
    else:
        code = 0
    finally:
        # Close the window while the script's device context is alive (not at atexit).
        if recs:
            recs[0].close_window("exit")
    # Returned or sys.exit: write, then end with the script's code without its teardown.
    write()
    exit_now(code)


if __name__ == "__main__":
    main()
