"""Runtime diagnosis, the stateful part, fed every look the watchdog takes: one straggler
warning from per-rank work per step over `launch.straggler_window_s`; NVML samples every
`launch.gpu_sample_s` (appended to <run_dir>/gpu-samples.jsonl), one warning per GPU whose clock
under load drifts down; the end-of-run summary's figures."""
from __future__ import annotations

import json
import statistics
import sys
from collections import deque
from collections.abc import Callable

from smartlaunch.launch.progress import ProgressRecord
from smartlaunch.launch.straggler import (GpuSample, RunFigures, Straggler, clock_drift,
                                          find_slow_worker, rate_trend, straggler_text)
from smartlaunch.launch.worktime import WorkRecord
from smartlaunch.policy.api import LaunchPolicy
from smartlaunch.store import open_private

HISTORY_EVERY_S = 1.0
MIN_WINDOW_STEPS = 5       # fewer timed steps in the window: no verdict (a step longer than it)
WARMUP_STEPS = 6           # steps before work times count, as in the dry run (1 + 5)


class _GpuTrack:
    """First and latest busy samples of one GPU: all that drift needs, bounded for long runs."""

    def __init__(self):
        self.first: list[GpuSample] = []
        self.last: deque[GpuSample] = deque(maxlen=3)
        self.latest: GpuSample | None = None
        self.warned = False

    def add(self, s: GpuSample) -> None:
        self.latest = s
        if s.utilization_pct is not None and s.utilization_pct < 50:
            return
        (self.first if len(self.first) < 3 else self.last).append(s)

    def samples(self) -> list[GpuSample]:
        return [*self.first, *self.last]


class RunMonitor:
    def __init__(self, launch: LaunchPolicy, *, gpu_of: Callable[[int], int | None] = lambda lr: None,
                 sample_gpus: Callable[[], list[GpuSample]] | None = None,
                 record_to: str | None = None, out=None):
        self.launch = launch
        self._gpu_of, self._sample_gpus = gpu_of, sample_gpus
        self._record_to, self._out = record_to, out or sys.stderr
        self._work: dict[int, deque] = {}          # lr -> (now, steps, timed steps, work s)
        self._gpus: dict[int, _GpuTrack] = {}
        self._history: list[tuple[float, int]] = []
        self._last_sample = float("-inf")
        self.warnings: list[str] = []
        self.straggler: Straggler | None = None
        self.clock = "host clock"
        self.shared: dict[int, tuple[str, ...]] = {}   # GPU -> others first seen on it

    def observe(self, now: float, ranks: dict[int, tuple[ProgressRecord, WorkRecord | None]]) -> None:
        for lr, (rec, work) in ranks.items():
            q = self._work.setdefault(lr, deque())
            if work is not None and rec.steps >= WARMUP_STEPS:
                if work.device == "cuda":
                    self.clock = "CUDA events"
                q.append((now, rec.steps, work.steps, work.work_s))
            while q and now - q[0][0] > self.launch.straggler_window_s + 1:
                q.popleft()
        if ranks:
            steps = min(rec.steps for rec, _ in ranks.values())
            if not self._history or now - self._history[-1][0] >= HISTORY_EVERY_S:
                self._history.append((now, steps))
        if self._sample_gpus is not None and now - self._last_sample >= self.launch.gpu_sample_s:
            self._last_sample = now
            self._sample(now)
        if self.straggler is None:
            self._check_straggler(now, {lr: rec.rank for lr, (rec, _) in ranks.items()})

    def _sample(self, now: float) -> None:
        try:
            samples = self._sample_gpus()
        except Exception as exc:                 # NVML can fail mid-run; the job must not
            print(f"smartlaunch: GPU sampling stopped: {exc}", file=self._out, flush=True)
            self._sample_gpus = None
            return
        for s in samples:
            if s.others and s.gpu not in self.shared:
                self.shared[s.gpu] = s.others
            track = self._gpus.setdefault(s.gpu, _GpuTrack())
            track.add(s)
            if not track.warned:
                text = clock_drift(track.samples(), self.launch.clock_drift_threshold)
                if text:
                    track.warned = True
                    self._warn(text)
        if self._record_to and samples:
            try:
                with open_private(self._record_to, "a") as f:
                    for s in samples:
                        f.write(json.dumps(s.to_dict()) + "\n")
            except OSError as exc:      # a full disk or a quota: said once, the job goes on
                print(f"smartlaunch: GPU samples no longer kept in {self._record_to} "
                      f"({exc.strerror}); the job goes on", file=self._out, flush=True)
                self._record_to = None

    def _check_straggler(self, now: float, rank_of: dict[int, int]) -> None:
        work, step = {}, []
        for lr, q in self._work.items():
            inside = [e for e in q if now - e[0] <= self.launch.straggler_window_s]
            if len(inside) < 2:
                return
            (t0, s0, n0, w0), (t1, s1, n1, w1) = inside[0], inside[-1]
            if t1 - t0 < 0.9 * self.launch.straggler_window_s or n1 - n0 < MIN_WINDOW_STEPS:
                return
            work[lr] = (w1 - w0) / (n1 - n0)
            if s1 > s0:
                step.append((t1 - t0) / (s1 - s0))
        step_s = statistics.median(step) if step else 0.0
        slow = find_slow_worker(work, step_s, self.launch.straggler_threshold)
        if slow is None:
            return
        others = statistics.median(v for k, v in work.items() if k != slow)
        self.straggler = Straggler(slow, rank_of.get(slow, slow), work[slow], others, step_s,
                                   self.launch.straggler_window_s, self.clock, self._gpu_of(slow))
        gpu = self._fresh_sample(self.straggler.gpu)
        peers = [t.latest for g, t in self._gpus.items() if g != self.straggler.gpu and t.latest]
        self._warn(straggler_text(self.straggler, gpu, peers))

    def last_look(self, now: float) -> None:
        """One more sample at the run's end (a process that shares a GPU may have come after
        the last one); not while the watchdog's thread samples."""
        if self._sample_gpus is not None:
            self._sample(now)

    def _fresh_sample(self, gpu: int | None) -> GpuSample | None:
        if gpu is None:
            return None
        if self._sample_gpus is not None:
            self._last_sample = float("-inf")
            self._sample(self._history[-1][0] if self._history else 0.0)
        track = self._gpus.get(gpu)
        return track.latest if track else None

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        print(text, file=self._out, flush=True)

    def figures(self, records: dict[int, ProgressRecord]) -> RunFigures:
        f = RunFigures(warnings=list(self.warnings), trend=rate_trend(self._history))
        for rec in records.values():
            f.steps[rec.rank] = rec.steps
            seen = rec.window()
            if seen is not None:
                f.window[rec.rank] = seen
        if self.straggler is not None:
            f.lost_share = self.straggler.lost_share
        return f


def gpu_sampler(gpus: list[int], read_topology: Callable[[], object], clock,
                planned=None) -> Callable[[], list[GpuSample]]:
    """NVML samples of the given GPUs through the topology layer (the one door to NVML).
    planned: the topology the plan was made on (its processes are not counted as others)."""
    def sample() -> list[GpuSample]:
        topo = read_topology()
        now = clock()
        return [GpuSample.from_gpu(now, topo.gpu(g), planned.gpu(g) if planned else None)
                for g in gpus]
    return sample
