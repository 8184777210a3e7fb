"""Data types of the profile layer: `ModelProfile` (the dry run, profile/dryrun.py) and `CommCurve`
(an all-reduce benchmark over a GPU group, profile/comm.py)."""
from __future__ import annotations

import bisect
import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from smartlaunch.store import (
    MAX_ITEMS, MAX_SECONDS, BadRecord, flag, integer, items, number, obj, optional, required,
    text,
)
from smartlaunch.wire import RECORD


class ProfileStatus(str, enum.Enum):
    OK = "ok"                   # steps measured
    NO_STEP = "no_step"         # ran, but no optimizer step seen within the time limit
    ENDED = "ended"             # ended on its own, exit 0, before a step could be measured
    INCOMPLETE = "incomplete"   # fewer measured steps than asked; numbers present but noisy
    SKIPPED = "skipped"         # not profiled (--no-python, forced strategy, ...)
    CRASHED = "crashed"         # the script failed; never launched
    UNMEASURABLE = "unmeasurable"   # failed before its first step after reading WORLD_SIZE


_MEASURED = (ProfileStatus.OK, ProfileStatus.INCOMPLETE)     # the statuses with a step time


@dataclass(frozen=True)
class ModelProfile:
    status: ProfileStatus
    note: str = ""                               # one sentence, shown by --explain
    total_params: int = 0
    trainable_params: int = 0
    param_dtypes: dict[str, int] = field(default_factory=dict)   # dtype -> element count
    grad_bytes: int = 0                          # bytes DDP would all-reduce per step
    num_grad_tensors: int = 0
    buffer_bytes: int = 0                        # module buffers DDP broadcasts every forward
    batch_size: int | None = None                # samples per optimizer step, all micro-batches
    micro_batch_size: int | None = None          # batch of one forward call
    micro_batches: int | None = None             # forward calls of the model per optimizer step
    reads_world_size: str | None = None          # "train.py:89 (reads WORLD_SIZE)"
    wrapped: str | None = None                   # "DDP", "FSDP" when the script wraps itself
    # Times: device time over the measurement window (clock.py), never host intervals.
    step_time_s: float | None = None             # window / steps in it
    step_time_p90_s: float | None = None
    step_time_ci: float | None = None            # the mean step's 95% half-width / the mean
    backward_s: float | None = None              # per step, all micro-batches
    forward_s: float | None = None
    optimizer_s: float | None = None             # last backward end -> step end
    host_slack_s: float | None = None            # how far the host runs ahead of the device at a
                                                 # step end (clock.read_window); 0: launch-bound
    steps_measured: int = 0                      # steps the window held
    window_s: float | None = None
    window_cut_short: bool = False               # the script ended before the window's goal
    timing: str | None = None                    # "cuda events" | "host clock"
    peak_gpu_mem_bytes: int | None = None
    peak_host_mem_bytes: int | None = None
    startup_s: float | None = None               # script start -> first step, less gate_wait_s
    gate_wait_s: float | None = None             # first forward held at its gate (early.py)
    dry_run_s: float | None = None               # total cost of the dry run
    device: str = "cpu"                          # "cuda:0 (<GPU model>)" or "cpu"
    exit_code: int | None = None                 # the script's, when it crashed
    error_tail: str = ""                         # last lines of its stderr, when it crashed
    cached: bool = False

    @property
    def usable(self) -> bool:
        return self.status in _MEASURED and bool(self.step_time_s)

    @property
    def low_confidence(self) -> bool:
        """Times from a window the script cut short, or too few steps."""
        return self.window_cut_short or self.status == ProfileStatus.INCOMPLETE

    @property
    def work_depends_on_world_size(self) -> bool:
        """The script read the world size before its first step AND accumulates micro-batches
        (nanoGPT's accumulation //= WORLD_SIZE): its per-rank work under DDP is not the profiled
        work. Reading it alone does not count."""
        return bool(self.reads_world_size) and (self.micro_batches or 1) > 1

    def trial_rate(self, min_steps: int, min_seconds: float,
                   precision: float = 0.0) -> float | None:
        """samples/s of the window, counted as a trial counts it, when the window is as good as a
        trial's (complete, at least min_seconds, and min_steps or a mean known to `precision`);
        None: a trial must measure it."""
        if self.status != ProfileStatus.OK or self.window_cut_short or not self.step_time_s:
            return None
        window = self.window_s or self.steps_measured * self.step_time_s
        precise = self.step_time_ci is not None and self.step_time_ci <= precision
        if (self.steps_measured < min_steps and not precise) or window < min_seconds:
            return None
        return self.samples_per_s

    @property
    def samples_per_s(self) -> float | None:
        """One GPU's samples/s by the dry run (batch unknown: 1); None without a step time."""
        return (self.batch_size or 1) / self.step_time_s if self.usable else None

    @property
    def backward_share(self) -> float | None:
        if self.backward_s and self.step_time_s:
            return min(1.0, self.backward_s / self.step_time_s)
        return None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelProfile":
        """The profile to_dict wrote (unknown keys ignored, absent ones at their defaults), every
        field checked: BadRecord naming the first of the wrong type or out of range."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in obj(d, RECORD).items() if k in names}
        status = required(d, "status")
        try:
            d["status"] = ProfileStatus(status)
        except ValueError:
            raise BadRecord("status", f"{status!r} is not a profile status") from None
        for k in _COUNTS:
            if k in d:
                d[k] = integer(d[k], k, 0)
        for k in _OPTIONAL_COUNTS:
            d[k] = optional(integer, d.get(k), k, 0)
        d["exit_code"] = optional(integer, d.get("exit_code"), "exit_code", -255, 1 << 16)
        for k in _POSITIVE_TIMES:
            d[k] = optional(number, d.get(k), k, hi=MAX_SECONDS, positive=True)
        for k in _TIMES:
            d[k] = optional(number, d.get(k), k, 0.0, MAX_SECONDS)
        d["step_time_ci"] = optional(number, d.get("step_time_ci"), "step_time_ci", 0.0, 100.0)
        # Set-up less the gate wait: near 0, either side of it.
        d["startup_s"] = optional(number, d.get("startup_s"), "startup_s", -MAX_SECONDS,
                                  MAX_SECONDS)
        for k in ("note", "error_tail", "device"):
            if k in d:
                d[k] = text(d[k], k)
        for k in ("timing", "reads_world_size", "wrapped"):
            d[k] = optional(text, d.get(k), k)
        for k in ("window_cut_short", "cached"):
            if k in d:
                d[k] = flag(d[k], k)
        d["param_dtypes"] = {text(k, "param_dtypes", 64): integer(v, f"param_dtypes.{k}", 0)
                             for k, v in obj(d.get("param_dtypes", {}), "param_dtypes", 64).items()}
        if d["status"] in _MEASURED and d.get("step_time_s") is None:
            raise BadRecord("step_time_s", f"missing from a profile with status "
                                           f"{d['status'].value}")
        window, run = d.get("window_s"), d.get("dry_run_s")
        if window is not None and run is not None and window > run * 1.05 + 1.0:
            raise BadRecord("window_s", f"{window:g} s, longer than the dry run's {run:g} s")
        return cls(**d)


@dataclass(frozen=True)
class CommCurve:
    """All-reduce time over one GPU group, in the environment the job runs with. points: (bytes,
    seconds) sorted by size; linear between points, the alpha-beta fit outside. derived_from: for a
    curve carried from another group (`for_group`), that group's GPUs."""
    world_size: int
    backend: str                                 # "nccl" or "gloo"
    points: tuple[tuple[int, float], ...]
    latency_s: float
    bandwidth_Bps: float                         # algorithm bandwidth of the fit
    env: dict[str, str] = field(default_factory=dict)   # NCCL_* in effect when measured
    gpus: tuple[int, ...] = ()
    cached: bool = False
    derived_from: tuple[int, ...] = ()

    def time(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        pts = self.points
        if len(pts) >= 2 and pts[0][0] <= nbytes <= pts[-1][0]:
            sizes = [p[0] for p in pts]
            i = bisect.bisect_left(sizes, nbytes)
            if sizes[i] == nbytes:
                return pts[i][1]
            (x0, y0), (x1, y1) = pts[i - 1], pts[i]
            return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)
        return self.latency_s + nbytes / self.bandwidth_Bps

    def bus_bandwidth_Bps(self, nbytes: int) -> float:
        """nccl-tests' busbw: algbw * 2(n-1)/n, comparable across group sizes."""
        n = self.world_size
        return nbytes / self.time(nbytes) * 2 * (n - 1) / n

    def for_group(self, gpus) -> "CommCurve":
        """This curve carried to the group `gpus`, whose every link is like this group's.
        Bus bandwidth is the same for every n, the latency is kept:
            t_n(S) = t_m(S) - (1 - r) x max(0, t_m(S) - latency),  r = ((n-1)/n) / ((m-1)/m)"""
        gpus = tuple(gpus)
        m, n = self.world_size, len(gpus)
        r = ((n - 1) / n) / ((m - 1) / m)
        pts = [(s, t - (1.0 - r) * max(0.0, t - self.latency_s)) for s, t in self.points]
        return CommCurve.from_points(n, self.backend, pts, env=dict(self.env), gpus=gpus,
                                     cached=self.cached,
                                     derived_from=self.derived_from or self.gpus)

    @staticmethod
    def fit(points) -> tuple[float, float]:
        """Least-squares latency + bytes/bandwidth over the points (latency clamped >= 0)."""
        xs = [float(p[0]) for p in points]
        ys = [float(p[1]) for p in points]
        n = len(xs)
        if n == 1:
            return 0.0, xs[0] / ys[0]
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        slope = max(slope, 1e-15)
        return max(0.0, my - slope * mx), 1.0 / slope

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["points"] = [list(p) for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CommCurve":
        """The curve to_dict wrote, checked: BadRecord naming the first field of the wrong type or
        out of range."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in obj(d, RECORD).items() if k in names}
        d["world_size"] = integer(required(d, "world_size"), "world_size", 1, MAX_ITEMS)
        d["backend"] = text(required(d, "backend"), "backend", 32)
        points = []
        for i, p in enumerate(items(required(d, "points"), "points", 256)):
            pair = items(p, f"points[{i}]", 2)
            if len(pair) != 2:
                raise BadRecord(f"points[{i}]", f"{len(pair)} values, not [bytes, seconds]")
            size = integer(pair[0], f"points[{i}][0]", 1)
            if points and size <= points[-1][0]:
                raise BadRecord(f"points[{i}][0]", f"{size} bytes after {points[-1][0]}: "
                                                   f"sizes out of order")
            points.append((size, number(pair[1], f"points[{i}][1]", hi=MAX_SECONDS,
                                        positive=True)))
        if not points:
            raise BadRecord("points", "no points")
        d["points"] = tuple(points)
        d["latency_s"] = number(required(d, "latency_s"), "latency_s", 0.0, MAX_SECONDS)
        d["bandwidth_Bps"] = number(required(d, "bandwidth_Bps"), "bandwidth_Bps", positive=True)
        d["env"] = {text(k, "env", 256): text(v, f"env.{k}")
                    for k, v in obj(d.get("env", {}), "env", MAX_ITEMS).items()}
        for k in ("gpus", "derived_from"):
            d[k] = tuple(integer(g, f"{k}[{i}]", 0, MAX_ITEMS)
                         for i, g in enumerate(items(d.get(k, []), k)))
        if "cached" in d:
            d["cached"] = flag(d["cached"], "cached")
        return cls(**d)

    @classmethod
    def from_points(cls, world_size, backend, points, **kw) -> "CommCurve":
        pts = tuple(sorted((int(a), float(b)) for a, b in points))
        lat, bw = cls.fit(pts)
        return cls(world_size, backend, pts, lat, bw, **kw)


# ModelProfile's fields by the check from_dict gives them.
_COUNTS = ("total_params", "trainable_params", "grad_bytes", "num_grad_tensors", "buffer_bytes",
           "steps_measured")
_OPTIONAL_COUNTS = ("batch_size", "micro_batch_size", "micro_batches", "peak_gpu_mem_bytes",
                    "peak_host_mem_bytes")
_POSITIVE_TIMES = ("step_time_s", "step_time_p90_s", "window_s")
_TIMES = ("backward_s", "forward_s", "optimizer_s", "gate_wait_s", "dry_run_s", "host_slack_s")

# A kept trial over N GPUs must be at most TRIAL_RANGE x N x the dry run's one-GPU samples/s
# (DDP gives at most about N x); a one-GPU trial at least 1/TRIAL_FLOOR of it.
TRIAL_RANGE = 2.0
TRIAL_FLOOR = 10.0


@dataclass(frozen=True)
class TrialRecord:
    """A kept trial: the samples/s a (strategy, GPUs) measured (profile/cache.py)."""
    samples_per_s: float
    measured_at: float

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, nproc: int,
                  one_gpu: float | None = None) -> "TrialRecord":
        """Checked: BadRecord when samples_per_s is not a positive finite number or, given `one_gpu`
        (ModelProfile.samples_per_s), is above TRIAL_RANGE x nproc x one_gpu, or (one GPU) below
        one_gpu / TRIAL_FLOOR."""
        d = obj(d, RECORD)
        rate = number(required(d, "samples_per_s"), "samples_per_s", positive=True)
        when = number(required(d, "measured_at"), "measured_at", 0.0)
        if one_gpu:
            high = TRIAL_RANGE * nproc * one_gpu
            if rate > high:
                raise BadRecord("samples_per_s", f"{rate:.4g} on {nproc} GPU(s), more than "
                                                 f"{TRIAL_RANGE:g} × {nproc} × the dry run's "
                                                 f"{one_gpu:.4g} on one")
            if nproc == 1 and rate < one_gpu / TRIAL_FLOOR:
                raise BadRecord("samples_per_s", f"{rate:.4g} on one GPU, less than "
                                                 f"1/{TRIAL_FLOOR:g} of the dry run's "
                                                 f"{one_gpu:.4g}")
        return cls(rate, when)
