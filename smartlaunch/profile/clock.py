"""Clocks of the dry run's measurement window: device time where the work runs. A mark is taken at a
hook point without waiting for the device and read only after the window's closing `sync()`; on CUDA
it is an event on the current stream, so two marks time the GPU work queued between them (host
intervals of free-running CUDA steps are not step times). Tests inject their own clock."""
from __future__ import annotations

import statistics
import time


class HostClock:
    """CPU work: host time is device time."""
    name = "host clock"

    def now(self) -> float:
        return time.perf_counter()

    def mark(self):
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def done(self, mark) -> bool:
        return True

    def seconds(self, a, b) -> float:
        return b - a


class CudaClock(HostClock):
    """CUDA events on the current stream; read after sync()."""
    name = "cuda events"

    def __init__(self, cuda):
        self.cuda = cuda

    def mark(self):
        ev = self.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def sync(self) -> None:
        self.cuda.synchronize()

    def done(self, mark) -> bool:
        return bool(mark.query())

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3


def device_clock(torch):
    """The clock for the script's device: CUDA events once the script has initialised CUDA (asked
    when the window opens), else the host clock."""
    cuda = torch.cuda
    if cuda.is_available() and cuda.is_initialized():
        return CudaClock(cuda)
    return HostClock()


# Student's t at 97.5% by degrees of freedom (the largest row at or below df is used, which
# errs wide); beyond 60, 2.0.
_T975 = ((1, 12.71), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
         (8, 2.306), (9, 2.262), (10, 2.228), (15, 2.131), (20, 2.086), (30, 2.042),
         (60, 2.0))


def relative_half_width(xs: list[float]) -> float | None:
    """The 95% interval's half-width of the mean of `xs`, over the mean; None below 2 values or for
    a mean that is not positive."""
    n = len(xs)
    if n < 2:
        return None
    mean = sum(xs) / n
    if mean <= 0:
        return None
    t = next(t for df, t in reversed(_T975) if df <= n - 1)
    return t * statistics.stdev(xs) / (n ** 0.5) / mean


def read_window(clock, marks: list, warm: list, warm_spans: list,
                hosts: list[float] | None = None) -> dict:
    """Step time from a closed window (marks at its start and each step end), and its split from the
    warm-up steps: warm = step-end marks, warm_spans[i] = [(kind, start, end), ...] inside the step
    ending at warm[i + 1], kept as shares applied to the window's step.

    hosts[i]: host time just after marks[i] was queued (marks[0] right after the opening sync);
    host_slack_s: the median over step ends of how far the host ran ahead of the device (0: the
    device waits on the host, a launch-bound step)."""
    n = len(marks) - 1
    out: dict = {"steps_measured": max(0, n)}
    if n < 1:
        return out
    per = sorted(clock.seconds(a, b) for a, b in zip(marks, marks[1:]))
    step = clock.seconds(marks[0], marks[-1]) / n
    out.update(step_time_s=step, window_s=step * n, step_time_median_s=statistics.median(per),
               step_time_max_s=per[-1],
               step_time_p90_s=max(step, per[min(n - 1, int(round(0.9 * (n - 1))))]),
               step_time_ci=relative_half_width(per))
    if hosts is not None and len(hosts) == len(marks):
        ahead = [hosts[0] + clock.seconds(marks[0], m) - h for m, h in zip(marks[1:], hosts[1:])]
        out["host_slack_s"] = max(0.0, statistics.median(ahead))
    shares: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    for i, spans in enumerate(warm_spans[:len(warm) - 1]):
        total = clock.seconds(warm[i], warm[i + 1])
        if total <= 0:
            continue
        for kind in ("forward", "backward"):
            got = [clock.seconds(a, b) for k, a, b in spans if k == kind]
            if got:
                shares[kind].append(sum(got) / total)
        ends = [b for k, _, b in spans if k == "backward"]
        if ends:   # last backward end -> step end: optimizer, clipping, the scaler
            shares["optimizer"].append(clock.seconds(ends[-1], warm[i + 1]) / total)
    for kind, xs in shares.items():
        if xs:
            out[f"{kind}_s"] = min(1.0, statistics.median(xs)) * step
    return out
