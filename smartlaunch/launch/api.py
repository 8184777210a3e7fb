"""Data types of the launch layer: what a launch ended as (`LaunchResult`), and why a rank
failed (`RankFailure`)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RunState(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"          # a worker exited non-zero or was killed
    HUNG = "hung"              # the watchdog saw no progress
    INTERRUPTED = "interrupted"  # smartlaunch got a signal and forwarded it


@dataclass(frozen=True)
class RankFailure:
    local_rank: int
    rank: int
    host: str
    pid: int | None
    exit_code: int | None      # None when killed by a signal
    signal: str | None         # "SIGKILL"
    log_tail: str = ""
    log_path: str | None = None

    def describe(self) -> str:
        how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        return f"rank {self.rank} (local {self.local_rank}, pid {self.pid}) on {self.host} failed with {how}"


@dataclass(frozen=True)
class LaunchResult:
    state: RunState
    exit_code: int
    message: str = ""                          # one line for the user, root cause first
    failures: tuple[RankFailure, ...] = ()
    details: dict = field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state != RunState.SUCCEEDED
