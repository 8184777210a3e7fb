"""Forwarding the signals a launcher receives to the processes it started.

Slurm preemption sends SIGTERM, or SIGUSR1/SIGUSR2 as an early warning (`--signal`);
a terminal sends SIGINT/SIGHUP. All of them are passed on; what each means is the script's
business. The launcher's own reaction (grace, then SIGKILL) is the caller's.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Signals after which the launcher itself must wind down; SIGUSR1/2 are only warnings.
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def forward_signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Call on_signal(signum) for each forwarded signal while inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be installed from the main thread
        return
    previous = {s: signal.getsignal(s) for s in FORWARDED}
    try:
        for s in FORWARDED:
            signal.signal(s, lambda signum, _frame: on_signal(signum))
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def exit_code_for(returncode: int) -> int:
    """subprocess' -N (killed by signal N) as a shell reports it: 128+N."""
    return 128 - returncode if returncode < 0 else returncode
