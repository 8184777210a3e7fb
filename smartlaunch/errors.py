"""One exception family; each maps to a documented exit code (README: Exit codes)."""
from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys


class ExitCode(enum.IntEnum):
    OK = 0
    WORKER_FAILED = 1        # torchrun's code for a failed worker group (ChildFailedError)
    USAGE = 2                # bad command line (argparse's own code)
    POLICY = 3               # malformed or forbidden policy, or a request the admin policy refuses
    NO_GPU = 4               # no NVML / no usable GPU where one was required
    PLAN = 5                 # no plan can satisfy the request (memory, GPU count, link class)
    NO_FREE_GPU = 6          # every allowed GPU is leased or busy (--no-wait or wait timed out)
    DRY_RUN = 7              # the script failed during the dry run; it was not launched
    HANG = 8                 # a rank stopped making progress; stacks dumped (a LaunchResult)
    SLURM = 9                # inconsistent or partial Slurm environment
    HEALTH = 10              # node health check found a critical fault (prolog/epilog)
    RENDEZVOUS = 11          # a multi-node job's rendezvous timed out, was unreachable or was lost
    NODE_MISMATCH = 12       # this node's hardware differs from the one the job's plan was made for
    # 128 + N: smartlaunch (and its workers) ended by signal N, as shells report it.


class SmartlaunchError(Exception):
    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, *, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(SmartlaunchError):
    exit_code = ExitCode.USAGE


class PolicyError(SmartlaunchError):
    exit_code = ExitCode.POLICY


class TopologyError(SmartlaunchError):
    exit_code = ExitCode.NO_GPU


class PlanError(SmartlaunchError):
    exit_code = ExitCode.PLAN


class NoFreeGPUError(SmartlaunchError):
    exit_code = ExitCode.NO_FREE_GPU


class DryRunError(SmartlaunchError):
    exit_code = ExitCode.DRY_RUN
    out_of_memory = False       # its output says so (the pipeline may retry it alone)


class SlurmError(SmartlaunchError):
    exit_code = ExitCode.SLURM


class HealthError(SmartlaunchError):
    exit_code = ExitCode.HEALTH


class RendezvousError(SmartlaunchError):
    """The deciding node of a multi-node job could not be reached, or was lost."""
    exit_code = ExitCode.RENDEZVOUS


class BadValue(Exception):
    """A value read from outside that its reader (wire.Reader) does not take: `field` names
    where, `why` what is wrong; `shown(v)` names a bad value (never a stranger's text)."""

    def __init__(self, field: str, why: str, message: str):
        super().__init__(message)
        self.field, self.why = field, why

    @staticmethod
    def shown(v) -> str:
        """'a string', 'a list', 'null', 3; a long number by its length."""
        if isinstance(v, bool) or v is None:
            return {True: "true", False: "false", None: "null"}[v]
        if isinstance(v, (int, float)):
            s = repr(v)
            return s if len(s) <= 24 else f"an integer of {len(s)} digits"
        return {str: "a string", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


class WireError(BadValue, RendezvousError):
    """A value another node published is not what its reader takes: "field F: why"."""

    def __init__(self, field: str, why: str):
        super().__init__(field, why, f"field {field}: {why}" if field else why)


class NodeMismatchError(SmartlaunchError):
    exit_code = ExitCode.NODE_MISMATCH


class NodeNotNeeded(SmartlaunchError):
    """This node of a multi-node job is not used by its plan; the node exits 0."""
    exit_code = ExitCode.OK


def reader_gone() -> int:
    """The exit of a command whose stdout reader went away (`... | head`): later writes go
    to /dev/null, so none fails again at exit; 128 + SIGPIPE, as a program that SIGPIPE ended."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
