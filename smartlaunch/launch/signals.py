"""Forwarding the signals a launcher receives to the processes it started: all of them are
passed on (Slurm's SIGUSR1/2 early warning too); the launcher's own reaction is the caller's."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Signals after which the launcher itself must wind down; SIGUSR1/2 are only warnings.
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ignored(signum: int) -> bool:
    """Whether signum is ignored here: a signal ignored where smartlaunch started (nohup's
    SIGHUP, SIGINT of a shell script's background job) stays ignored, as python leaves it; no
    handler is put on it, so nothing is forwarded and every process started inherits the
    ignore (torchrun instead ends a nohup job when the terminal goes)."""
    return signal.getsignal(signum) == signal.SIG_IGN


@contextlib.contextmanager
def handling(signals: Iterable[int], handler) -> Iterator[None]:
    """`handler` for these signals inside the block (the main thread only: elsewhere none),
    except those ignored()."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals if not ignored(s)}
    try:
        for s in previous:
            signal.signal(s, handler)
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def stuck_main_escape(stuck: Callable[[], str | None], grace_s: float = 2.0) -> Iterator[None]:
    """Inside the block, a terminating signal still unhandled grace_s later (the main thread
    blocked in C++, where no handler runs) ends the process, exit 128+N, after one line.
    stuck(): None when the block's own handling has it in hand, else the words for what was
    being waited on. Main thread only (signal.set_wakeup_fd): elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                data = os.read(r, 64)
            except OSError:
                return
            for signum in (b for b in data if b in TERMINATING):
                if done.wait(grace_s):
                    return
                what = stuck()
                if what is not None:
                    name = signal.Signals(signum).name
                    print(f"smartlaunch: got {name} {what}; nothing was started "
                          f"(exit {128 + signum})", file=sys.stderr, flush=True)
                    os._exit(128 + signum)

    thread = threading.Thread(target=watch, name="smartlaunch-signal-escape", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(w)                 # the reader's read returns (EOF) and it ends
        thread.join(timeout=1.0)
        os.close(r)


def exit_code_for(returncode: int) -> int:
    """subprocess' -N (killed by signal N) as a shell reports it: 128+N."""
    return 128 - returncode if returncode < 0 else returncode


# The signals of a crash: faulthandler writes the Python stacks of a process they kill.
CRASHES = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")


def crash_stacks(path: str | None) -> str | None:
    """path when it holds the stacks faulthandler wrote at a crash ("Fatal Python error"),
    else None."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return path if b"Fatal Python error" in f.read(1 << 20) else None
    except OSError:
        return None


def killed_line(returncode: int, stacks: str | None = None) -> str:
    """What a shell would have printed for a script a signal killed ("Segmentation fault",
    "Killed"), as one smartlaunch line, with the crash's stacks file when there is one: under
    smartlaunch the shell sees an exit code, so it says nothing. "" for an exit, for SIGINT
    (python's KeyboardInterrupt, its traceback already printed) and SIGPIPE (shells keep
    quiet about both)."""
    if returncode >= 0 or -returncode in (signal.SIGINT, signal.SIGPIPE):
        return ""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    line = f"smartlaunch: the script was killed by {name} (exit {128 - returncode})"
    if name in CRASHES and crash_stacks(stacks):
        line += f"; its Python stacks at the crash: {stacks}"
    return line
