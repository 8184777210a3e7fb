"""Spawn a child tree, bound it in time, end it, and make sure it never outlives smartlaunch.

`spawn()` starts a child in its own session (one group `Child.stop()` ends as a whole);
`stop_all()` is the one stop with a grace. Every spawned child is registered with this
process's guard (`python -m smartlaunch.guard`), which SIGKILLs every registered group and
every process carrying our GUARD_VAR tag when we die. Run-id sweeps find strays that left a
rank's group by the SMARTLAUNCH_RUN_ID their environment carries.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # imported where used: the worker hook imports this module in every rank
    import psutil

RUN_ID_VAR = "SMARTLAUNCH_RUN_ID"
GUARD_VAR = "SMARTLAUNCH_GUARD"    # tag of every process spawn() started, for the guard's sweep
OUTPUT_COPIER = "sl-output-copy"   # process name of a rank's stdout/stderr copier (15 bytes max)
_PR_SET_NAME, _PR_GET_NAME = 15, 16


def python_m(module: str, python: str | None = None,
             flags: tuple[str, ...] = ()) -> list[str]:
    """argv running `module` of this package with python (this interpreter by default) in the
    user's current directory. -P (Python 3.11+): the directory is not put on sys.path, so a
    `smartlaunch` folder planted there (a shared /tmp) is never what gets imported; the script
    gets its own sys.path[0] from entry.run_entrypoint, as under python."""
    python = python or sys.executable
    safe = ["-P"] if python == sys.executable and sys.version_info >= (3, 11) else []
    return [python, *flags, *safe, "-m", module]


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


def signal_process(pid: int, sig: int) -> bool:
    """sig to one process; False when it is gone or not ours."""
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by pid (or pid alone when it leads none)."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return signal_process(pid, sig)


def signal_name(sig: int | None) -> str | None:
    if not sig:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def describe_exit(code: int) -> str:
    """A Popen return code in words: "exited with code 3", "was killed by SIGKILL"."""
    return f"exited with code {code}" if code >= 0 else f"was killed by {signal_name(-code)}"


def _environ(pid: int) -> list[bytes]:
    """The process's environment entries; [] where it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _ours(exclude: Iterable[int], match: Callable[[list[bytes]], bool]) -> list[psutil.Process]:
    """Live processes of this user (not this one, not `exclude`) whose environment matches."""
    import psutil
    skip, uid = {os.getpid(), *exclude}, os.getuid()
    return [p for p in psutil.process_iter(["pid", "uids"])
            if p.info["pid"] not in skip and not (p.info["uids"] and p.info["uids"].real != uid)
            and match(_environ(p.info["pid"])) and proc_state(p.info["pid"]).alive]


def run_processes(run_id: str, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Live processes of this user whose environment carries our run id."""
    needle = f"{RUN_ID_VAR}={run_id}".encode()
    return _ours(exclude, lambda env: needle in env)


@contextlib.contextmanager
def naming_output_copiers():
    """Processes forked inside this block are named OUTPUT_COPIER from their first instant
    (a fork copies the thread's name), so kill_run's drain never misses one."""
    old, me = _thread_name(), os.getpid()
    _set_thread_name(OUTPUT_COPIER.encode())
    try:
        yield
    finally:
        if old is not None and os.getpid() == me:     # the child leaves the block named
            _set_thread_name(old)


def prctl(option: int, arg) -> int:
    """Linux prctl(2) with one argument; -1 where libc or the call is not available."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        return -1


def _thread_name() -> bytes | None:
    import ctypes
    buf = ctypes.create_string_buffer(16)
    return buf.value if prctl(_PR_GET_NAME, buf) == 0 else None


def _set_thread_name(name: bytes) -> None:
    prctl(_PR_SET_NAME, name)


def _is_output_copier(p: psutil.Process) -> bool:
    import psutil
    try:
        return p.name() == OUTPUT_COPIER
    except psutil.Error:
        return False


def kill_run(run_id: str, group_leaders: Iterable[int] = (), exclude: Iterable[int] = (),
             timeout_s: float = 3.0, drain_s: float = 0.0) -> list[int]:
    """SIGKILL every process of the run until none is left and each has finished exiting, or
    timeout; returns the pids killed. drain_s: the output copiers are spared that long, to write
    what is left and exit."""
    import psutil
    killed: list[int] = []
    for pid in group_leaders:
        if signal_group(pid, signal.SIGKILL):
            killed.append(pid)
    now = time.monotonic()
    drain_until, deadline = now + drain_s, now + max(timeout_s, drain_s)
    while True:
        left = run_processes(run_id, exclude)
        draining = time.monotonic() < drain_until
        for p in left:
            if draining and _is_output_copier(p):
                continue
            try:
                p.kill()
                killed.append(p.pid)
            except psutil.Error:
                pass
        if not left and not _exiting(killed) or time.monotonic() > deadline:
            return killed
        time.sleep(0.05)


def _exiting(pids: Iterable[int]) -> list[int]:
    """Of the pids we killed, those still running their exit: a process whose memory is being
    torn down no longer shows its environment, but holds its files (a GPU's context among them)
    until it is a zombie."""
    return [pid for pid in dict.fromkeys(pids) if proc_state(pid).alive]


def process_tagged(pid: int, prefix: bytes) -> bool:
    return any(e.startswith(prefix) for e in _environ(pid))


def kill_tagged(var: str, value: str, exclude: Iterable[int] = (),
                timeout_s: float = 1.5) -> list[int]:
    """SIGKILL every live process of this user whose environment holds var=value*, and wait
    (within timeout_s) until each has finished exiting."""
    needle = f"{var}={value}".encode()
    killed, deadline = [], time.monotonic() + timeout_s
    while True:
        left = [p.pid for p in _ours(exclude, lambda env: any(e.startswith(needle) for e in env))]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        if not left and not _exiting(killed) or time.monotonic() > deadline:
            return killed
        time.sleep(0.02)


class _Guard:
    """Client side of `python -m smartlaunch.guard` (protocol in that module)."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k != GUARD_VAR}
        # Under a spawned child the tag extends the child's own, so prefix sweeps find ours.
        self.tag = f"{os.environ.get(GUARD_VAR, '')}{os.getpid()}-{time.time_ns()}"
        self.spawned = 0
        self.proc = subprocess.Popen([*python_m("smartlaunch.guard"), self.tag],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                                     start_new_session=True)

    def send(self, op: str, arg: object) -> None:
        try:
            self.proc.stdin.write(f"{op} {arg}\n".encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass


# One guard per smartlaunch process (keyed by pid: a forked child must start its own).
_guards: dict[int, _Guard] = {}
_spawn_lock = threading.Lock()


def guard() -> _Guard:
    g = _guards.get(os.getpid())
    if g is None or g.proc.poll() is not None:
        g = _guards[os.getpid()] = _Guard()
    return g


def guard_tag(name: str) -> str:
    """A GUARD_VAR value for processes we do not spawn() ourselves (torch's agent's ranks)."""
    return f"{guard().tag}-{name}-"


def remove_on_exit(path: str, *, done: bool = False, only_empty: bool = False) -> None:
    """The guard deletes `path` (a temp dir) if we die before `remove_on_exit(path, done=True)`;
    only_empty: only if nothing is in it then (a directory others may write into too)."""
    op = "e" if only_empty else "p"
    guard().send(("-" if done else "+") + op, os.fsencode(path).hex())


class Child:
    """A spawned process tree: its session's leader and the group it leads."""

    def __init__(self, proc: subprocess.Popen, tag: str, stage: str | None = None):
        self.proc, self.pid, self.tag, self.stage = proc, proc.pid, tag, stage

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def send(self, sig: int) -> None:
        """sig to the whole group (the leader and what it forked)."""
        signal_group(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """The leader's return code, or None when it still runs after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, first: int = signal.SIGTERM, grace_s: float = 3.0) -> int:
        """stop_all for this child; returns the leader's return code."""
        stop_all((self,), first, grace_s)
        return self.proc.returncode

    def reap(self) -> None:
        """The leader exited: SIGKILL the rest of its group and stop guarding it."""
        signal_group(self.pid, signal.SIGKILL)
        kill_tagged(GUARD_VAR, self.tag, timeout_s=1.0)
        guard().send("-g", self.pid)

    def __enter__(self) -> "Child":
        self._previous = _catch_termination()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # A signal to us is passed on as torchrun does; any other way out ends the tree.
        first = exc.signum if isinstance(exc, Signalled) else \
            signal.SIGINT if exc_type is KeyboardInterrupt else signal.SIGTERM
        try:
            self.stop(first)
        finally:
            _restore(self._previous)
        if self.stage and (exc_type is KeyboardInterrupt or isinstance(exc, Signalled)):
            raise Interrupted(first, self.stage) from None


def stop_all(children: Iterable[Child], first: int = signal.SIGTERM, grace_s: float = 3.0) -> None:
    """`first` to every live child's group at once, SIGKILL to each still running grace_s
    later, then every child waited for and reaped."""
    children = list(children)
    live = [c for c in children if c.returncode is None]
    for c in live:
        c.send(first)
    deadline = time.monotonic() + grace_s
    for c in live:
        if c.wait(max(0.0, deadline - time.monotonic())) is None:
            c.send(signal.SIGKILL)
    for c in children:
        c.proc.wait()
        c.reap()


class Signalled(SystemExit):
    """SIGTERM/SIGHUP inside a `with spawn(...)` block; exits 128+N."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


class Interrupted(Signalled):
    """A signal to smartlaunch ended the measurement `stage` ("the dry run"); exits 128+N."""

    def __init__(self, signum: int, stage: str):
        super().__init__(signum)
        self.stage = stage

    def line(self) -> str:
        return (f"interrupted ({signal_name(self.signum)}) during {self.stage}; "
                f"nothing was launched")


def _raise_signalled(signum, _frame):
    raise Signalled(signum)


def _catch_termination() -> dict:
    """SIGTERM/SIGHUP raise Signalled from here on (main thread only); the previous handlers."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(s) != signal.SIG_IGN:    # nohup's SIGHUP stays ignored
                previous[s] = signal.signal(s, _raise_signalled)
    return previous


def _restore(previous: dict) -> None:
    for s, h in previous.items():
        signal.signal(s, h)


@contextlib.contextmanager
def stage(name: str):
    """Ctrl-C, SIGTERM or SIGHUP in the block raise Interrupted(name)."""
    previous = _catch_termination()
    try:
        yield
    except (KeyboardInterrupt, Signalled) as exc:
        if isinstance(exc, Interrupted):
            raise
        raise Interrupted(getattr(exc, "signum", signal.SIGINT), name) from None
    finally:
        _restore(previous)


def spawn(argv: list[str], *, env: dict[str, str] | None = None, stage: str | None = None,
          **popen) -> Child:
    """Start argv in its own session, guarded. stage: what the child measures; a signal to us
    in `with spawn(...)` raises Interrupted(stage) once the child has ended."""
    g = guard()
    with _spawn_lock:       # spawns may come from threads (the launch's monitors)
        g.spawned += 1
        tag = f"{g.tag}-{g.spawned}-"     # the trailing dash: child 1 must not match child 10
    env = dict(os.environ if env is None else env)
    env[GUARD_VAR] = tag
    popen.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(argv, env=env, start_new_session=True, **popen)
    g.send("+g", proc.pid)
    return Child(proc, tag, stage)
