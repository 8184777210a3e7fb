"""Forwarding the signals a launcher receives to the processes it started: all of them are
passed on (Slurm's SIGUSR1/2 early warning too); the launcher's own reaction is the caller's."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Signals after which the launcher itself must wind down; SIGUSR1/2 are only warnings.
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def handling(signals: Iterable[int], handler) -> Iterator[None]:
    """`handler` for these signals inside the block (the main thread only: elsewhere none)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    try:
        for s in previous:
            signal.signal(s, handler)
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def forward_signals(on_signal: Callable[[int], None]):
    """Call on_signal(signum) for each forwarded signal while inside the block."""
    return handling(FORWARDED, lambda signum, _frame: on_signal(signum))


def exit_code_for(returncode: int) -> int:
    """subprocess' -N (killed by signal N) as a shell reports it: 128+N."""
    return 128 - returncode if returncode < 0 else returncode
