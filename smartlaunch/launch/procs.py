"""Process facts and signals for the launcher's watchdog and reaper (Linux /proc).

Ranks are process-group leaders (torch's agent starts them with start_new_session=True), so a
signal to the group reaches DataLoader workers and other children too. Stray processes of a
run are found by the SMARTLAUNCH_RUN_ID their environment carries, which catches children
that left the group (setsid) as well.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

RUN_ID_VAR = "SMARTLAUNCH_RUN_ID"


@dataclass(frozen=True)
class ProcState:
    state: str                 # /proc state letter: R S D T t Z ...; "gone" when reaped
    status: int | None = None  # waitpid()-style status of a zombie (Linux >= 3.5)

    @property
    def alive(self) -> bool:
        return self.state not in ("gone", "Z", "X")

    @property
    def exit_code(self) -> int | None:
        if self.status is None or self.status & 0x7F:
            return None
        return self.status >> 8

    @property
    def signal(self) -> int | None:
        if self.status is None:
            return None
        return (self.status & 0x7F) or None


def proc_state(pid: int) -> ProcState:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return ProcState("gone")
    fields = raw[raw.rindex(")") + 2:].split()   # the name may hold spaces and ')'
    state = fields[0]
    status = None
    if state == "Z" and len(fields) >= 50:
        status = int(fields[49])                 # field 52 of stat(5), 3 of them before this slice
    return ProcState(state, status)


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by pid (or pid alone when it leads none)."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_name(sig: int | None) -> str | None:
    if not sig:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def run_processes(run_id: str, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Live processes of this user whose environment carries our run id."""
    skip = {os.getpid(), *exclude}
    needle = f"{RUN_ID_VAR}={run_id}".encode()
    out = []
    uid = os.getuid()
    for p in psutil.process_iter(["pid", "uids"]):
        try:
            if p.info["pid"] in skip or (p.info["uids"] and p.info["uids"].real != uid):
                continue
            with open(f"/proc/{p.info['pid']}/environ", "rb") as f:
                env = f.read()
        except (OSError, psutil.Error):
            continue
        if needle in env.split(b"\0") and proc_state(p.info["pid"]).alive:
            out.append(p)
    return out


def kill_run(run_id: str, group_leaders: Iterable[int] = (), exclude: Iterable[int] = (),
             timeout_s: float = 3.0) -> list[int]:
    """SIGKILL every process of the run until none is left or timeout; returns the pids killed."""
    killed: list[int] = []
    for pid in group_leaders:
        if signal_group(pid, signal.SIGKILL):
            killed.append(pid)
    deadline = time.monotonic() + timeout_s
    while True:
        left = run_processes(run_id, exclude)
        for p in left:
            try:
                p.kill()
                killed.append(p.pid)
            except psutil.Error:
                pass
        if not left or time.monotonic() > deadline:
            return killed
        time.sleep(0.05)
