"""What every suite script shares: torchrun's environment contract, the DDP wrap, the timed loop.

A suite script builds its model, its optimizer and a `make_batch(i)` on the device, then
calls `train(...)`. Timing: `--warmup` steps, then a device sync (and, under DDP, a barrier,
both outside the clock), then `--steps` steps, then a sync. Single and DDP time the same
region, so their samples/s compare directly. Rank 0 prints two lines:

    model=<name> params=<n> batch=<per-rank batch>
    throughput: samples/s=<world*batch*steps/s> per_rank=<batch*steps/s> world=<n> step_ms=<ms>

Kept next to the scripts (imported as a sibling, like nanoGPT's `from model import GPT`), so
each script still runs as plain `python script.py`, under `torchrun` and under smartlaunch.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

IMPORTED_UNIX = time.time()     # the script's own imports done, torch's included


def process_start_unix() -> float | None:
    """When this process started (/proc: boot time + its start in clock ticks; the boot time is
    whole seconds, an offset the same for every process of one boot), or None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


@dataclass(frozen=True)
class Ctx:
    rank: int
    local_rank: int
    world: int
    device: torch.device

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def parser(description: str, *, batch: int, steps: int, warmup: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--batch-size", type=int, default=batch, help="per rank, as torchrun scripts do")
    p.add_argument("--steps", type=int, default=steps, help="timed steps")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed steps first")
    p.add_argument("--tiny", action="store_true", help="a toy-sized model (CPU tests)")
    p.add_argument("--amp", choices=("bf16", "off"), default=None,
                   help="autocast dtype on CUDA (default: the script's own choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (after the DDP wrap, as torch's docs do)")
    p.add_argument("--toggle-windows", type=int, default=0,
                   help="split the timed steps into this many windows, a part of smartlaunch's "
                        "worker hook (--toggle-part) on in the even ones and off in the odd "
                        "ones; prints each window's mean step time and main-thread CPU a step")
    p.add_argument("--toggle-part", choices=("hooks", "faulthandler"), default="hooks",
                   help="--toggle-windows: what is switched: the per-step hooks (step counter, "
                        "work timer) or the stack-dump handlers (faulthandler)")
    p.add_argument("--chunks", type=int, default=0,
                   help="also print the timed window's mean step time in this many equal parts "
                        "(device events at the parts' ends only, no sync inside the window): a "
                        "window whose later steps run slower than its first shows it")
    p.add_argument("--scaling", default="",
                   help="bench/scaling.py: comma-separated world sizes (1,2,4) measured inside one "
                        "launch, in interleaved windows, ranks beyond a size idle; prints one "
                        "`scaling: {json}` line")
    p.add_argument("--scaling-rounds", type=int, default=3)
    p.add_argument("--scaling-window-s", type=float, default=1.0)
    return p


def setup() -> Ctx:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Ctx(rank, local_rank, world, device)


def autocast(ctx: Ctx, amp: str | None, default: str):
    """bf16 autocast on CUDA when asked (or the script's default); never on CPU, where
    bf16 kernels are slow enough to make the tiny CPU runs pointless."""
    if ctx.cuda and (amp or default) == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(ctx: Ctx, args, name: str, model: nn.Module, make_opt: Callable,
          make_batch: Callable[[int], tuple], loss_fn: Callable, *, amp_default: str = "off",
          accum: int = 1) -> None:
    """make_batch(i) -> (inputs, target), inputs a tuple (model(*inputs)) or a dict
    (model(**inputs), as Hugging Face models are called); loss_fn(output, target) -> scalar.
    accum > 1: that many micro-batches per optimizer step, the gradient all-reduced only on
    the last (DDP's no_sync on the others), as accumulating scripts do."""
    n_params = sum(p.numel() for p in model.parameters())
    if getattr(args, "scaling", ""):
        return scaling(ctx, args, name, model, make_opt, make_batch, loss_fn,
                       autocast(ctx, args.amp, amp_default), accum, n_params)
    if ctx.world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if ctx.cuda else None)
    if getattr(args, "compile", False):
        model = torch.compile(model)
    opt = make_opt([p for p in model.parameters() if p.requires_grad])
    amp = autocast(ctx, args.amp, amp_default)

    def micro(i: int) -> torch.Tensor:
        inputs, target = make_batch(i)
        with amp:
            out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
            loss = loss_fn(out, target) / accum
        loss.backward()
        return loss

    def step(i: int) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        for k in range(accum - 1):
            with model.no_sync() if ctx.world > 1 else contextlib.nullcontext():
                micro(i * accum + k)
        loss = micro(i * accum + accum - 1)
        opt.step()
        return loss

    def sync() -> None:
        if ctx.cuda:
            torch.cuda.synchronize()

    loss = None
    for i in range(args.warmup):
        loss = step(i)
        if i == 0:
            sync()      # the first step's end, for the launch-to-first-step figure
            if ctx.rank == 0:       # where a launch's time to it went: process, imports, set-up
                started = process_start_unix()
                if started is not None:
                    print(f"process_start_unix={started:.3f}", flush=True)
                print(f"imported_unix={IMPORTED_UNIX:.3f}", flush=True)
                print(f"first_step_unix={time.time():.3f}", flush=True)
    sync()
    if ctx.world > 1:
        dist.barrier()      # ranks start the clock together; outside the timed region
    if baton_of(os.environ):
        baton_windows(ctx, step, sync, args.warmup, os.environ)
        args.steps = 0          # no throughput line: the windows are the measurement
    windows = getattr(args, "toggle_windows", 0)
    if windows:
        toggled_windows(ctx, args, step, sync, windows)
        args.steps = 0          # no throughput line: the windows are the measurement
    ends = chunk_ends(args.steps, getattr(args, "chunks", 0))
    marks = [mark(ctx)] if ends else []
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
        if i + 1 in ends:
            marks.append(mark(ctx))
    sync()
    seconds = time.perf_counter() - t0

    if ctx.rank == 0 and args.steps > 0:
        # batch: samples per optimizer step per rank (every micro-batch of an accumulated step)
        per_rank = args.batch_size * accum * args.steps / seconds
        extra = f" micro_batch={args.batch_size} accum={accum}" if accum > 1 else ""
        print(f"model={name} params={n_params} batch={args.batch_size * accum}{extra} "
              f"loss={float(loss.detach()):.4f}", flush=True)
        if marks:
            print("chunks: step_ms=" + ",".join(
                f"{elapsed(a, b) / (j - i) * 1e3:.3f}"
                for a, b, i, j in zip(marks, marks[1:], [0, *ends], ends)), flush=True)
        print(f"throughput: samples/s={per_rank * ctx.world:.1f} per_rank={per_rank:.1f} "
              f"world={ctx.world} step_ms={seconds / args.steps * 1e3:.3f}", flush=True)
    if ctx.world > 1:
        # A DDP wrapper still alive at teardown makes gloo ranks on torch 2.13 abort now and
        # then ("terminate called without an active exception", ~1 run in 8 on a 2-core
        # VM); freeing it first made 0 in 25.
        del step, micro, model
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def scaling(ctx: Ctx, args, name, model, make_opt, make_batch, loss_fn, amp, accum,
            n_params) -> None:
    """Single (rank 0 alone) against DDP over the whole world, in windows of about
    --scaling-window-s each, rounds in alternating order so drift favours neither: the two
    share the launch, the GPUs' state and the drift. --scaling is "1,<world>". While rank 0
    runs alone the other ranks wait on the rendezvous store: nothing runs on their GPUs.
    Rank 0 times each window between device syncs, and every step with device events (no
    sync inside the window) for the per-step spread; `host_bound`: per window, the share of
    steps whose issue on the host ended after the device had finished the step before."""
    import copy
    import json
    import sys
    sizes = [int(x) for x in str(args.scaling).split(",") if x.strip()]
    assert all(n in (1, ctx.world) for n in sizes), (sizes, ctx.world)
    store = dist.distributed_c10d._get_default_store() if ctx.world > 1 else None
    rounds_done = [0]

    def everyone() -> None:
        """A barrier on the store (no NCCL, no gloo)."""
        if store is None:
            return
        rounds_done[0] += 1
        key = f"scaling/{rounds_done[0]}"
        if store.add(key, 1) == ctx.world:
            store.set(key + "/go", "1")
        store.wait([key + "/go"])

    def say(what: str) -> None:
        print(f"scaling rank {ctx.rank}: {what}", file=sys.stderr, flush=True)

    runs = {}
    for n in sizes:
        if ctx.rank >= n:
            continue
        m = copy.deepcopy(model)
        if n > 1:
            m = nn.parallel.DistributedDataParallel(
                m, device_ids=[ctx.local_rank] if ctx.cuda else None)
        runs[n] = (m, make_opt([p for p in m.parameters() if p.requires_grad]))
    say("models ready")

    def step(n: int, i: int) -> None:
        m, opt = runs[n]
        opt.zero_grad(set_to_none=True)
        for k in range(accum):
            inputs, target = make_batch(i * accum + k)
            quiet = m.no_sync() if (n > 1 and k < accum - 1) else contextlib.nullcontext()
            with quiet:
                with amp:
                    out = m(**inputs) if isinstance(inputs, dict) else m(*inputs)
                    loss = loss_fn(out, target) / accum
                loss.backward()
        opt.step()

    def sync() -> None:
        if ctx.cuda:
            torch.cuda.synchronize()

    steps = {n: 0 for n in sizes}
    result = {n: {"window_ms": [], "step_ms": []} for n in sizes}
    at = 0
    for r in range(args.scaling_rounds + 1):          # round 0: warm-up and window sizing
        for n in (sizes if r % 2 == 0 else sizes[::-1]):
            everyone()
            if ctx.rank >= n:
                continue
            for _ in range(args.warmup if r == 0 else 3):
                step(n, at)
                at += 1
            sync()
            if n > 1:
                dist.barrier()
            count = steps[n] or 10
            marks = [mark(ctx)] if ctx.rank == 0 else []
            caught = 0      # steps whose issue ended after the device had finished the last one
            t0 = time.perf_counter()
            for _ in range(count):
                step(n, at)
                at += 1
                if ctx.rank == 0:
                    caught += ctx.cuda and marks[-1].query()
                    marks.append(mark(ctx))
            sync()
            took = time.perf_counter() - t0
            if r == 0:      # rank 0's count for every rank: DDP ranks must step alike
                want = max(10, int(args.scaling_window_s * count / took))
                if store is None:
                    steps[n] = want
                else:
                    if ctx.rank == 0:
                        store.set(f"scaling/steps/{n}", str(want))
                    steps[n] = int(store.get(f"scaling/steps/{n}"))
            elif ctx.rank == 0:
                result[n]["window_ms"].append(took / count * 1e3)
                # the share of steps the host, not the device, held up: ~1 launch-bound, ~0
                # device-bound (None on the CPU)
                result[n].setdefault("host_bound", []).append(
                    round(caught / count, 3) if ctx.cuda else None)
                result[n]["step_ms"].extend(
                    round(elapsed(a, b) * 1e3, 4) for a, b in zip(marks, marks[1:]))
        if ctx.rank == 0:
            say(f"round {r} done")
    if ctx.rank == 0:
        print("scaling: " + json.dumps({"model": name, "params": n_params,
                                        "batch": args.batch_size * accum, "world": ctx.world,
                                        "steps": steps, "sizes": result}), flush=True)
    everyone()
    if ctx.world > 1:
        runs.clear()
        gc.collect()
        dist.destroy_process_group()


def baton_of(env) -> tuple[str, int, str, float] | None:
    """BENCH_BATON=host:port/tag/window_s (bench/job_overhead.py --baton): (host, port, tag,
    window_s), or None. Never inside smartlaunch's dry run or trials (their ranks are not the
    job's and must measure as they would)."""
    spec = env.get("BENCH_BATON")
    if not spec or env.get("SMARTLAUNCH_DRYRUN_OUT") or env.get("SMARTLAUNCH_TRIAL"):
        return None
    addr, tag, window_s = spec.split("/")
    host, port = addr.rsplit(":", 1)
    return host, int(port), tag, float(window_s)


def baton_windows(ctx: Ctx, step, sync, at: int, env) -> None:
    """Timed windows handed out by an outside driver: two jobs (torchrun's, smartlaunch's) run
    at once, but only the job holding the baton steps, so the two alternate window by window
    and share the machine's drift. Every rank waits for `<tag>/go/<w>` on the driver's store
    (blocked on a socket: no CPU, nothing on the GPU), runs 3 untimed steps, a barrier, then
    the window; rank 0 stores the window's mean step time and its main thread's CPU time a step
    (what a per-step hook would add, without the machine's other waits) as `<tag>/ms/<w>`
    ("wall,cpu" in ms); the last rank done
    sets `<tag>/fin/<w>`. `end` as the go value ends the loop. Window w=0 sizes the windows
    (rank 0's count, shared through the store) and is not a measurement. BENCH_PIN_CORES=a,b,..:
    local rank k's main thread runs on core k-th of them (its other threads, NCCL's, are left
    where they are), so both jobs' windows run on the same cores."""
    import datetime
    host, port, tag, window_s = baton_of(env)
    pin = env.get("BENCH_PIN_CORES")
    if pin:     # this rank's main thread on one core, the same in every job (other threads free)
        cores = [int(c) for c in pin.split(",")]
        os.sched_setaffinity(0, {cores[ctx.local_rank % len(cores)]})
    store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=900))
    if ctx.rank == 0:
        store.set(f"{tag}/world", str(ctx.world))
    if store.add(f"{tag}/ready", 1) == ctx.world:
        store.set(f"{tag}/allready", "1")
    count = 10
    w = 0
    while True:
        store.wait([f"{tag}/go/{w}"])
        if store.get(f"{tag}/go/{w}") == b"end":
            break
        for _ in range(3):
            step(at)
            at += 1
        sync()
        if ctx.world > 1:
            dist.barrier()
            sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(count):
            step(at)
            at += 1
        sync()
        took, cpu = time.perf_counter() - t0, time.thread_time() - c0
        if w == 0:
            if ctx.rank == 0:
                store.set(f"{tag}/steps", str(max(10, int(window_s * count / took))))
            count = int(store.get(f"{tag}/steps"))
        elif ctx.rank == 0:
            store.set(f"{tag}/ms/{w}", f"{took / count * 1e3:.5f},{cpu / count * 1e3:.5f}")
        if store.add(f"{tag}/done/{w}", 1) == ctx.world:
            store.set(f"{tag}/fin/{w}", "1")
        w += 1
    if ctx.rank == 0:
        print(f"baton: tag={tag} windows={w} steps={count}", flush=True)


def toggled_windows(ctx: Ctx, args, step, sync, windows: int) -> None:
    """The timed steps in `windows` windows, a part of smartlaunch's worker hook
    (args.toggle_part) on in the even ones, off in the odd ones; rank 0 prints
    `windows: hooks=... on_ms=... off_ms=... on_cpu_ms=... off_cpu_ms=...` (mean step time and
    main-thread CPU a step of each window, host clock between device syncs at the window ends,
    the same in both states)."""
    per = max(1, args.steps // windows)
    switch = (smartlaunch_faulthandler if getattr(args, "toggle_part", "hooks") == "faulthandler"
              else smartlaunch_hooks)
    on, off, on_cpu, off_cpu = [], [], [], []
    at = args.warmup
    found = False
    for w in range(windows):
        hooked = w % 2 == 0
        found = switch(hooked) or found
        sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(per):
            step(at)
            at += 1
        sync()
        (on if hooked else off).append((time.perf_counter() - t0) / per * 1e3)
        (on_cpu if hooked else off_cpu).append((time.thread_time() - c0) / per * 1e3)
    switch(True)
    if ctx.rank == 0:
        print(f"windows: hooks={'yes' if found else 'none'} on_ms="
              + ",".join(f"{x:.4f}" for x in on) + " off_ms=" + ",".join(f"{x:.4f}" for x in off)
              + " on_cpu_ms=" + ",".join(f"{x:.4f}" for x in on_cpu)
              + " off_cpu_ms=" + ",".join(f"{x:.4f}" for x in off_cpu), flush=True)


_FAULTHANDLER: dict = {"file": None, "off": False}


def smartlaunch_faulthandler(on: bool) -> bool:
    """Take away (on=False) or put back the worker hook's stack-dump handlers: faulthandler on
    fatal signals and on its dump signal, writing to the rank's stack file. Returns whether the
    hook had installed them (not under smartlaunch, or where it has no run directory: False)."""
    import faulthandler
    import signal
    run_dir = os.environ.get("SMARTLAUNCH_RUN_DIR")
    if not run_dir or not (faulthandler.is_enabled() or _FAULTHANDLER["off"]):
        return False
    dump_signal = signal.SIGRTMIN + 2           # smartlaunch.launch.worker.DUMP_SIGNAL
    if not on and not _FAULTHANDLER["off"]:
        faulthandler.unregister(dump_signal)
        faulthandler.disable()
        _FAULTHANDLER["off"] = True
    elif on and _FAULTHANDLER["off"]:
        if _FAULTHANDLER["file"] is None:
            path = os.path.join(run_dir, "stacks", f"local{os.environ.get('LOCAL_RANK', '0')}.txt")
            _FAULTHANDLER["file"] = open(path, "a")
        f = _FAULTHANDLER["file"]
        faulthandler.register(dump_signal, file=f, all_threads=True, chain=False)
        faulthandler.enable(file=f, all_threads=True)
        _FAULTHANDLER["off"] = False
    return True


_HOOKS: dict = {"found": False, "post": {}, "params": []}


def smartlaunch_hooks(on: bool) -> bool:
    """Remove (on=False) or put back everything smartlaunch's worker hook adds to a step: the
    optimizer step hooks (step counter, work timer) and the work timer's gradient hooks.
    Returns whether there were any (not under smartlaunch: none, nothing done)."""
    import sys
    if "smartlaunch.launch.worktime" not in sys.modules:
        return False
    import torch.optim.optimizer as oo
    from smartlaunch.launch.worktime import WorkTimer
    hooks = {**oo._global_optimizer_post_hooks, **_HOOKS["post"]}.values()
    timer = next((h.__self__ for h in hooks if isinstance(getattr(h, "__self__", None), WorkTimer)),
                 None)
    _HOOKS["found"] = bool(hooks)
    if not on and not _HOOKS["post"]:
        _HOOKS["post"] = dict(oo._global_optimizer_post_hooks)
        oo._global_optimizer_post_hooks.clear()
        if timer is not None:
            _HOOKS["params"] = [timer._params[pid] for pid in timer._handles]
            for h in timer._handles.values():
                h.remove()
            timer._handles.clear()
    elif on and _HOOKS["post"]:
        oo._global_optimizer_post_hooks.update(_HOOKS["post"])
        _HOOKS["post"] = {}
        if timer is not None:
            for p in _HOOKS["params"]:
                timer._handles[id(p)] = p.register_post_accumulate_grad_hook(timer._on_grad)
    return _HOOKS["found"]


def chunk_ends(steps: int, chunks: int) -> list[int]:
    """The step counts after which each of `chunks` near-equal parts of the window ends."""
    k = max(0, min(chunks, steps))
    return [round(steps * (c + 1) / k) for c in range(k)] if k else []


def mark(ctx: Ctx):
    """A point in the window: a CUDA event on the current stream (read after the closing
    sync, so the steps run free), or the host clock on CPU."""
    if ctx.cuda:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def elapsed(a, b) -> float:
    return a.elapsed_time(b) / 1e3 if hasattr(a, "elapsed_time") else b - a


def pool(n: int, make: Callable[[int], tuple]) -> Callable[[int], tuple]:
    """A few synthetic batches made once on the device, cycled: data changes from step to
    step as with a loader, but no generator kernels run inside the timed steps."""
    batches = [make(i) for i in range(n)]
    return lambda i: batches[i % n]


def classify_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.float(), target)


def need_torchvision():
    try:
        import torchvision
    except ImportError as e:
        raise SystemExit(f"{e}: this benchmark needs torchvision; install the build that "
                         "matches your torch (pip install torchvision==<matching>)") from None
    return torchvision
