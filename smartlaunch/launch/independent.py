"""Independent single-GPU jobs: one process per variant, each on its own leased GPU, queued.

Each job runs the script with its variant's args appended, torchrun's single-rank environment,
SMARTLAUNCH_JOB_INDEX / SMARTLAUNCH_NUM_JOBS (across nodes too), its GPU's NUMA binding and its
own log <run dir>/job-<i>.log, beside summary.json and summary.txt. A GPU's lease is taken when
a job needs it and given back once the queue no longer does; a GPU runs up to
plan.jobs_per_gpu jobs at once; without GPUs, nproc_per_node CPU jobs run at a time. Exit code:
0, 1 when any job failed or was skipped (jobs.fail_fast stops the others), or 128+N on signal N.
"""
from __future__ import annotations

import enum
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from smartlaunch import proc
from smartlaunch.errors import ExitCode
from smartlaunch.launch.api import LaunchContext, LaunchResult, RunState
from smartlaunch.worker_env import single_rank_env
from smartlaunch.launch.leases import Lease
from smartlaunch.launch.signals import TERMINATING
from smartlaunch.launch.single import job_env
from smartlaunch.launch.summary import write_summary
from smartlaunch.launch.worker import worker_command
from smartlaunch.store import open_private

_ACQUIRE_MORE_EVERY_S = 1.0
_SAMPLES_RE = re.compile(rb"samples/s[=:] *([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)")


class JobState(str, enum.Enum):
    PENDING = "pending"        # -> running | skipped
    RUNNING = "running"        # -> succeeded | failed | interrupted
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # stopped by smartlaunch (signal or fail-fast)
    SKIPPED = "skipped"        # never started


@dataclass
class Job:
    index: int
    args: tuple[str, ...]
    state: JobState = JobState.PENDING
    gpu: int | None = None
    child: proc.Child | None = None
    log_path: str = ""
    started: float = 0.0
    ended: float = 0.0
    exit_code: int | None = None
    samples_per_s: float | None = None
    note: str = ""
    stopped: bool = False              # smartlaunch sent it a signal to end it

    @property
    def wall_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started if self.started else 0.0

    def exit_text(self) -> str:
        if self.exit_code is None:
            return self.note or self.state.value
        if self.exit_code < 0:
            return f"signal {signal.Signals(-self.exit_code).name}"
        return f"exit code {self.exit_code}"

    def finish(self, code: int) -> None:
        self.exit_code, self.ended = code, time.monotonic()
        self.state = JobState.SUCCEEDED if code == 0 else JobState.INTERRUPTED if self.stopped else JobState.FAILED
        self.samples_per_s = _samples_per_s(self.log_path)
        self.child.reap()              # dataloader workers and other leftovers of the job

    def to_dict(self) -> dict:
        return {"index": self.index, "args": list(self.args), "state": self.state.value, "gpu": self.gpu,
                "exit_code": self.exit_code, "wall_s": round(self.wall_s, 3),
                "samples_per_s": self.samples_per_s, "log": self.log_path, "note": self.note}


def _samples_per_s(path: str) -> float | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 256 * 1024))
            found = _SAMPLES_RE.findall(f.read())
    except OSError:
        return None
    return float(found[-1]) if found else None


class IndependentLauncher:
    """The Launcher (launch/api.py) of a queue of single-GPU jobs."""

    NOUN, GPU_COLUMN, HEAD = "job", "GPU", "independent jobs"      # groups.py: its own

    def __init__(self, plan, ctx: LaunchContext):
        self.plan, self.ctx, self.log = plan, ctx, ctx.say
        self.run_id = self.log_dir = ""        # start(): the run directory, its name
        self._started = 0.0
        variants = plan.variants or ((),)
        self.jobs = [Job(i, tuple(variants[i])) for i in plan.share() or (0,)]
        self.num_jobs = len(variants)            # SMARTLAUNCH_NUM_JOBS: the whole sweep's
        self.gpu_mode = plan.device == "cuda" and bool(plan.gpus)
        self.capacity = {i: plan.jobs_on(i) for i in plan.gpus} if self.gpu_mode else {}
        self.cpu_slots = max(1, plan.nproc_per_node)
        self.lease: Lease | None = None
        self.first_failure: Job | None = None
        self._last_more = 0.0
        self._stopping = False
        self._kill_at: float | None = None     # SIGKILL for jobs still running after the grace
        self._result: LaunchResult | None = None

    def _in(self, state: JobState) -> list[Job]:
        return [j for j in self.jobs if j.state == state]

    def _load(self, gpu: int) -> int:
        return sum(j.gpu == gpu for j in self._in(JobState.RUNNING))

    def _free_slot(self) -> int | None | bool:
        """A GPU index with room (least loaded first), None for a CPU slot, False when full."""
        if not self.gpu_mode:
            return None if len(self._in(JobState.RUNNING)) < self.cpu_slots else False
        room = [i for i in (self.lease.gpus if self.lease else ()) if self._load(i) < self.capacity[i]]
        return min(room, key=lambda i: (self._load(i), self.plan.gpus.index(i))) if room else False

    def _gpus_wanted(self) -> int:
        held = self.lease.gpus if self.lease else ()
        spare = sum(self.capacity[i] - self._load(i) for i in held)
        short = len(self._in(JobState.PENDING)) - spare
        per_gpu = max(self.capacity.values(), default=1)
        return max(0, min(len(self.plan.gpus) - len(held), -(-short // per_gpu)))

    def _due(self, force: bool) -> bool:
        """Whether to look for more GPUs now: when forced, else once a _ACQUIRE_MORE_EVERY_S."""
        if not force and time.monotonic() - self._last_more < _ACQUIRE_MORE_EVERY_S:
            return False
        self._last_more = time.monotonic()
        return True

    def _acquire_more(self, *, force: bool = False) -> None:
        if not self._due(force):
            return
        for i in self.plan.gpus:
            if self._gpus_wanted() <= 0:
                return
            if self.lease and i in self.lease.gpus:
                continue
            more = self.ctx.try_hold((i,), 1)
            if more is not None and self.lease is None:
                self.lease = more
            elif more is not None:
                self.lease.absorb(more)

    def _release_idle_gpus(self) -> None:
        if self.lease and (self._stopping or not self._in(JobState.PENDING)):
            for i in self.lease.gpus:
                if self._load(i) == 0:
                    self.lease.release(i)

    def _job_vars(self, job: Job) -> dict[str, str]:
        return {"SMARTLAUNCH_JOB_INDEX": str(job.index), "SMARTLAUNCH_NUM_JOBS": str(self.num_jobs)}

    def _start(self, job: Job, gpu: int | None) -> None:
        # No step counter: it imports torch up front even for scripts that never use it.
        ctx = self.ctx
        env = job_env(self.plan, ctx.topology, ctx.environ, gpu,
                      single_rank_env(os.path.join(self.log_dir, f"error-{job.index}.json"),
                                      run_id=f"{self.run_id}-{job.index}"))
        env.update(self._job_vars(job))
        argv = worker_command(self.plan.command, sys.executable) + list(job.args)
        job.log_path = os.path.join(self.log_dir, f"job-{job.index}.log")
        with open_private(job.log_path, "ab") as out:
            job.child = proc.spawn(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        job.state, job.gpu, job.started = JobState.RUNNING, gpu, time.monotonic()
        where = f"GPU {gpu}" if gpu is not None else "CPU"
        self.log(f"job {job.index} started on {where} (pid {job.child.pid}): "
                 f"{shlex.join(job.args) or '(no variant args)'}; log {job.log_path}")

    def _start_ready(self) -> None:
        while not self._stopping and self._in(JobState.PENDING):
            slot = self._free_slot()
            if slot is False:
                return
            self._start(self._in(JobState.PENDING)[0], slot)

    def _hold_first(self) -> None:
        """The GPUs to start on: those free now, else wait for one (or fail with --no-wait)."""
        if self.gpu_mode:
            self._acquire_more(force=True)
            if self.lease is None:
                self.lease = self.ctx.hold(self.plan, 1)
                self._acquire_more(force=True)

    def start(self) -> None:
        self._hold_first()
        self.ctx.begin(self.plan)
        self.log_dir = self.ctx.new_run_dir()
        self.run_id = os.path.basename(self.log_dir)
        self._started = time.monotonic()
        self._start_ready()

    def forward(self, signum: int) -> None:
        # Terminating signals are poll()'s (the handler may interrupt it anywhere).
        if signum not in TERMINATING:
            for job in self._in(JobState.RUNNING):
                job.child.send(signum)

    def _stop(self, sig: int, reason: str) -> None:
        """Pending jobs are skipped, running ones get `sig`, SIGKILL after the grace."""
        self._stopping = True
        for job in self._in(JobState.PENDING):
            job.state, job.note = JobState.SKIPPED, reason
        for job in self._in(JobState.RUNNING):
            if not job.stopped:
                job.stopped = True
                job.child.send(sig)
        if self._kill_at is None:
            self._kill_at = time.monotonic() + self.ctx.signal_grace_s

    def poll(self) -> LaunchResult | None:
        if self._result is not None:
            return self._result
        if self.ctx.signals and not self._stopping:
            sig = self.ctx.signals[0]
            self.log(f"got {signal.Signals(sig).name}: stopping {len(self._in(JobState.RUNNING))} job(s)")
            self._stop(sig, "interrupted")
        for job in self._in(JobState.RUNNING):
            code = job.child.returncode
            if code is None:
                if self._kill_at is not None and time.monotonic() > self._kill_at:
                    job.child.send(signal.SIGKILL)
                continue
            job.finish(code)
            self.log(f"{self.NOUN} {job.index} {job.state.value} ({job.exit_text()}) after {job.wall_s:.1f} s")
            if job.state == JobState.FAILED and self.first_failure is None:
                self.first_failure = job
                if self.ctx.policy.jobs.fail_fast and not self._stopping:
                    self.log(f"jobs.fail_fast=true: stopping the others after {self.NOUN} {job.index} failed")
                    self._stop(signal.SIGTERM, "skipped after a failure (jobs.fail_fast)")
        self._release_idle_gpus()
        if self.gpu_mode and not self._stopping:
            self._acquire_more()
        self._start_ready()
        if self._in(JobState.RUNNING) or (self._in(JobState.PENDING) and not self._stopping):
            return None
        return self._final()

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Stop every job now (pending ones skipped, running ones `sig`, SIGKILL after
        launch.signal_grace_s). Idempotent."""
        if self._result is None:
            self._stop(sig, "interrupted")
            for job in self._in(JobState.RUNNING):
                code = job.child.wait(max(0.0, self._kill_at - time.monotonic()))
                if code is None:
                    job.child.send(signal.SIGKILL)
                    code = job.child.wait()
                job.finish(code)

    def _final(self) -> LaunchResult:
        """The result, printed by run_loop: the summary table, the first failure."""
        bad = [j for j in self.jobs if j.state != JobState.SUCCEEDED]
        first = self.first_failure or (bad[0] if bad else None)
        sig = self.ctx.signals[0] if self.ctx.signals else None
        lines = self.summary()
        if first is not None:
            lines.append(f"{self.NOUN} {first.index} ({shlex.join(first.args)}) {first.state.value}: "
                         f"{first.exit_text()}; log {first.log_path or '(none)'}")
        jobs_code = ExitCode.WORKER_FAILED if bad else ExitCode.OK
        state = RunState.INTERRUPTED if sig else RunState.FAILED if bad else RunState.SUCCEEDED
        details = {"run_id": self.run_id, "log_dir": self.log_dir, "jobs": [j.to_dict() for j in self.jobs]}
        code = 128 + sig if sig else int(jobs_code)
        try:
            with open_private(os.path.join(self.log_dir, "summary.json"), "w") as f:
                json.dump({"exit_code": int(jobs_code), "signal": sig, **details}, f, indent=2)
        except OSError:
            pass
        write_summary(self.log_dir, "\n".join(
            [f"smartlaunch: summary ({state.value}): exit code {code} after "
             f"{time.monotonic() - self._started:.1f} s", *lines]))
        message = "\n".join(f"smartlaunch: {line}" for line in lines)
        self._result = LaunchResult(state, code, message, details=details)
        return self._result

    def _where(self, j: Job) -> str:
        return "cpu" if j.gpu is None and j.started else "-" if j.gpu is None else str(j.gpu)

    def summary(self) -> list[str]:
        rows = [(self.NOUN, self.GPU_COLUMN, "exit", "wall_s", "samples/s", "variant")]
        rows += [(str(j.index), self._where(j), j.exit_text() if j.exit_code != 0 else "0",
                  f"{j.wall_s:.1f}", f"{j.samples_per_s:g}" if j.samples_per_s is not None else "-",
                  shlex.join(j.args) or "(none)") for j in self.jobs]
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        lines = ["  " + "  ".join(r[c].ljust(widths[c]) for c in range(5)) + "  " + r[5] for r in rows]
        ok = len(self._in(JobState.SUCCEEDED))
        return [f"{self.HEAD}: {ok} of {len(self.jobs)} succeeded (logs in {self.log_dir})", *lines]

