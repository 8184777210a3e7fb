"""The one door to Slurm's commands: argument lists, `shell=False`, a timeout on every call
(client commands block while slurmctld is down); the runner is injectable."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence

from smartlaunch.errors import SlurmError

DEFAULT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


# runner(argv, timeout_s) -> Completed; raises TimeoutError or FileNotFoundError.
Runner = Callable[[Sequence[str], float], Completed]


def subprocess_runner(argv: Sequence[str], timeout_s: float, cwd: str | None = None) -> Completed:
    """cwd: where the command runs (scontrol writes a resized job's env scripts there)."""
    try:
        cp = subprocess.run(list(argv), shell=False, capture_output=True, text=True,
                            timeout=timeout_s, stdin=subprocess.DEVNULL, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(str(exc)) from None
    return Completed(tuple(argv), cp.returncode, cp.stdout, cp.stderr)


def available(program: str) -> bool:
    return shutil.which(program) is not None


def run_slurm(argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
              runner: Runner | None = None, check: bool = True) -> Completed:
    """Run one Slurm client command; SlurmError (exit 9) on timeout, absence or failure."""
    argv = [str(a) for a in argv]
    shown = " ".join(argv)
    try:
        done = (runner or subprocess_runner)(argv, timeout_s)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` not found: install Slurm's client commands "
                         f"(Debian: slurm-client) or put them on PATH") from None
    except TimeoutError:
        raise SlurmError(f"`{shown}` did not answer within {timeout_s:g} s: check that "
                         f"slurmctld is up (`scontrol ping`)") from None
    if check and done.returncode != 0:
        raise SlurmError(f"`{shown}` failed with exit code {done.returncode}: "
                         f"{_one_line(done.stderr or done.stdout)!r}; fix the Slurm setup or "
                         f"give the value on the command line")
    return done


def unparsable(argv: Sequence[str], text: str, what: str) -> SlurmError:
    """The error for output a parser could not read: the output itself is quoted."""
    return SlurmError(f"could not read {what} from `{' '.join(argv)}` output "
                      f"{_one_line(text)!r}; report this Slurm version's output format")


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[:limit] + "..."
