"""Per-rank progress records `<run_dir>/progress/local<N>.bin`: the worker hook updates its
memory-mapped file (two stores a step), the launcher's watchdog reads it. Times are
CLOCK_MONOTONIC, system-wide on Linux."""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from smartlaunch.store import mapped_record

# magic, pid, local_rank, rank, steps, t_start, t_first, t_last, exit, t_warm
_FMT = "<4siiiqdddid"
_SIZE = struct.calcsize(_FMT)
_MAGIC = b"SLP2"
_OFF_STEPS = 16
_OFF_FIRST = 32
_OFF_LAST = 40
_OFF_EXIT = 48
_OFF_WARM = 52
RUNNING = -1000             # exit field while the script runs
# A run's rate is taken from the end of this step on, past the first steps' one-time costs.
WARM_STEP = 10


def progress_path(run_dir: str | os.PathLike, local_rank: int) -> Path:
    return Path(run_dir) / "progress" / f"local{local_rank}.bin"


@dataclass(frozen=True)
class ProgressRecord:
    pid: int
    local_rank: int
    rank: int
    steps: int
    t_start: float           # worker hook started
    t_first: float           # first step ended (0.0: none yet)
    t_last: float            # latest step ended (0.0: none yet)
    exit_code: int | None    # None while running; the script's exit status once it returned
    t_warm: float = 0.0      # step WARM_STEP ended (0.0: not yet)

    def window(self) -> tuple[int, float] | None:
        """(step intervals, seconds) over which this rank's rate is measured: from the end of
        step WARM_STEP to the latest step when it got further, else from its first step;
        None before two steps."""
        if self.t_warm and self.steps > WARM_STEP and self.t_last > self.t_warm:
            return self.steps - WARM_STEP, self.t_last - self.t_warm
        if self.steps >= 2 and self.t_last > self.t_first:
            return self.steps - 1, self.t_last - self.t_first
        return None


class ProgressWriter:
    """Counts steps of one rank. `step()` is the hot path: keep it two stores."""

    def __init__(self, path: str | os.PathLike, local_rank: int, rank: int):
        self._mm = mapped_record(path, _SIZE)
        self.steps = 0
        struct.pack_into(_FMT, self._mm, 0, _MAGIC, os.getpid(), local_rank, rank, 0,
                         time.monotonic(), 0.0, 0.0, RUNNING, 0.0)

    def step(self) -> None:
        now = time.monotonic()
        self.steps += 1
        if self.steps == 1:
            struct.pack_into("<d", self._mm, _OFF_FIRST, now)
        elif self.steps == WARM_STEP:
            struct.pack_into("<d", self._mm, _OFF_WARM, now)
        struct.pack_into("<d", self._mm, _OFF_LAST, now)
        struct.pack_into("<q", self._mm, _OFF_STEPS, self.steps)

    def exited(self, code: int) -> None:
        struct.pack_into("<i", self._mm, _OFF_EXIT, int(code))


def read_record(path: str | os.PathLike, size: int, magic: bytes) -> bytes | None:
    """A whole fixed-size record a worker maps (this one, worktime.py's), or None when it is
    missing, short or not of this kind."""
    try:
        with open(path, "rb") as f:
            data = f.read(size)
    except OSError:
        return None
    return data if len(data) == size and data[:4] == magic else None


def read_progress(path: str | os.PathLike) -> ProgressRecord | None:
    data = read_record(path, _SIZE, _MAGIC)
    if data is None:
        return None
    _, pid, local_rank, rank, steps, t_start, t_first, t_last, code, t_warm = \
        struct.unpack(_FMT, data)
    return ProgressRecord(pid, local_rank, rank, steps, t_start, t_first, t_last,
                          None if code == RUNNING else code, t_warm)


def status_line(rates: dict[int, float | None], steps: dict[int, int]) -> str:
    """The live one-line display: steps/s per local rank."""
    parts = []
    for lr in sorted(steps):
        r = rates.get(lr)
        parts.append(f"r{lr} {steps[lr]} ({'--' if r is None else f'{r:.2f}'}/s)")
    return "smartlaunch: steps " + " | ".join(parts)
