"""The launcher's watchdog thread: reads each local rank's progress record and /proc state ten
times a second; stops the other ranks when one dies (SIGTERM, SIGKILL after the grace); on a
rank without progress for max(hang floor, multiple x median step) dumps stacks and Flight
Recorder rings and ends the job; feeds the run monitor and draws the steps/s line.
"""
from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from smartlaunch import proc as procs
from smartlaunch.launch import flightrec, stacks
from smartlaunch.launch.api import RankFailure
from smartlaunch.launch.monitor import RunMonitor, gpu_sampler
from smartlaunch.launch.progress import ProgressRecord, progress_path, read_progress, status_line
from smartlaunch.launch.straggler import GpuSample
from smartlaunch.launch.worker import stack_path
from smartlaunch.launch.worktime import WorkRecord, read_work, work_path
from smartlaunch.policy.api import LaunchPolicy

POLL_S = 0.1
# A gap this long between two looks means this process was stopped (Ctrl-Z, a suspended Slurm
# job: SIGSTOP to all of it, then SIGCONT): time before it is no rank's idle time.
STOPPED_GAP_S = 2.0
DISPLAY_EVERY_S = 1.0
RATE_WINDOW_S = 5.0                      # the live display's steps/s


@dataclass(frozen=True)
class HangReport:
    local_rank: int
    rank: int
    pid: int
    steps: int
    idle_s: float
    limit_s: float
    where: str | None                    # top frame of the stalled rank's main thread
    why: str                             # how this rank was singled out
    stack_files: tuple[str, ...] = ()
    frames: dict = field(default_factory=dict)   # local rank -> top frame
    collectives: tuple[str, ...] = ()            # from the Flight Recorder dumps
    dump_files: tuple[str, ...] = ()

    def describe(self, host: str) -> str:
        at = f" at {self.where}" if self.where else ""
        return (f"rank {self.rank} (local {self.local_rank}, pid {self.pid}) on {host} made no "
                f"progress for {self.idle_s:.1f} s (limit {self.limit_s:.1f} s, {self.steps} steps "
                f"done){at}; {self.why}")


class _Rank:
    def __init__(self, rec: ProgressRecord, keep_s: float):
        self.rec, self.keep_s = rec, keep_s
        self.work: WorkRecord | None = None
        self.state = procs.ProcState("R")
        self.step_s: deque[float] = deque(maxlen=64)
        self.samples: deque[tuple[float, int]] = deque()

    def update(self, rec: ProgressRecord, now: float) -> None:
        if rec.steps > self.rec.steps and self.rec.steps > 0 and rec.t_last > self.rec.t_last:
            self.step_s.append((rec.t_last - self.rec.t_last) / (rec.steps - self.rec.steps))
        self.rec = rec
        self.samples.append((now, rec.steps))
        while self.samples and now - self.samples[0][0] > self.keep_s + 1:
            self.samples.popleft()

    def rate(self, now: float, window: float) -> float | None:
        old = next(((t, s) for t, s in self.samples if now - t <= window), None)
        if old is None or now - old[0] < window * 0.9:
            return None
        return (self.rec.steps - old[1]) / (now - old[0])


class Watchdog(threading.Thread):
    def __init__(self, run_dir: str, nproc: int, launch: LaunchPolicy, host: str, *,
                 act_on_death: bool = True,
                 gpu_of: Callable[[int], int | None] = lambda lr: None,
                 read_topology: Callable[[], object] | None = None,
                 sample_gpus: Callable[[], list[GpuSample]] | None = None,
                 flight_recorder: flightrec.FlightRecorder | None = None,
                 display: bool = False, out=None, planned=None):
        """planned: the topology the plan was made on (gpu_sampler)."""
        super().__init__(name="smartlaunch-watchdog", daemon=True)
        self.run_dir, self.nproc, self.launch, self.host = run_dir, nproc, launch, host
        self.act_on_death = act_on_death
        self._gpu_of, self._read_topology = gpu_of, read_topology
        self._display, self._out = display, out or sys.stderr
        self._ranks: dict[int, _Rank] = {}
        self._known_pids: frozenset[int] = frozenset()
        self._exits: dict[int, int] = {}       # pid -> wait status, caught at SIGCHLD
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._kill_at: float | None = None
        self._stop_at: tuple[float, float] | None = None   # (when, then SIGKILL after) pending
        self._last_display = 0.0
        self._looked: float | None = None     # the end of the last tick
        self._resumed = float("-inf")         # when this process last came back from a stop
        self._straggler_warned = False
        self.failure: RankFailure | None = None
        self.hang: HangReport | None = None
        self.straggler: str | None = None
        self._fr = flight_recorder
        gpus = sorted({g for g in map(gpu_of, range(nproc)) if g is not None})
        if sample_gpus is None and gpus and read_topology is not None:
            sample_gpus = gpu_sampler(gpus, read_topology, time.monotonic, planned)
        self.monitor = RunMonitor(launch, gpu_of=gpu_of, sample_gpus=sample_gpus,
                                  record_to=os.path.join(run_dir, "gpu-samples.jsonl"),
                                  out=self._out)

    def run(self) -> None:
        while not self._halt.wait(POLL_S):
            try:
                self.tick()
            except Exception as exc:      # a watchdog bug must not take the job down
                print(f"smartlaunch: watchdog error (job continues): {exc!r}", file=self._out)

    def close(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        if self._display and self._last_display:
            self._out.write("\r\x1b[K")
            self._out.flush()

    def live_pids(self) -> dict[int, int]:
        with self._lock:
            self._refresh(time.monotonic())
            return {lr: r.rec.pid for lr, r in self._ranks.items() if r.state.alive}

    def records(self) -> dict[int, ProgressRecord]:
        with self._lock:
            self._refresh(time.monotonic())
            return {lr: r.rec for lr, r in self._ranks.items()}

    def note_children(self) -> None:
        """SIGCHLD handler body: a dead rank's exit status from /proc before torch's agent
        reaps it. Lock-free: a handler must not wait for the watchdog thread."""
        for pid in self._known_pids:
            st = procs.proc_state(pid)
            if st.status is not None:
                self._exits[pid] = st.status

    def forward(self, sig: int, group: bool = True) -> None:
        """Send sig to every live rank: its whole process group, or the rank alone."""
        for pid in self.live_pids().values():
            (procs.signal_group if group else procs.signal_process)(pid, sig)

    def stop(self, sig: int | None, kill_after: float) -> None:
        """Send sig (None: none) to every live rank's group now, SIGKILL after kill_after s."""
        self._stop_at = None
        if sig is not None:
            self.forward(sig)
        with self._lock:
            at = time.monotonic() + kill_after
            self._kill_at = at if self._kill_at is None else min(self._kill_at, at)

    def tick(self) -> None:
        now = time.monotonic()
        if self._looked is not None and now - self._looked > STOPPED_GAP_S:
            self._resumed = now
        try:
            self._tick(now)
        finally:
            self._looked = time.monotonic()

    def _tick(self, now: float) -> None:
        with self._lock:
            self._refresh(now)
            if self._stop_at is not None and (now >= self._stop_at[0] or not any(
                    r.state.alive for r in self._ranks.values() if r.rec.exit_code is not None)):
                self.stop(signal.SIGTERM, self._stop_at[1])
            if self._kill_at is not None and now >= self._kill_at:
                for r in self._ranks.values():
                    if r.state.alive:
                        procs.signal_group(r.rec.pid, signal.SIGKILL)
                self._kill_at = None
            if self.failure is None and self.hang is None:
                if self.act_on_death:
                    self._check_deaths()
                if self.failure is None:
                    self._check_hang()
                if self.failure is None and self.hang is None:
                    self.monitor.observe(now, {lr: (r.rec, r.work) for lr, r in self._ranks.items()})
                    if self.monitor.straggler is not None and not self._straggler_warned:
                        self._straggler_warned = True
                        self.straggler = self.monitor.warnings[-1]
                    if not self._straggler_warned:
                        self._check_straggler(now)
            if self._display and now - self._last_display >= DISPLAY_EVERY_S:
                self._draw(now)

    def _refresh(self, now: float) -> None:
        for lr in range(self.nproc):
            rec = read_progress(progress_path(self.run_dir, lr))
            if rec is None:
                continue
            r = self._ranks.get(lr)
            if r is None or r.rec.pid != rec.pid:       # first sight, or a restarted attempt
                keep_s = max(self.launch.straggler_window_s, RATE_WINDOW_S)
                r = self._ranks[lr] = _Rank(rec, keep_s)
            r.update(rec, now)
            r.work = read_work(work_path(self.run_dir, lr))
            r.state = procs.proc_state(rec.pid)
        self._known_pids = frozenset(r.rec.pid for r in self._ranks.values())

    def _check_deaths(self) -> None:
        dead = []
        for lr, r in self._ranks.items():
            st = r.state
            if st.alive:
                # the script failed; its interpreter's teardown may take long
                if r.rec.exit_code not in (None, 0):
                    dead.append((lr, r, r.rec.exit_code, None))
                continue
            status = st.status if st.status is not None else self._exits.get(r.rec.pid)
            if status is not None:
                if status == 0:
                    continue
                st = procs.ProcState("Z", status)
                code, sig = st.exit_code, st.signal
            elif r.rec.exit_code is not None:
                if r.rec.exit_code == 0:
                    continue
                code, sig = r.rec.exit_code, None      # the script's own exit status
            else:
                continue      # reaped unseen (os._exit?): torch's agent knows, and acts on it
            dead.append((lr, r, code, sig))
        if not dead:
            return
        # Ranks the agent already SIGTERMed (or we SIGKILLed) are victims, not the cause.
        victim = {signal.SIGTERM: 2, signal.SIGKILL: 1}
        lr, r, code, sig = min(dead, key=lambda d: (victim.get(d[3], 0), d[0]))
        self.failure = RankFailure(local_rank=lr, rank=r.rec.rank, host=self.host, pid=r.rec.pid,
                                   exit_code=None if sig else code, signal=procs.signal_name(sig))
        grace = min(self.launch.signal_grace_s, max(0.5, self.launch.rank_failure_timeout_s - 2.0))
        if sig is None and r.state.alive:
            # as under torch's agent: the others stop once it is gone, or after half the grace
            self._stop_at = (time.monotonic() + grace / 2, grace / 2)
        else:
            self.stop(signal.SIGTERM, grace)

    def _limit(self, r: _Rank) -> tuple[float, float]:
        """(seconds without progress, allowed seconds) for one rank."""
        if r.rec.steps == 0:
            return time.monotonic() - max(r.rec.t_start, self._resumed), \
                self.launch.startup_grace_s
        median = statistics.median(r.step_s) if r.step_s else 0.0
        # A record read as its first step is stored has a count but no time yet: the start.
        last = r.rec.t_last or r.rec.t_first or r.rec.t_start
        return (time.monotonic() - max(last, self._resumed),
                max(self.launch.hang_timeout_s, self.launch.hang_step_multiple * median))

    def _check_hang(self) -> None:
        if any(not r.state.alive or r.rec.exit_code is not None for r in self._ranks.values()):
            return          # a script finished: the others may legitimately stop stepping
        live = self._ranks              # every rank alive (above)
        if not any(idle > limit for idle, limit in map(self._limit, live.values())):
            return
        stopped = [lr for lr, r in live.items() if r.state.state in ("T", "t")]
        ranks = sorted(r.rec.rank for r in live.values())
        asked = flightrec.ask(self._fr, ranks) if self._fr else []
        texts = stacks.dump_all(self.run_dir, {lr: r.rec.pid for lr, r in live.items()})
        dumps, collectives, laggards = {}, [], []
        if asked:
            dumps = flightrec.collect(self._fr, asked)
            collectives, laggards = flightrec.verdict(
                {k: flightrec.read_dump(p) for k, p in dumps.items()}, ranks)
        elif self._fr:
            collectives = [flightrec.NO_PIPE]
        frames = {lr: stacks.top_frame(texts.get(lr, "")) for lr in live}
        lr, why = self._culprit(live, stopped, frames)
        behind = [x for x, r in live.items() if r.rec.rank in laggards]
        if behind and not stopped:
            lr, why = behind[0], "it did not enter a collective the others wait in (Flight Recorder)"
        r = live[lr]
        idle, limit = self._limit(r)
        files = tuple(stack_path(self.run_dir, x) for x in sorted(live))
        self.hang = HangReport(lr, r.rec.rank, r.rec.pid, r.rec.steps, idle, limit, frames.get(lr),
                               why, files, frames, tuple(collectives), tuple(dumps.values()))
        self.stop(signal.SIGTERM, self.launch.signal_grace_s)

    @staticmethod
    def _culprit(live: dict[int, _Rank], stopped: list[int], frames: dict[int, str | None]):
        if stopped:
            return stopped[0], "it was stopped (SIGSTOP or a debugger); the others waited for it"
        fewest = min(r.rec.steps for r in live.values())
        behind = [lr for lr, r in live.items() if r.rec.steps == fewest]
        if len(behind) == 1 and len(live) > 1:
            return behind[0], f"it is behind the others ({fewest} steps)"
        own = [lr for lr in behind if frames.get(lr) and not stacks.in_library(frames[lr])]
        if len(own) == 1 and len(behind) > 1:
            return own[0], "it is in the script's own code while the others wait inside torch"
        oldest = min(behind, key=lambda lr: live[lr].rec.t_last or live[lr].rec.t_start)
        return oldest, "it has gone longest without a step"

    def _check_straggler(self, now: float) -> None:
        """Step rates: the fallback for loops the work timer cannot see (no torch optimizer)."""
        if any(r.work is not None and r.work.steps for r in self._ranks.values()):
            return
        window = self.launch.straggler_window_s
        rates = {lr: r.rate(now, window) for lr, r in self._ranks.items()}
        if len(rates) < 2 or any(v is None for v in rates.values()):
            return
        slow = find_straggler(rates, self.launch.straggler_threshold)
        if slow is None:
            return
        self._straggler_warned = True
        others = statistics.median(v for k, v in rates.items() if k != slow)
        self.straggler = (f"smartlaunch: warning: local rank {slow} runs "
                          f"{1 - rates[slow] / others:.0%} slower than the others "
                          f"({rates[slow]:.2f} vs {others:.2f} steps/s over {window:.0f} s); "
                          f"{self._gpu_health(slow)}")
        print(self.straggler, file=self._out, flush=True)

    def _gpu_health(self, lr: int) -> str:
        gpu = self._gpu_of(lr)
        if gpu is None or self._read_topology is None:
            return "no GPU reading (CPU run or no NVML)"
        try:
            g = self._read_topology().gpu(gpu)
        except Exception as exc:           # NVML can fail mid-run; the warning must not
            return f"GPU {gpu}: no NVML reading ({exc})"
        return gpu_health_text(g)

    def _draw(self, now: float) -> None:
        self._last_display = now
        rates = {lr: r.rate(now, RATE_WINDOW_S) for lr, r in self._ranks.items()}
        steps = {lr: r.rec.steps for lr, r in self._ranks.items()}
        if steps:
            self._out.write("\r" + status_line(rates, steps) + "\x1b[K")
            self._out.flush()


def find_straggler(rates: dict[int, float], threshold: float) -> int | None:
    """The slowest rank when its rate is at least `threshold` below the others' median."""
    slow = min(rates, key=rates.get)
    others = [v for k, v in rates.items() if k != slow]
    ref = statistics.median(others)
    if ref > 0 and rates[slow] <= (1.0 - threshold) * ref:
        return slow
    return None


def gpu_health_text(g) -> str:
    def pair(a, b, unit):
        return f"{'??' if a is None else a}/{'??' if b is None else b} {unit}"
    temp = "??" if g.temperature_c is None else f"{g.temperature_c} C"
    power = pair(None if g.power_w is None else round(g.power_w), None if g.power_limit_w is None
                 else round(g.power_limit_w), "W")
    throttle = ", ".join(g.throttle_reasons) or "none"
    return (f"GPU {g.index}: {temp}, SM clock {pair(g.sm_clock_mhz, g.sm_clock_max_mhz, 'MHz')}, "
            f"power {power}, throttle reasons: {throttle}")
