"""The decision log: one JSON line per launch that got a plan, written when it ends, for the
admins' fleet view (launch/fleet.py; the fields: docs/fleet.md).

Writers on many processes and nodes share one file: each line is one O_APPEND write() of at
most MAX_LINE bytes under flock, so lines never interleave or tear. Every other user of the log
is a stranger: it is opened O_NOFOLLOW|O_NONBLOCK and must be a regular file, its lock is tried
for LOCK_WAIT_S only, and the report adds up only records that pass check_record. A log that
cannot be written costs the launch one line on stderr.
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import random
import shlex
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from smartlaunch.decide.api import Role
from smartlaunch.decide.plan import Plan, strategy_name
from smartlaunch.errors import SmartlaunchError

FORMAT = 1
MAX_LINE = 4000            # one write() below PIPE_BUF (4096): what O_APPEND writers rely on
MAX_COMMAND = 400          # characters of the command kept (its start)
MAX_CHECKED = 8            # measured candidates kept with their predictions
BUILT_IN_KEY = "paths.decision_log"
LOCK_WAIT_S = 1.5          # the longest a launch waits for the log's lock (any user can hold it)


def log_path(policy, environ: Mapping[str, str], *, create: bool = False) -> Path:
    """Where launches' lines go: paths.decision_log, its built-in node path only where this
    user may write there, else <cache>/decisions.jsonl (made when `create`)."""
    from smartlaunch.store import cache_root, dir_problem, private_dir
    raw = os.path.expanduser(policy.paths.decision_log)
    if policy.source_of(BUILT_IN_KEY) != "built-in":
        return Path(raw)
    parent = os.path.dirname(raw) or "."
    try:
        safe = dir_problem(os.lstat(parent)) is None    # root's (or ours), sticky if shared
    except OSError:
        safe = False
    usable = safe and os.access(parent, os.W_OK | os.X_OK) and (
        not os.path.lexists(raw) or os.access(raw, os.W_OK))
    if usable:
        return Path(raw)
    root = cache_root(policy, environ)
    return (private_dir(root) if create else root) / "decisions.jsonl"


class LogBusy(OSError):
    """The log's lock stayed taken past LOCK_WAIT_S; `holder` names who holds it."""

    def __init__(self, holder: str):
        super().__init__(errno.EWOULDBLOCK, f"locked by {holder} for over {LOCK_WAIT_S:g} s")
        self.holder = holder


def open_log(path: Path) -> tuple[int, bool]:
    """(a descriptor appending to the log, whether it can also be read). OSError when it is
    not a regular file or cannot be opened; nothing left open then."""
    flags = os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd, readable = os.open(path, os.O_RDWR | flags, 0o644), True
    except PermissionError:          # a log others may append to, not read (0622)
        fd, readable = os.open(path, os.O_WRONLY | flags, 0o644), False
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO or device, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "a FIFO, not a regular file" if stat.S_ISFIFO(mode)
                          else "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, readable


def _lock(fd: int) -> None:
    """flock LOCK_EX, retried without blocking until LOCK_WAIT_S (any user can hold it);
    LogBusy naming the holder then."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                from smartlaunch.store import flock_holder
                raise LogBusy(flock_holder(fd)) from None
            time.sleep(0.01 + 0.02 * random.random())


def append_line(path: Path, line: bytes) -> None:
    """Append one line (at most MAX_LINE bytes) in a single write(), starting with a newline
    when the file may not end with one. OSError (LogBusy when its lock stays taken) when it
    cannot be written whole; nothing of it stays then."""
    if len(line) > MAX_LINE or not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise ValueError(f"a decision log line must be one line of at most {MAX_LINE} bytes")
    fd, readable = open_log(path)
    try:
        _lock(fd)                           # released by close()
        size = os.fstat(fd).st_size
        if size and (not readable or os.pread(fd, 1, size - 1) != b"\n"):
            line = b"\n" + line
        written = os.write(fd, line)
        if written != len(line):            # a full disk takes part of it: take it back
            os.ftruncate(fd, size)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    finally:
        os.close(fd)


MAX_SECONDS = 1e10          # ~300 years: a longer time or GPU-seconds figure is not a launch's
MAX_SPEEDUP = 1e4


def _finite(x, lo: float, hi: float, *, null: bool = False) -> bool:
    if x is None:
        return null
    return isinstance(x, (int, float)) and not isinstance(x, bool) and \
        math.isfinite(x) and lo <= x <= hi


def _speedup(x) -> bool:
    return _finite(x, 0.0, MAX_SPEEDUP) and x != 0


def check_record(rec) -> bool:
    """Whether a parsed line is a record the report may add up: format 1, every field it
    reads of its type and in range (one NaN or 1e300 must not poison the totals)."""
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        return False
    decided, torchrun = rec.get("decided"), rec.get("torchrun")
    checked, code = rec.get("checked", []), rec.get("exit_code")
    return all((
        all(_finite(rec.get(k), 0.0, MAX_SECONDS) for k in ("wall_s", "run_s", "gpu_s")),
        _finite(rec.get("measure_gpu_s"), 0.0, MAX_SECONDS, null=True),   # older lines: absent
        code is None or (isinstance(code, int) and not isinstance(code, bool)
                         and 0 <= code <= 255),
        isinstance(decided, dict) and isinstance(decided.get("strategy", ""), str),
        isinstance(torchrun, dict) and _finite(torchrun.get("gpu_s"), 0.0, MAX_SECONDS,
                                               null=True),
        _finite(rec.get("band"), 0.0, MAX_SPEEDUP, null=True),
        isinstance(checked, list) and len(checked) <= MAX_CHECKED and all(
            isinstance(row, list) and len(row) == 3 and isinstance(row[0], str)
            and _speedup(row[1]) and _speedup(row[2]) for row in checked),
        all(isinstance(rec.get(k), (str, type(None))) for k in ("time", "user", "host",
                                                                  "command")),
        isinstance(rec.get("job"), (str, int, type(None))),
    ))


def read_log(path: Path) -> tuple[list[dict], int]:
    """(the records that pass check_record, in file order; how many non-blank lines were
    skipped). OSError when the file cannot be read or is not a regular file."""
    records, bad = [], 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        while raw := f.readline(MAX_LINE + 1):
            if len(raw) > MAX_LINE:                 # no newline within MAX_LINE bytes
                bad += 1
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(1 << 16)       # the rest of it, unparsed, unkept
                continue
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                rec = None
            if check_record(rec):
                records.append(rec)
            else:
                bad += 1
    return records, bad


def _say(line: str) -> None:
    print(f"smartlaunch: {line}", file=sys.stderr, flush=True)


@dataclass
class LaunchRecord:
    """One launch's line: `began(plan)` when the job starts on the GPUs really taken,
    `close(exit_code)` writes the line, once."""
    plan: Plan
    request: object
    units: Mapping
    path: Path | None
    environ: Mapping[str, str]
    say: Callable[[str], None] = _say
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    began_at: float | None = None
    ran: Plan | None = None
    written: bool = False

    @classmethod
    def open(cls, plan: Plan, request, policy, units, environ: Mapping[str, str],
             say: Callable[[str], None] = _say) -> "LaunchRecord":
        """Find the log and check it opens; one that cannot is said now and not tried again."""
        rec = cls(plan, request, units, None, environ, say)
        path = policy.paths.decision_log
        try:
            path = log_path(policy, environ, create=True)
            os.close(open_log(path)[0])
            rec.path = path
        except OSError as exc:
            rec._failed(path, exc.strerror or str(exc))
        except SmartlaunchError as exc:     # the node's path is not ours, nor is the cache
            rec._failed(path, f"not writable by you, nor its fallback in the cache directory: "
                              f"{exc}")
        return rec

    def began(self, plan: Plan) -> None:
        if self.began_at is None:
            self.began_at = time.monotonic()
        self.ran = plan

    def close(self, exit_code: int) -> None:
        if self.written:
            return
        self.written = True
        if self.path is None:
            return
        now = time.monotonic()
        try:
            data = record(self.plan, self.request, self.units, environ=self.environ,
                          started=self.started_wall, wall_s=now - self.started,
                          run_s=now - self.began_at if self.began_at is not None else 0.0,
                          exit_code=exit_code, ran=self.ran)
            append_line(self.path, encode(data))
        except OSError as exc:
            self._failed(self.path, exc.strerror or str(exc))
        except Exception as exc:      # the job's exit code is never the log's to change
            self._failed(self.path, f"{type(exc).__name__}: {exc}")

    def _failed(self, path, why: str) -> None:
        self.path = None
        self.say(f"decision log {path} not written ({why}); the launch goes on")


def exit_code_of(exc: BaseException) -> int:
    """The exit code smartlaunch's main gives for an exception that ends a launch."""
    if isinstance(exc, SmartlaunchError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return 128 + 2
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    return 1


def encode(data: dict) -> bytes:
    """One line of at most MAX_LINE bytes: the measured candidates, then the command, are
    shortened if it would be longer."""
    for cut in (dict, lambda d: dict(d, checked=d.get("checked", [])[:2]),
                lambda d: dict(d, command=d["command"][:80] + "…")):
        data = cut(data)
        line = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        if len(line.encode()) < MAX_LINE:
            break
    return (line + "\n").encode()


def record(plan: Plan, request, units: Mapping, *, environ: Mapping[str, str], started: float,
           wall_s: float, run_s: float, exit_code: int, ran: Plan | None = None) -> dict:
    """The line's fields (docs/fleet.md). ran: the plan as the job started; None if it never did."""
    final = ran or plan
    gpus = list(final.gpus) if final.device == "cuda" else []
    run_s = max(0.0, run_s) if ran is not None else 0.0
    chosen = next((c for c in plan.candidates if c.chosen), None)
    predicted = measured = None
    if chosen is not None:
        predicted = chosen.model_speedup if chosen.measured else chosen.speedup
        measured = chosen.speedup if chosen.measured else None
    checked = [[_name(units, c), _r(c.model_speedup), _r(c.speedup)] for c in plan.candidates
               if c.measured and c.model_speedup and c.speedup
               and _role(units, c.strategy) != Role.BASELINE][:MAX_CHECKED]
    command = shlex.join(request.worker_command())
    held_s = len(gpus) * run_s
    measure_s = measurement_gpu_seconds(plan)
    torchrun_s, basis = torchrun_gpu_seconds(plan, units, run_s, held_s)
    return {
        "format": FORMAT,
        "time": datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "user": _user(environ), "uid": os.getuid(),
        "job": environ.get("SLURM_JOB_ID") or None,
        "command": command if len(command) <= MAX_COMMAND else command[:MAX_COMMAND] + "…",
        "cwd": os.getcwd()[-200:],
        "asked": {"strategy": request.strategy, "nproc": request.max_gpus,
                  "gpus_allowed": plan.requested_max,
                  "visible": environ.get("CUDA_VISIBLE_DEVICES"),
                  "variants": len(request.variants)},
        "decided": {"strategy": strategy_name(plan.strategy), "world_size": plan.nproc_per_node,
                    "gpus": gpus, "device": plan.device, "forced": plan.forced},
        "predicted_speedup": _r(predicted), "measured_speedup": _r(measured),
        "band": plan.uncertainty_band, "checked": checked,
        "exit_code": exit_code, "wall_s": round(wall_s, 3), "run_s": round(run_s, 3),
        "gpu_s": round(held_s + measure_s, 3), "measure_gpu_s": round(measure_s, 3),
        "torchrun": {"gpus": plan.requested_max if plan.device == "cuda" else 0,
                     "gpu_s": None if torchrun_s is None else round(torchrun_s, 3),
                     "basis": basis},
    }


def measurement_gpu_seconds(plan: Plan) -> float:
    """GPU-seconds the decision's measurements took on this node: timings["measure_gpu_s"]
    as the driver counted it, else estimated from the stages' seconds in plan.timings and the
    GPUs each occupied (docs/fleet.md). 0 on the CPU and for a plan across nodes."""
    t = plan.timings
    if plan.device != "cuda" or plan.multi_node or not t:
        return 0.0
    exact = t.get("measure_gpu_s")             # counted by the driver as it measured
    if isinstance(exact, (int, float)) and math.isfinite(exact) and exact >= 0:
        return float(exact)

    def secs(key: str) -> float:
        v = t.get(key)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else 0.0
    comm = plan.comm
    measured = len(comm.derived_from or comm.gpus) if comm is not None else 0
    groups = [len(c.gpus) for c in plan.candidates if len(c.gpus) > 1] or [measured]
    tried = [len(c.gpus) for c in plan.candidates if c.measured and c.gpus] or [max(groups)]
    dry = secs("profile") if plan.profile is not None and not plan.profile.cached else 0.0
    early = secs("allreduce_early")
    later = max(0.0, secs("allreduce") - max(0.0, early - dry))   # less the wait for `early`
    return (dry + early * (measured or max(groups)) - min(dry, early)
            + later * sum(groups) / len(groups) + secs("trials") * sum(tried) / len(tried))


def torchrun_gpu_seconds(plan: Plan, units: Mapping, run_s: float,
                         gpu_s: float) -> tuple[float | None, str]:
    """(GPU-seconds torchrun's DDP over all `requested_max` GPUs would have taken for this
    launch's work, how that is known); None where a rate was not measured. gpu_s: ours."""
    n = plan.requested_max
    if plan.device != "cuda" or not plan.gpus:
        return None, "no GPUs"
    if plan.variants:
        return None, "variants: torchrun runs one job at a time"
    chosen = next((c for c in plan.candidates if c.chosen), None)
    if chosen is None:
        return None, "no chosen candidate"

    def is_torchruns(c) -> bool:
        role = _role(units, c.strategy)
        if n == 1:
            return role == Role.BASELINE and len(c.gpus) == 1
        return bool(getattr(units.get(c.strategy), "TORCHRUN", False)) and len(c.gpus) == n
    if is_torchruns(chosen):
        return gpu_s, "the same plan"
    theirs = next((c for c in plan.candidates if is_torchruns(c)), None)
    name = f"DDP×{n}" if n > 1 else "one GPU"
    if theirs is None or not (theirs.measured and theirs.speedup):
        return None, f"torchrun's {name} not measured"
    if not (chosen.measured and chosen.speedup):
        return None, "the chosen plan's rate not measured"
    return n * run_s * chosen.speedup / theirs.speedup, "measured"


def mispredicted(rec: Mapping) -> tuple[float, list] | None:
    """(how far out in units of the band's reach, the worst [candidate, predicted, measured])
    when |ln(measured / predicted)| > ln(1 + band) for a candidate; None otherwise."""
    band = rec.get("band")
    if not isinstance(band, (int, float)) or band <= 0:
        return None
    reach = math.log1p(band)
    worst = None
    for row in rec.get("checked") or ():
        try:
            name, p, m = row
            err = abs(math.log(float(m) / float(p)))
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if err > reach and (worst is None or err / reach > worst[0]):
            worst = (err / reach, [name, p, m])
    return worst


def iter_since(records: list[dict], since: datetime | None) -> Iterator[dict]:
    for rec in records:
        if since is None:
            yield rec
            continue
        try:
            t = datetime.fromisoformat(rec["time"])
        except (KeyError, TypeError, ValueError):
            continue
        if t.tzinfo is None:
            t = t.astimezone()
        if t >= since:
            yield rec


def _name(units, c) -> str:
    short = getattr(units.get(c.strategy), "short_name", None)
    return short(c) if short is not None else f"{strategy_name(c.strategy)}×{len(c.gpus)}"


def _role(units, strategy):
    return getattr(units.get(strategy), "ROLE", None)


def _r(x):
    return None if x is None else round(float(x), 4)


def _user(environ) -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return environ.get("USER") or str(os.getuid())
