"""Data types of the launch layer: what a launch ended as (`LaunchResult`), why a rank
failed (`RankFailure`), the `Launcher` protocol every strategy's launcher implements and the
`LaunchContext` it gets beside the Plan."""
from __future__ import annotations

import argparse
import enum
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from smartlaunch.decide.plan import Plan
from smartlaunch.errors import NoFreeGPUError
from smartlaunch.policy.api import Policy
from smartlaunch.topology.api import Topology

log = logging.getLogger(__name__)


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

    @classmethod
    def not_started(cls, sig: int) -> "LaunchResult":
        """Signal `sig` came before any worker started (while waiting for GPUs): 128+N."""
        return cls(RunState.INTERRUPTED, 128 + sig,
                   f"smartlaunch: got {signal.Signals(sig).name} while waiting for GPUs; "
                   f"nothing was started (exit {128 + sig})")


class Launcher(Protocol):
    """One strategy's launcher, built from `(plan, ctx)`; `run_loop.run` drives it.

    start()       take the GPUs (`ctx.hold`), call `ctx.begin(plan)`, start the workers.
    poll()        None while workers run, then the LaunchResult; it may block (DDP's agent).
    forward(sig)  from the signal handler: pass it on, never block; a terminating one ends
                  the run.
    close(sig)    `sig` to every live worker, SIGKILL after ctx.signal_grace_s; idempotent,
                  returns once none is left. The leases are ctx's: run_loop gives them back.
    """

    def start(self) -> None: ...

    def poll(self) -> LaunchResult | None: ...

    def forward(self, signum: int) -> None: ...

    def close(self, sig: int) -> None: ...


def _say(line: str) -> None:
    print(f"smartlaunch: {line}", file=sys.stderr, flush=True)


@dataclass
class LaunchContext:
    """What launchers need besides the Plan: the environment, GPU leases, the policy and the
    callbacks of the command that launched them."""
    policy: Policy
    topology: Topology
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    torchrun_args: argparse.Namespace | None = field(default=None, repr=False)
    quiet: bool = False
    status: Any = None         # statusline.StatusLine a waiting launch redraws; None: log lines
    announce: Callable[[Plan], None] = lambda plan: None   # GPUs held, job about to start
    # after a run: its rate (not kept when the third argument names others on its GPUs)
    record: Callable[..., None] = lambda plan, run_dir, shared=None: None
    say: Callable[[str], None] = _say                  # one "smartlaunch: ..." line on stderr
    # Terminating signals received, appended by run_loop's handler; a lease wait ends on one.
    signals: list[int] = field(default_factory=list)
    log_root: str | None = None          # where run directories go; None: launch.log_dir
    _leases: Any = field(default=None, repr=False)
    _held: list = field(default_factory=list, repr=False)   # the Leases held now, for close()

    @property
    def signal_grace_s(self) -> float:
        return self.policy.launch.signal_grace_s

    @property
    def log_dir(self) -> str:
        if self.log_root is not None:
            return self.log_root
        from smartlaunch.store import log_root
        return str(log_root(self.policy, self.environ))

    def cancelled(self) -> bool:
        return bool(self.signals)

    @property
    def held(self) -> tuple:
        """The Leases this launch holds now, each with at least one GPU."""
        return tuple(self._held)

    def leases(self):
        """The lease directory, opened on first use; run_loop.run closes it."""
        if self._leases is None:
            from smartlaunch.launch.leases import LeaseManager
            self._leases = LeaseManager.from_policy(self.policy, say=self.say)
        return self._leases

    def hold(self, plan: Plan, count: int):
        """`count` of the plan's GPUs (then its fallback GPUs) as one Lease, waiting as the plan
        says; NoFreeGPUError otherwise. Given back by close()."""
        status = self.status
        lease = self.leases().acquire(
            self.topology, [*plan.gpus, *plan.fallback_gpus], count, wait=plan.wait_for_lease,
            timeout_s=plan.wait_timeout_s, cancel=self.cancelled,
            status=self.say if status is None else None,
            progress=status.update if status is not None else None)
        log.debug("leased GPU(s) %s", lease.gpus)
        self._keep(lease)
        if status is not None:
            status.clear()
        return lease

    def try_hold(self, gpus: tuple[int, ...], count: int):
        """`count` of `gpus` as one Lease if free now, else None; given back by close()."""
        lease = self.leases().try_acquire(self.topology, gpus, count)
        if lease is not None:
            self._keep(lease)
        return lease

    def _keep(self, lease) -> None:
        lease.on_empty = self._drop
        self._held.append(lease)

    def _drop(self, lease) -> None:
        if lease in self._held:
            self._held.remove(lease)

    def begin(self, plan: Plan) -> None:
        """The GPUs are held: announce the plan; NoFreeGPUError if a terminating signal came."""
        if self.cancelled():
            raise NoFreeGPUError(f"got {signal.Signals(self.signals[0]).name} before the "
                                 "workers started")
        self.announce(plan)

    def new_run_dir(self) -> str:
        """A new private (mkdtemp) directory `<time>-<random>` in launch.log_dir, its basename
        the run id; PolicyError when launch.log_dir cannot be made or fails store.dir_problem."""
        from smartlaunch.errors import PolicyError
        from smartlaunch.store import dir_problem, unsafe_dir_message
        key = "launch.log_dir"
        where = f"{key}={self.log_dir} ({self.policy.source_of(key)})"
        try:
            os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
            why = dir_problem(os.lstat(self.log_dir))
            if why is None:
                return tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=self.log_dir)
        except OSError as e:      # changed since the pipeline checked it
            raise PolicyError(f"{where}: cannot create a run directory in {self.log_dir} "
                              f"({e.strerror}); set {key} to a directory you can write") from None
        raise PolicyError(unsafe_dir_message(where, self.log_dir, why, key))

    def close(self) -> None:
        """Give back every lease this launch took, once, then the lease directory."""
        for lease in reversed(self._held[:]):
            lease.release()             # drops itself from the list
        self._held.clear()
        if self._leases is not None:
            self._leases.close()
            self._leases = None


def context(request, policy, topology, *, environ: Mapping[str, str] = os.environ,
            status=None, announce: Callable | None = None, log_dir: str | None = None):
    """The LaunchContext of one command line. log_dir: where run directories go (None:
    launch.log_dir)."""
    def record(plan, run_dir, shared=None) -> None:   # the rate that ran, for the next plan
        from smartlaunch.launch.measured import record_launch
        record_launch(plan, request, policy, topology, run_dir, environ=environ, shared=shared)
    return LaunchContext(policy, topology, environ=environ,
                         torchrun_args=request.torchrun_args,
                         quiet=request.quiet or policy.launch.quiet, status=status,
                         announce=announce or (lambda plan: None), record=record,
                         log_root=log_dir)
