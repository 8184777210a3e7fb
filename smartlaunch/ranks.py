"""Local ranks started together, as torchrun's agent starts them, without the agent.

The one place smartlaunch starts N cooperating ranks of its own modules: the all-reduce
benchmark and the node calibration (profile/comm.py `run_ranks`) and a trial's ranks
(profile/trial_group.py). Each rank is a `proc.spawn` child (its own session, guarded). One
rank failing ends the others; `stop_all` passes a signal to every rank's group, then SIGKILLs
what is left after the grace.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from smartlaunch import proc


@dataclass
class Rank:
    child: proc.Child
    log: str | None            # the file its output goes to; None: this process's own


def start_ranks(module: str, argvs: list[list[str]], envs: list[dict[str, str]], *,
                logs: list[str | None] | None = None, fds: list[int] | None = None,
                python: str = sys.executable) -> list[Rank]:
    """Rank r runs `python -m module argvs[r]` with exactly envs[r]. logs[r]: its output file
    (None: inherit ours). fds[r]: a descriptor it inherits (its control socket)."""
    ranks: list[Rank] = []
    try:
        for r, (argv, env) in enumerate(zip(argvs, envs)):
            path = logs[r] if logs else None
            out = open(path, "ab") if path else None
            try:
                child = proc.spawn([python, "-m", module, *argv], env=env, stdout=out,
                                   stderr=subprocess.STDOUT if out else None,
                                   pass_fds=(fds[r],) if fds else ())
            finally:
                if out is not None:
                    out.close()
            ranks.append(Rank(child, path))
    except BaseException:
        stop_all(ranks, signal.SIGKILL, 0)
        raise
    return ranks


def wait_all(ranks: list[Rank], limit: float) -> tuple[int, str] | None:
    """None when every rank exited 0; else (rank, reason) of the first failure. Waits on each
    rank's pidfd (woken by an exit, not a poll); a signal to us interrupts it as any wait."""
    deadline = time.monotonic() + limit
    fds: dict[int, int] = {}
    try:
        while True:
            codes = [r.child.returncode for r in ranks]
            for rank, code in enumerate(codes):
                if code not in (None, 0):
                    return rank, describe(code)
            if all(c == 0 for c in codes):
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                rank = next(r for r, c in enumerate(codes) if c is None)
                return rank, f"did not finish within {limit:g} s"
            live = [r.child.pid for r, c in zip(ranks, codes) if c is None]
            for pid in live:
                if pid not in fds:
                    fds[pid] = _pidfd(pid)
            waitable = [fds[p] for p in live if fds[p] >= 0]
            if len(waitable) < len(live):     # no pidfd for one: look again shortly
                left = min(left, 0.05)
            select.select(waitable, [], [], min(left, 3600.0))
    finally:
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)


def _pidfd(pid: int) -> int:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):   # gone already (poll sees it), or no pidfd here
        return -1


def describe(code: int) -> str:
    return f"exited with code {code}" if code >= 0 else \
        f"was killed by {proc.signal_name(-code)}"


def stop_all(ranks: list[Rank], first: int = signal.SIGTERM, grace_s: float = 3.0) -> None:
    """`first` to every rank's group at once (torchrun's agent signals all its workers, so
    each one's hooks write what they measured), SIGKILL after grace_s, then reap each."""
    live = [r.child for r in ranks if r.child.returncode is None]
    for c in live:
        c.send(first)
    deadline = time.monotonic() + grace_s
    for c in live:
        c.wait(max(0.0, deadline - time.monotonic()))
    for r in ranks:
        r.child.stop(signal.SIGKILL, 0)


def tail(rank: Rank, lines: int = 5) -> list[str]:
    if not rank.log or not os.path.exists(rank.log):
        return []
    with open(rank.log, "rb") as f:
        f.seek(max(0, os.path.getsize(rank.log) - 8192))
        return f.read().decode(errors="replace").strip().splitlines()[-lines:]
