"""Per-rank work time: the part of each step a rank spends working, not waiting for the others
(under synchronous DDP step rates are equal; the fast ranks wait inside the all-reduce).

Per optimizer step: from the end of the previous one to the end of this step's last backward,
before DDP's final all-reduce wait (our autograd callback is queued at the first gradient, so
it runs first). Timed with CUDA events on the compute stream on GPUs, the host clock on CPU.
The worker keeps two running totals in `<run_dir>/progress/work<N>.bin` (mmap).
"""
from __future__ import annotations

import os
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from smartlaunch.launch.progress import read_record
from smartlaunch.store import mapped_record

_FMT = "<4s4xqdq"           # magic, pad, timed steps, work seconds (sum), device kind (0 cpu, 1 cuda)
_SIZE = struct.calcsize(_FMT)
_MAGIC = b"SLW1"
_OFF_N, _OFF_SUM, _OFF_DEVICE = 8, 16, 24
_MAX_PENDING = 256          # CUDA event pairs not yet passed by the GPU (bounded if it never syncs)
# At most one step is timed per this many seconds: CUDA events stay far below 1% of fast steps.
SAMPLE_S = 0.05
CANDIDATES = 4              # parameters hooked to find the first gradient (see _hook_params)


def work_path(run_dir: str | os.PathLike, local_rank: int) -> Path:
    return Path(run_dir) / "progress" / f"work{local_rank}.bin"


@dataclass(frozen=True)
class WorkRecord:
    steps: int               # steps with a work time
    work_s: float            # their total work time
    device: str              # "cuda" (CUDA events) or "cpu" (host clock)


class WorkWriter:
    def __init__(self, path: str | os.PathLike):
        self._mm = mapped_record(path, _SIZE)
        self.steps, self.total = 0, 0.0
        struct.pack_into(_FMT, self._mm, 0, _MAGIC, 0, 0.0, 0)

    def device(self, kind: str) -> None:
        struct.pack_into("<q", self._mm, _OFF_DEVICE, 1 if kind == "cuda" else 0)

    def add(self, seconds: float) -> None:
        # sum before count: a reader in between errs by one step in hundreds
        self.steps += 1
        self.total += seconds
        struct.pack_into("<d", self._mm, _OFF_SUM, self.total)
        struct.pack_into("<q", self._mm, _OFF_N, self.steps)


def read_work(path: str | os.PathLike) -> WorkRecord | None:
    data = read_record(path, _SIZE, _MAGIC)
    if data is None:
        return None
    _, n, total, kind = struct.unpack(_FMT, data)
    return WorkRecord(n, total, "cuda" if kind == 1 else "cpu")


class WorkTimer:
    """Optimizer-step and gradient hooks that feed a WorkWriter: one per process."""

    def __init__(self, writer: WorkWriter, every_s: float = SAMPLE_S):
        """every_s: time the next step when this long has passed since the last timed one
        began (0: every step)."""
        self._w = writer
        self._every_s = every_s
        self._last_timed = float("-inf")
        self._hooked: set[int] = set()          # optimizers whose parameters we hooked
        self._params: dict[int, object] = {}    # id -> parameter, of those optimizers
        self._handles: dict[int, object] = {}   # id -> its gradient hook, while it has one
        self._first = None                      # the parameter whose gradient came first
        self._trim = True                       # one hook once the first is known (below)
        self._start = None                      # end of the previous optimizer step
        self._end = None                        # end of the latest backward of this step
        self._armed = False                     # backward-end callback queued for this pass
        self._cuda = None                       # device of the first CUDA parameter seen
        self._pending: deque = deque()
        self._off = False
        self._steps = 0                         # optimizer steps seen

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self._off:
            return
        self._steps += 1
        try:
            if id(optimizer) not in self._hooked:
                self._hook_params(optimizer)
            if self._start is not None and self._end is not None:
                self._pending.append((self._start, self._end))
                self._keep_first()
            elif self._start is not None and len(self._handles) < len(self._params):
                self._rehook()                  # the one kept saw no gradient this step
            now = time.monotonic()
            timed = now - self._last_timed >= self._every_s    # the next step is one to time
            if timed:
                self._last_timed = now
            self._start, self._end = (self._mark() if timed else None), None
            if self._pending:
                self._drain()
        except Exception as exc:      # a diagnosis must never break the user's training
            self._disable(exc)

    def _hook_params(self, optimizer) -> None:
        self._hooked.add(id(optimizer))
        new = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) in self._params or not getattr(p, "requires_grad", False):
                    continue
                if self._cuda is None and p.is_cuda:
                    self._cuda = p.device
                    self._w.device("cuda")
                self._params[id(p)] = p
                new.append(p)
        half = CANDIDATES // 2
        for p in {id(p): p for p in (*new[:half], *new[-half:])}.values():
            self._handles[id(p)] = p.register_post_accumulate_grad_hook(self._on_grad)

    # A hooked parameter costs a call per step even once its hook is removed, so only the first
    # and last CANDIDATES / 2 are hooked (the layer nearest the loss is among them). After a
    # timed step only the one whose gradient came first keeps its hook; a step in which it saw
    # none hooks them all, for good.
    def _keep_first(self) -> None:
        if not self._trim or self._first is None or len(self._handles) <= 1:
            return
        for pid in [k for k in self._handles if k != self._first]:
            self._handles.pop(pid).remove()

    def _rehook(self) -> None:
        self._trim = False
        for pid, p in self._params.items():
            if pid not in self._handles:
                self._handles[pid] = p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, param) -> None:
        if self._armed or self._off or self._start is None:    # not a step being timed
            return
        self._armed = True
        if self._first is None:
            self._first = id(param)
        try:
            from torch.autograd import Variable
            Variable._execution_engine.queue_callback(self._backward_done)
        except Exception as exc:
            self._disable(exc)

    def _backward_done(self) -> None:
        self._armed = False
        if self._start is not None and not self._off:
            try:
                self._end = self._mark()
            except Exception as exc:
                self._disable(exc)

    def _disable(self, exc: Exception) -> None:
        self._off = True
        print(f"smartlaunch: work timing off for this rank ({exc!r}); straggler detection falls "
              f"back to step rates", file=sys.stderr, flush=True)

    def _mark(self):
        if self._cuda is None:
            return time.monotonic()
        import torch
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self._cuda))
        return ev

    def _drain(self) -> None:
        while self._pending:
            start, end = self._pending[0]
            if isinstance(start, float) != isinstance(end, float):
                seconds = None                  # the first CUDA parameter appeared mid-step
            elif isinstance(end, float):
                seconds = end - start
            elif end.query():
                seconds = start.elapsed_time(end) / 1000.0
            elif len(self._pending) > _MAX_PENDING:
                seconds = None                  # never synced: drop the oldest, keep bounded
            else:
                return
            self._pending.popleft()
            if seconds is not None and seconds >= 0:
                self._w.add(seconds)


def install(run_dir: str, local_rank: int) -> WorkTimer:
    """A timer writing to the rank's work record; its `_after_step` is the optimizer step
    post hook the caller registers (the worker hook: once the script imports torch.optim)."""
    return WorkTimer(WorkWriter(work_path(run_dir, local_rank)))
