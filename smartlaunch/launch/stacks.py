"""Stack dumps of hung ranks: faulthandler in each worker (on DUMP_SIGNAL), py-spy when
installed (it also sees native frames, e.g. a rank stuck inside an NCCL kernel wait)."""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping

from smartlaunch.launch.worker import DUMP_SIGNAL, stack_path
from smartlaunch.store import open_private

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
PY_SPY_TIMEOUT_S = 10.0


def dump_all(run_dir: str, pids: Mapping[int, int], wait_s: float = 2.0) -> dict[int, str]:
    """Ask every rank (local rank -> pid) for its stacks; return local rank -> new text.
    Each also gets SIGCONT, so that a SIGSTOPped rank runs its pending dump."""
    offsets = {}
    for lr, pid in pids.items():
        path = stack_path(run_dir, lr)
        offsets[lr] = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            _to_main_thread(pid, DUMP_SIGNAL)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    pyspy = shutil.which("py-spy")
    if pyspy:
        for lr, pid in pids.items():
            _py_spy(pyspy, pid, stack_path(run_dir, lr).replace(".txt", ".py-spy.txt"))
    # complete once every rank's file has stopped growing for a moment
    deadline = time.monotonic() + wait_s
    texts: dict[int, str] = {}
    stable_since = None
    while time.monotonic() < deadline:
        now = {lr: _read_from(stack_path(run_dir, lr), offsets[lr]) for lr in pids}
        complete = all("most recent call first" in t for t in now.values())
        if complete and now == texts:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since >= 0.2:
                break
        else:
            stable_since = None
        texts = now
        time.sleep(0.05)
    return {lr: _read_from(stack_path(run_dir, lr), offsets[lr]) for lr in pids}


def _to_main_thread(pid: int, sig: int) -> None:
    """Send sig to the process's main thread (tid == pid): else another thread may dump while
    the main one runs on after SIGCONT."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    tgkill = getattr(libc, "tgkill", None)
    if tgkill is None:                       # glibc < 2.30
        os.kill(pid, sig)
        return
    if tgkill(pid, pid, sig) != 0:
        err = ctypes.get_errno()
        if err == errno.ESRCH:
            raise ProcessLookupError(pid)
        os.kill(pid, sig)


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return ""


def _py_spy(pyspy: str, pid: int, out_path: str) -> None:
    try:
        res = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=PY_SPY_TIMEOUT_S)
        text = res.stdout + res.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        text = f"py-spy dump failed: {exc}\n"
    with open_private(out_path, "a") as f:
        f.write(text)


def top_frame(dump: str) -> str | None:
    """'train.py:42 in train_step' of the main thread: faulthandler's last block."""
    lines = dump.splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith(("Current thread", "Thread"))]
    for line in lines[starts[-1] if starts else 0:]:
        m = _FRAME.match(line)
        if m:
            return f"{m['file']}:{m['line']} in {m['func']}"
    return None


def in_library(frame: str | None) -> bool:
    """Whether the frame is inside torch or another installed package, not the user's code."""
    if not frame:
        return False
    path = frame.split(":", 1)[0]
    return any(part in path for part in ("site-packages", "dist-packages", "/torch/", "/lib/python"))
