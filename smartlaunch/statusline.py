"""One status line on stderr while smartlaunch works before the job's output: redrawn in
place on a terminal and erased before anything else is written; elsewhere one line per stage,
repeated every `every_s` for a long stage."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

PREFIX = "smartlaunch: "
_ERASE = "\r\x1b[K"


class StatusLine:
    def __init__(self, stream=None, *, tty: bool | None = None, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            try:
                tty = self.stream.isatty()
            except (AttributeError, ValueError):
                tty = False
        self.tty = tty
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.RLock()
        self._shown = False            # a line is on the terminal, not yet erased
        self._text: str | None = None  # current stage (ticking) or None
        self._since = 0.0
        self._logged = 0.0             # non-terminal: when the stage was last written
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stage(self, text: str) -> None:
        """A new stage: drawn in place on a terminal, one line elsewhere."""
        with self._lock:
            self._text = None
            self._show(text, new_stage=True)

    def update(self, text: str) -> None:
        """Progress within a stage: redrawn on a terminal; elsewhere at most once per every_s."""
        with self._lock:
            self._show(text, new_stage=False)

    def ticking(self, text: str) -> None:
        """A stage whose line shows its elapsed seconds, redrawn once a second."""
        with self._lock:
            self.stage(text)
            self._text, self._since = text, self._clock()
            if self.tty and self._thread is None:
                self._thread = threading.Thread(target=self._tick, name="smartlaunch-status",
                                                daemon=True)
                self._thread.start()

    def progress(self, text: str) -> None:
        """Where a ticking stage has got: redrawn on a terminal; nothing elsewhere."""
        with self._lock:
            if not self.tty or self._text is None:
                return
            self._text = text
            self._show(self._timed(), new_stage=False)

    def clear(self) -> None:
        """Erase the line (terminal) and stop ticking; call before anything else is written."""
        with self._lock:
            self._text = None
            self._erase()

    def _erase(self) -> None:
        if self._shown:
            self._write(_ERASE)
            self._shown = False

    def line(self, text: str) -> None:
        """A permanent line (the decision, a warning): the status line is erased first."""
        with self._lock:
            self.clear()
            self._write(PREFIX + text + "\n")

    def close(self) -> None:
        self.clear()
        self._stop.set()

    def echo(self, binary) -> "_Echo":
        """A bytes stream for a child's stderr that erases the line before each write."""
        return _Echo(self, binary)

    def _show(self, text: str, *, new_stage: bool) -> None:
        if self.tty:
            self._write(("\r" if self._shown else _ERASE) + PREFIX + text + "\x1b[K")
            self._shown = True
            return
        now = self._clock()
        if new_stage or now - self._logged >= self.every_s:
            self._write(PREFIX + text + "\n")
            self._logged = now

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self._text is not None:
                    self._show(self._timed(), new_stage=False)

    def _timed(self) -> str:
        """The ticking stage's text with its elapsed seconds."""
        return f"{self._text} ({self._clock() - self._since:.0f} s)"

    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):
            pass        # stderr closed: the job must still run


class _Echo:
    def __init__(self, status: StatusLine, binary):
        self._status, self._binary = status, binary

    def write(self, data: bytes) -> None:
        with self._status._lock:      # ticking goes on: the next tick redraws below the text
            self._status._erase()
            self._binary.write(data)

    def flush(self) -> None:
        self._binary.flush()
