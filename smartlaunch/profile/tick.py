"""How far a measuring child has got, for the parent's status line: "k of n".

The child (the dry run, rank 0 of the all-reduce benchmark) maps a 20-byte file and stores two
integers into it: a store into the mapping per step, no system call and no print, so a dry run
that counts every optimizer step pays nothing it could measure. The parent already polls for
the child's end every 50 ms and reads the file there with one read(). A missing, short or
foreign file reads as None: the status line just keeps its stage text.
"""
from __future__ import annotations

import os
import struct

from smartlaunch.store import mapped_record

_FMT = "<4sqq"            # magic, done (k), goal (n)
_SIZE = struct.calcsize(_FMT)
_MAGIC = b"SLT1"


class TickWriter:
    """The child side. `set(k, n)` is the hot path: one store into the mapping."""

    def __init__(self, path: str | os.PathLike):
        self._mm = mapped_record(path, _SIZE, 0o600)
        struct.pack_into(_FMT, self._mm, 0, _MAGIC, 0, 0)

    def set(self, done: int, goal: int) -> None:
        struct.pack_into("<qq", self._mm, 4, done, goal)


def open_writer(path: str | None) -> TickWriter | None:
    """A writer, or None when no path was given or it cannot be made (progress is optional:
    never the reason a dry run fails)."""
    if not path:
        return None
    try:
        return TickWriter(path)
    except (OSError, ValueError):
        return None


def read_tick(path: str | os.PathLike) -> tuple[int, int] | None:
    """(k, n) as the child last stored them, or None."""
    try:
        with open(path, "rb") as f:
            data = f.read(_SIZE)
    except OSError:
        return None
    if len(data) != _SIZE or data[:4] != _MAGIC:
        return None
    _, done, goal = struct.unpack(_FMT, data)
    return done, goal


class TickWatch:
    """The parent side: calls `report(k, n)` when the child's numbers change, from its first
    count on (k >= 1: a child still starting up has nothing to show)."""

    def __init__(self, path: str | os.PathLike, report):
        self.path, self.report = path, report
        self.last: tuple[int, int] | None = None

    def poll(self) -> None:
        if self.report is None:
            return
        got = read_tick(self.path)
        if got is not None and got[0] >= 1 and got != self.last:
            self.last = got
            try:
                self.report(*got)
            except Exception:  # a display callback must not break a measurement
                pass
