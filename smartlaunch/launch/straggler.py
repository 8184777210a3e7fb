"""Runtime diagnosis, the pure part (no I/O): who is slow, why (NVML), drift, and the end-of-run
summary, from the windows of work times and NVML samples monitor.py feeds."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from smartlaunch.launch.progress import WARM_STEP
from smartlaunch.topology.api import others_on

# Below this share of the step a slow rank costs too little to act on (run-to-run noise).
MIN_LOST_SHARE = 0.05
# NVML clock reasons that mean the GPU is held back (the others are idle or application set).
_CAUSES = (
    ("hw_thermal_slowdown", "thermal slowdown (hardware)"),
    ("sw_thermal_slowdown", "thermal slowdown"),
    ("hw_power_brake_slowdown", "power brake (external signal)"),
    ("hw_slowdown", "hardware slowdown (power supply or temperature)"),
    ("sw_power_cap", "power cap"),
    ("reliability", "reliability limit"),
    ("board_limit", "board limit"),
)
CLOCK_LOW = 0.9           # below 90% of its maximum the clock itself explains a slower rank
UNDER_LOAD_PCT = 50       # drift compares samples taken while the GPU was this busy
MIN_TREND_POINTS = 10     # history samples (1 s apart) below which a trend says nothing
RATES_AGREE = 0.03        # ranks of one synchronous job whose rates differ less step together


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of one GPU (fields of topology.api.GPU; None when NVML could not)."""
    t: float
    gpu: int
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    others: tuple[str, ...] = ()       # processes on it that are not the launch's own

    @classmethod
    def from_gpu(cls, t: float, g, before=None) -> "GpuSample":
        """before: the same GPU when the plan was made (others_on)."""
        return cls(t, g.index, g.sm_clock_mhz, g.sm_clock_max_mhz, g.temperature_c, g.power_w,
                   g.power_limit_w, g.utilization_pct, tuple(g.throttle_reasons),
                   others_on(g, before))

    @classmethod
    def from_dict(cls, d: dict) -> "GpuSample":
        return cls(**{**d, "throttle_reasons": tuple(d.get("throttle_reasons", ())),
                      "others": tuple(d.get("others", ()))})

    def to_dict(self) -> dict:
        return {**asdict(self), "throttle_reasons": list(self.throttle_reasons),
                "others": list(self.others)}


@dataclass(frozen=True)
class Straggler:
    local_rank: int
    rank: int
    work_s: float              # its work per step over the window
    others_s: float            # the other ranks' median work per step
    step_s: float              # the job's step time over the window
    window_s: float
    clock: str                 # "CUDA events" | "host clock"
    gpu: int | None = None

    @property
    def slowdown(self) -> float:
        return self.work_s / self.others_s - 1.0 if self.others_s > 0 else float("inf")

    @property
    def lost_share(self) -> float:
        """Share of the job's throughput lost waiting for this rank (synchronous steps)."""
        return min(1.0, max(0.0, (self.work_s - self.others_s) / self.step_s)) if self.step_s > 0 else 0.0


def find_slow_worker(work: dict[int, float], step_s: float, threshold: float) -> int | None:
    """The rank (key) whose work per step exceeds the others' median by `threshold` (a
    fraction) and costs the job at least MIN_LOST_SHARE of its step."""
    if len(work) < 2:
        return None
    slow = max(work, key=work.get)
    ref = statistics.median(v for k, v in work.items() if k != slow)
    excess = work[slow] - ref
    if excess <= 0 or (ref > 0 and work[slow] < (1.0 + threshold) * ref):
        return None
    return slow if step_s <= 0 or excess / step_s >= MIN_LOST_SHARE else None


def likely_cause(s: GpuSample | None, others: list[GpuSample] = ()) -> str:
    """One phrase from NVML: "GPU1 holds 1,410 of 1,980 MHz: thermal slowdown"."""
    if s is None:
        return "no NVML reading of its GPU (CPU run, or NVML unavailable)"
    reasons = [text for key, text in _CAUSES if key in s.throttle_reasons]
    clock = (f"GPU{s.gpu} holds {s.sm_clock_mhz:,} of {s.sm_clock_max_mhz:,} MHz"
             if s.sm_clock_mhz and s.sm_clock_max_mhz else f"GPU{s.gpu} clock unknown")
    low = bool(s.sm_clock_mhz and s.sm_clock_max_mhz and s.sm_clock_mhz < CLOCK_LOW * s.sm_clock_max_mhz)
    peers = [o.sm_clock_mhz for o in others if o.sm_clock_mhz]
    if peers and s.sm_clock_mhz:
        clock += f" (others {statistics.median(peers):,.0f} MHz)"
    if reasons:
        return f"{clock}: {', '.join(reasons)}"
    if low:
        return f"{clock}: clock held low without a throttle reason NVML names"
    if s.utilization_pct is not None and s.utilization_pct < UNDER_LOAD_PCT:
        return (f"{clock}, only {s.utilization_pct}% busy: the GPU waits for its host side "
                f"(input pipeline, CPU work or extra Python on that rank)")
    return f"{clock}, no throttling: the rank has more work per step (uneven batches or extra compute)"


def gpu_numbers(s: GpuSample | None) -> str:
    if s is None:
        return ""
    parts = []
    if s.temperature_c is not None:
        parts.append(f"{s.temperature_c} C")
    if s.power_w is not None:
        lim = f"/{s.power_limit_w:.0f}" if s.power_limit_w else ""
        parts.append(f"{s.power_w:.0f}{lim} W")
    if s.utilization_pct is not None:
        parts.append(f"{s.utilization_pct}% busy")
    return ", ".join(parts)


def straggler_text(st: Straggler, gpu: GpuSample | None, others: list[GpuSample] = ()) -> str:
    where = f" (GPU{st.gpu})" if st.gpu is not None else ""
    numbers = gpu_numbers(gpu)
    how = f"{st.slowdown:.0%}" if st.slowdown < 1 else f"{st.slowdown + 1:.1f}x"
    return (f"smartlaunch: warning: rank {st.rank}{where} computes {how} slower than "
            f"the others: {st.work_s * 1e3:.1f} ms of work per step against {st.others_s * 1e3:.1f} ms "
            f"({st.clock}, last {st.window_s:.0f} s); the others wait for it in every collective, "
            f"costing the job {st.lost_share:.0%} of its throughput (step {st.step_s * 1e3:.1f} ms). "
            f"{likely_cause(gpu, others)}" + (f"; {numbers}." if numbers else "."))


def clock_drift(samples: list[GpuSample], threshold: float) -> str | None:
    """A warning when the GPU's clock under load fell `threshold` (fraction) below where it
    started under load: the first vs the latest three busy samples (medians)."""
    busy = [s for s in samples if s.sm_clock_mhz and
            (s.utilization_pct is None or s.utilization_pct >= UNDER_LOAD_PCT)]
    if len(busy) < 6:
        return None
    start = statistics.median(s.sm_clock_mhz for s in busy[:3])
    now = statistics.median(s.sm_clock_mhz for s in busy[-3:])
    if now > (1.0 - threshold) * start:
        return None
    last, first = busy[-1], busy[0]
    temp = (f", {first.temperature_c} -> {last.temperature_c} C"
            if first.temperature_c is not None and last.temperature_c is not None else "")
    power = f", {last.power_w:.0f} W" if last.power_w is not None else ""
    why = [text for key, text in _CAUSES if key in last.throttle_reasons]
    return (f"smartlaunch: warning: GPU{last.gpu} clock fell from {start:,.0f} to {now:,.0f} MHz "
            f"({now / start - 1:.0%}) under the same load over {(last.t - first.t) / 60:.1f} min"
            f"{temp}{power}; {', '.join(why) if why else 'no throttle reason named by NVML'}.")


def rate_trend(history: list[tuple[float, int]]) -> tuple[float, float] | None:
    """Steps/s over the first and the last 10% of the run's stepping time."""
    h = [(t, s) for t, s in history if s > 0]
    # only the stepping part: the flat tail while the ranks exit would read as a falling rate
    last = max((i for i in range(1, len(h)) if h[i][1] > h[i - 1][1]), default=0)
    h = h[:last + 1]
    if len(h) < MIN_TREND_POINTS or h[-1][0] - h[0][0] <= 0:
        return None
    t0, t1 = h[0][0], h[-1][0]
    span = 0.1 * (t1 - t0)

    def steps_at(t: float) -> float:
        for (ta, sa), (tb, sb) in zip(h, h[1:]):
            if ta <= t <= tb:
                return sa + (sb - sa) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
        return float(h[-1][1])
    first = (steps_at(t0 + span) - steps_at(t0)) / span
    last = (steps_at(t1) - steps_at(t1 - span)) / span
    return first, last


def _rates_text(rates: dict[int, float], batch: int | None, since: str) -> str:
    """'; 1,234.5 samples/s (2.41 steps/s a rank)' for ranks that step together; each rank's
    rate, and why they may differ, when they do not. since: where the windows start."""
    def one(v: float) -> str:
        return f"{v * batch:,.1f} samples/s a rank" if batch else f"{v:.2f} steps/s"
    if not rates:
        return ""
    lo, hi = min(rates.values()), max(rates.values())
    if hi <= lo * (1 + RATES_AGREE):
        rate = statistics.median(rates.values())
        if len(rates) == 1 or not batch:
            return f"; {one(rate)}" + (f" on each of {len(rates)} ranks" if len(rates) > 1 else "")
        return f"; {rate * batch * len(rates):,.1f} samples/s ({one(rate)}, {len(rates)} ranks)"
    per = ", ".join(f"rank {r}: {one(v)}" for r, v in sorted(rates.items()))
    return (f"; {per} (each from its {since} to its last: ranks that stepped apart, "
            f"or one that stopped early, give different rates)")


@dataclass
class RunFigures:
    """What the end-of-run summary says (filled by monitor.py)."""
    steps: dict[int, int] = field(default_factory=dict)            # rank -> steps
    # rank -> (step intervals, seconds) of its steady window (ProgressRecord.window)
    window: dict[int, tuple[int, float]] = field(default_factory=dict)
    batch: int | None = None                                       # per rank, from the profile
    single_step_s: float | None = None                             # the profile's one-GPU step
    trend: tuple[float, float] | None = None
    warnings: list[str] = field(default_factory=list)
    lost_share: float | None = None                                # to the straggler
    log_dir: str | None = None
    run_dir: str | None = None
    dumps: list[str] = field(default_factory=list)


def summary_text(f: RunFigures, state: str) -> str:
    lines = []
    rates = {r: n / s for r, (n, s) in f.window.items() if s > 0}
    total = max(f.steps.values(), default=0)
    # ProgressRecord.window: from step WARM_STEP once a rank got past it, else from its first
    warm = all(f.steps.get(r, 0) - WARM_STEP == n for r, (n, _) in f.window.items())
    lines.append(f"smartlaunch: summary ({state}): {total:,} steps"
                 + _rates_text(rates, f.batch, f"step {WARM_STEP}" if warm else "first step"))
    if rates and f.single_step_s:
        step = 1.0 / statistics.median(rates.values())
        lines.append(f"  DDP efficiency {f.single_step_s / step:.0%} (step {step * 1e3:.1f} ms measured "
                     f"against {f.single_step_s * 1e3:.1f} ms on one GPU in the dry run)")
    if f.trend:
        a, b = f.trend
        lines.append(f"  step rate {a:.2f}/s in the first 10% of the run, {b:.2f}/s in the last 10% "
                     f"({b / a - 1:+.1%})" if a > 0 else f"  step rate trend: {a:.2f} -> {b:.2f}/s")
    if f.lost_share is not None:
        lines.append(f"  throughput lost to the straggler: {f.lost_share:.0%}")
    lines.append(f"  warnings: {len(f.warnings)}" + "".join(
        f"\n    - {w.removeprefix('smartlaunch: warning: ')}" for w in f.warnings))
    if f.log_dir:
        lines.append(f"  logs: {f.log_dir}")
    if f.run_dir:
        lines.append(f"  run files (progress, stacks, Flight Recorder, GPU samples): {f.run_dir}")
    if f.dumps:
        lines.append(f"  dumps: {', '.join(f.dumps)}")
    return "\n".join(lines)
