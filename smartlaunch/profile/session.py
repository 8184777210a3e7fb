"""One owner for every process a decision starts: the dry run, trials' ranks, benchmark ranks.

The pipeline opens one Session per command and closes it: whatever it started and did not see
end is ended then, its temp dirs removed. A Stage is the processes started together for one
measurement, each rank with its own control socket (profile/control.py) and a state:

    started -> at its gate -> running -> done        (rank 0 wrote its result)
                                      \\-> ended      (every process exited: `code`)
                                       \\-> killed    (by the session: `why`)

A held stage (dryrun --hold) goes from done back to its gate; `again` starts its next window,
`release` ends it.

`wait(until, timeout)` is the one event loop: control sockets, each child's exit (a pidfd) and
piped stderr as they come, and the rules the pipeline added (early.py), until `until()` holds."""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import tempfile
import time
from enum import Enum
from typing import Callable

from smartlaunch import proc
from smartlaunch.profile.control import ENV_VAR

TICK_S = 0.1             # the loop wakes at least this often for time-based rules
STOP_GRACE_S = 5.0       # SIGTERM -> SIGKILL; above a trial group's own grace for its ranks


class State(str, Enum):
    STARTED = "started"
    AT_GATE = "at its gate"
    RUNNING = "running"
    DONE = "done"
    ENDED = "ended"
    KILLED = "killed"


class Rank:
    def __init__(self, sock: socket.socket, state: State):
        self.sock, self.state, self.step, self.buf = sock, state, (0, 0), b""
        self.results = 0                   # results written ("done"; a held rank writes more)


class Stage:
    """role: what it measures, for rules and messages ("the dry run", "a trial", ...)."""

    def __init__(self, role: str):
        self.role = role
        self.children: list[proc.Child] = []
        self.ranks: list[Rank] = []
        self.why = ""                      # why it was killed
        self.code: int | None = None       # set when every process has exited
        self.t_start = time.monotonic()
        self.t_end: float | None = None    # when it was over
        self.t_gate: float | None = None   # when every rank had come to its gate
        self.on_step: Callable[[int, int], None] | None = None   # rank 0's progress

    @property
    def state(self) -> State:
        if self.why:
            return State.KILLED
        if self.code is not None:
            return State.ENDED
        states = {r.state for r in self.ranks}
        if self.ranks and self.ranks[0].state == State.DONE:
            return State.DONE
        if states == {State.AT_GATE}:
            return State.AT_GATE
        return State.STARTED if states <= {State.STARTED, State.AT_GATE} else State.RUNNING

    @property
    def over(self) -> bool:
        return self.state in (State.ENDED, State.KILLED)

    @property
    def results(self) -> int:
        """Results rank 0 has written: one, or one per window of a held stage."""
        return self.ranks[0].results if self.ranks else 0

    def steps_done(self) -> int:
        """Steps every rank has reached (the slowest rank's count)."""
        return min((r.step[0] for r in self.ranks), default=0)

    def _message(self, rank: Rank, msg: dict) -> None:
        if "gate" in msg:
            rank.state = State.AT_GATE
            if self.t_gate is None and all(r.state == State.AT_GATE for r in self.ranks):
                self.t_gate = time.monotonic()
        elif "step" in msg:
            rank.step = (int(msg.get("step") or 0), int(msg.get("of") or 0))
            if rank is self.ranks[0] and self.on_step is not None:
                try:
                    self.on_step(*rank.step)
                except Exception:         # a display callback must not end a measurement
                    pass
        elif "done" in msg:
            rank.state = State.DONE
            rank.results += 1


class Session:
    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.stages: list[Stage] = []
        self.rules: list[Callable[[], None]] = []
        self.dirs: list[str] = []
        self.made: list[str] = []          # compile caches made for the sandbox (made_cache)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def made_cache(self, path: str) -> None:
        """A compile cache made for the sandbox (sandbox.compile_caches): removed at close if
        nothing was compiled into it, kept otherwise (the launch finds what the dry run
        compiled); the same by the guard if we die first (another job of this user may be
        compiling into it)."""
        self.made.append(path)
        proc.remove_on_exit(path, only_empty=True)

    def tempdir(self, prefix: str) -> str:
        """A temp dir removed at close (and by the guard if we die first)."""
        path = tempfile.mkdtemp(prefix=prefix)
        proc.remove_on_exit(path)
        self.dirs.append(path)
        return path

    def start(self, role: str, commands: list[tuple[list[str], dict, dict]], *,
              ranks: int = 1, gate: bool = False) -> Stage:
        """commands: (argv, env, popen options) per process, each given `ranks` control sockets
        (SMARTLAUNCH_CONTROL_FD: one descriptor, or a comma list a spawner hands out one per rank;
        ranks=0: none). gate: the processes stop at their gate until `go`."""
        stage = Stage(role)
        self.stages.append(stage)
        for argv, env, popen in commands:
            pairs = [socket.socketpair() for _ in range(ranks)]
            fds = [theirs.fileno() for _, theirs in pairs]
            if fds:
                env = {**env, ENV_VAR: ",".join(map(str, fds))}
            try:
                child = proc.spawn(argv, env=env, **{
                    **popen, "pass_fds": (*fds, *popen.get("pass_fds", ()))})
            except BaseException:
                for mine, theirs in pairs:
                    mine.close()
                    theirs.close()
                raise
            for mine, theirs in pairs:
                theirs.close()
                rank = Rank(mine, State.STARTED if gate else State.RUNNING)
                stage.ranks.append(rank)
                self.sel.register(mine, selectors.EVENT_READ, (self._read, stage, rank))
            stage.children.append(child)
            try:
                pidfd = os.pidfd_open(child.pid)
                self.sel.register(pidfd, selectors.EVENT_READ, (self._exited, stage, child))
            except (AttributeError, OSError):
                pass                       # no pidfd: the loop's tick sees the exit
        return stage

    def pipe(self, stream, handler: Callable[[bytes], None]) -> None:
        """handler(data) for what comes on `stream` (a child's stderr), b"" once at its end."""
        os.set_blocking(stream.fileno(), False)
        self.sel.register(stream, selectors.EVENT_READ, (self._pipe, stream, handler))

    def go(self, stage: Stage, **options) -> None:
        """Every rank of `stage` passes its gate (one waiting there, or one still on its way)."""
        _send_go([r for r in stage.ranks if r.state in (State.STARTED, State.AT_GATE)], options)

    def again(self, stage: Stage, **options) -> None:
        """Every rank of a held `stage` (dryrun --hold) measures another window: the go reaches
        each at its gate, or waits in its socket for a rank still on its way there."""
        _send_go(stage.ranks, options)

    def release(self, stage: Stage) -> None:
        """Close our end of each rank's control socket: a held rank ends on its own (exit 0)."""
        for rank in stage.ranks:
            try:
                self.sel.unregister(rank.sock)
            except (KeyError, ValueError):
                pass
            _close(rank.sock)

    def wait(self, until: Callable[[], bool], timeout: float | None = None) -> bool:
        """Serve every process until `until()` holds (True) or `timeout` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            for rule in list(self.rules):
                rule()
            if until():
                return True
            left = TICK_S if end is None else min(TICK_S, end - time.monotonic())
            if left <= 0:
                return False
            for key, _ in self.sel.select(left):
                fn, *args = key.data
                fn(key, *args)
            for stage in self.stages:      # exits a missing pidfd would not report
                if stage.code is None and all(c.returncode is not None for c in stage.children):
                    self._ended(stage)

    def kill(self, stage: Stage, why: str, first: int = signal.SIGKILL,
             grace_s: float = 0.0) -> None:
        """End `stage` now (first, then SIGKILL after grace_s), remembering why."""
        if stage.over:
            return
        stage.why, stage.t_end = why, time.monotonic()
        proc.stop_all(stage.children, first, grace_s)

    def close(self) -> None:
        """End what still runs (SIGTERM, STOP_GRACE_S, SIGKILL), release every descriptor, remove
        the temp dirs. Safe to call twice."""
        live = [s for s in self.stages if not s.over]   # the others were reaped as they ended
        proc.stop_all([c for s in live for c in s.children], signal.SIGTERM, STOP_GRACE_S)
        for s in live:
            s.why = "the decision no longer needed it"
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            _close(key.fileobj)
        self.stages, self.rules = [], []
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
            proc.remove_on_exit(d, done=True)
        for d in self.made:
            with contextlib.suppress(OSError):
                os.rmdir(d)                # nothing compiled into it: as if never made
            proc.remove_on_exit(d, done=True, only_empty=True)
        self.dirs, self.made = [], []

    # ---- events ---------------------------------------------------------------------------
    def _read(self, key, stage: Stage, rank: Rank) -> None:
        try:
            data = rank.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(rank.sock)
            return
        rank.buf += data
        *lines, rank.buf = rank.buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                stage._message(rank, msg)

    def _exited(self, key, stage: Stage, child: proc.Child) -> None:
        self.sel.unregister(key.fileobj)
        os.close(key.fileobj)
        child.wait(0)
        if stage.code is None and all(c.returncode is not None for c in stage.children):
            self._ended(stage)

    def _ended(self, stage: Stage) -> None:
        codes = [c.returncode for c in stage.children]
        stage.code = next((c for c in codes if c), 0)
        stage.t_end = stage.t_end or time.monotonic()
        for c in stage.children:
            c.reap()                       # what the leader left behind (loader workers)

    def _pipe(self, key, stream, handler) -> None:
        try:
            data = os.read(stream.fileno(), 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(stream)
            _close(stream)
        try:
            handler(data)
        except Exception:
            pass


@contextlib.contextmanager
def owned(session: Session | None):
    """`session`, or one of our own closed on the way out."""
    if session is not None:
        yield session
        return
    with Session() as own:
        yield own


def _send_go(ranks: list[Rank], options: dict) -> None:
    line = json.dumps({"go": options}).encode() + b"\n"
    for rank in ranks:
        rank.state = State.RUNNING
        try:
            rank.sock.sendall(line)
        except OSError:            # it died: its exit says so
            pass


def _close(obj) -> None:
    try:
        obj.close() if hasattr(obj, "close") else os.close(obj)
    except OSError:
        pass
