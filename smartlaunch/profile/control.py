"""The measuring child's end of its control socket (the parent's end: profile/session.py),
named by SMARTLAUNCH_CONTROL_FD (removed from the environment, not inherited). Lines of JSON:

    child -> parent   {"gate": 1}            set up: waits for its go before the first forward
                      {"step": k, "of": n}   progress (at most every STEP_EVERY_S, and the last)
                      {"done": 1}            its result is written
    parent -> child   {"go": {...}}          pass the gate, with options ({"measure": steps})

End of file at the gate (the parent closed its end) also lets it go on."""
from __future__ import annotations

import json
import os
import socket
import time

ENV_VAR = "SMARTLAUNCH_CONTROL_FD"
STEP_EVERY_S = 0.1      # a step message costs a system call: not every step of a 2 ms model


class Control:
    def __init__(self, fd: int):
        os.set_inheritable(fd, False)
        self.sock = socket.socket(fileno=fd)
        self.sent_at = 0.0

    @classmethod
    def from_env(cls, environ=os.environ) -> "Control | None":
        """This process's control end, taken out of the environment; None: not started by a
        session."""
        value = environ.pop(ENV_VAR, None)
        try:
            return cls(int(value)) if value else None
        except (ValueError, OSError):
            return None

    def send(self, **msg) -> None:
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError:          # the parent is gone or gave up on us: it kills what it wants
            pass

    def step(self, k: int, n: int) -> None:
        now = time.monotonic()
        if now - self.sent_at >= STEP_EVERY_S or k >= n:
            self.sent_at = now
            self.send(step=k, of=n)

    def gate(self) -> tuple[float, dict]:
        """Say we are set up, block until the go: (seconds waited, the go's options)."""
        t0 = time.perf_counter()
        self.send(gate=1)
        buf = b""
        while b"\n" not in buf:
            try:
                chunk = self.sock.recv(4096)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return time.perf_counter() - t0, {}
            buf += chunk
        try:
            opts = json.loads(buf.split(b"\n", 1)[0]).get("go") or {}
        except (ValueError, AttributeError):
            opts = {}
        return time.perf_counter() - t0, opts if isinstance(opts, dict) else {}

    def done(self) -> None:
        self.send(done=1)
