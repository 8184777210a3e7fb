"""Measured trials: a few real steps of one candidate, for when the model is not sure.

The runner starts the user's entrypoint exactly as the plan would (torchrun semantics, the
candidate's GPUs only) but wrapped by the dry-run hooks, which time the optimizer steps and end
the script after them. Rank 0's synced window gives samples/s = N x batch / step.

How long: at least `decision.trial_steps` steps and at least `decision.trial_seconds` of
measured window, estimated from the profile's step time (or the previous trial's). A 20-step
window of a 2 ms step is 40 ms, short enough for one slow all-reduce or clock ramp to move the
ratio by 20% (2x H200, 2026-11-22: a 20-step trial saw 0.98x where 500 steps gave 1.22x). Every
rank gets the same step count on its command line, so the ranks stop together.

    python -m smartlaunch.profile.trial_group --nproc N -- \
        --out-dir DIR --warmup W --measure M [--module] SCRIPT ARGS

The spawner (trial_group.py) starts N ranks of this module with torchrun's environment,
without torchrun's agent (~3 s of start-up saved on 2x H200; see trial_group.py).

Run as a module (`python -m smartlaunch.profile.trial`), this file is the per-rank shim: each
rank writes its own result file (rank<RANK>.json) and hands over to smartlaunch.profile.dryrun.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Mapping

from smartlaunch import proc, sandbox
from smartlaunch.policy.api import Policy
from smartlaunch.profile import gate as gates
from smartlaunch.profile.dryrun import MAX_STEPS
from smartlaunch.profile.runner import isolation_check, undo_note, undo_roots
from smartlaunch.profile.tick import read_tick
from smartlaunch.profile.trial_group import spawner_command, warm_command
from smartlaunch.request import Request
from smartlaunch.vocab import Strategy

KILL_GRACE_S = 5.0


def make_trial_runner(request: Request, policy: Policy, environ: Mapping[str, str],
                      *, expected_step_s: float | None = None,
                      expected_setup_s: float | None = None, python: str = sys.executable,
                      log: Callable[[str], None] | None = None,
                      phases: Callable[[dict[str, float]], None] | None = None,
                      pool: "TrialSetup | None" = None
                      ) -> Callable[[Strategy, tuple[int, ...]], float | None]:
    """A `trial(strategy, gpus) -> samples/s or None` for decide(). None: the trial could not
    measure (script failed, no step within policy.dryrun.time_limit_s, --no-python).
    phases(seconds by phase): told after each trial where its seconds went (trial_phases).
    pool: warm ranks already started (`TrialSetup(..., warm=N)`): the first trial of at most
    N ranks runs on them; the caller closes it.
    expected_setup_s: the dry run's start to its first step (profile.startup_s), for the
    trial's progress deadlines (Deadlines). `trial.why[(strategy, gpus)]`: why a trial that
    gave None gave nothing, in a few words."""
    last_step = expected_step_s          # the next trial's window is sized from the last one
    warm = [pool] if pool is not None else []
    why: dict = {}

    def trial(strategy: Strategy, gpus: tuple[int, ...]) -> float | None:
        nonlocal last_step
        if request.no_python or not request.script:
            return None
        isolated, note = isolation_check(request, policy, environ)
        if not isolated and policy.dryrun.isolation == "require":
            if log is not None:
                log(f"no trial: {note}")
            return None
        n = len(gpus)            # one rank per GPU of the candidate (one for the baseline)
        steps = trial_steps(policy, last_step)
        changes = {"CUDA_VISIBLE_DEVICES": visible_devices(environ, gpus)} if gpus else {}
        run = warm.pop() if warm and warm[0].fits(n, isolated, changes) else None
        run = run or TrialSetup(request, policy, environ, isolated, python=python)
        deadlines = Deadlines.from_dry_run(expected_setup_s, last_step, policy.dryrun.time_limit_s)
        try:
            listing = undo_roots(request, policy, isolated, (run.tmp,))
            t_spawn = time.time()
            rc, stalled = run.run(n, steps, changes, deadlines)
            t_end = time.time()
            killed = rc is None
            if stalled:
                why[(strategy, tuple(gpus))] = stalled
            if listing is not None:
                undone = undo_note(listing, (run.tmp,))
                if log is not None:
                    log(f"trial of {strategy.value}×{n} not isolated ({note}): {undone}")
            # A killed trial's rank 0 writes what it had on SIGTERM: a window cut by a stall
            # or the time limit, not a rate to decide by.
            result = None if killed else read_rank0(run.out)
            if phases is not None:
                phases(trial_phases(result, t_spawn, t_end, killed=killed))
            if log is not None and (rc != 0 or result is None):
                tail = run.log.read_text(errors="replace")[-2000:] if run.log.exists() else ""
                how = f"was {stalled}" if killed else f"ended with {rc}"
                log(f"trial of {strategy.value}×{n} {how}; log tail:\n{tail}")
        finally:
            run.close()
        if result and result.get("step_time_s"):
            last_step = result["step_time_s"]
        got = samples_per_s(result, n)
        if got is None and (strategy, tuple(gpus)) not in why:
            why[(strategy, tuple(gpus))] = f"its script ended with {rc}" if rc else \
                "no step was measured"
        return got

    trial.why = why
    return trial


@dataclass(frozen=True)
class Deadlines:
    """How long a trial may go without progress, from what the dry run measured: its first
    step (`first_s`: the dry run's set-up and first step, which include a compile, so ranks
    set up early at their gate get the same) and each later step (`step_s`); and the whole
    trial's `limit_s`. A trial past one is killed and the decision goes on with the
    prediction (the plan says which and why): no script can hold a decision longer."""
    first_s: float
    step_s: float
    limit_s: float

    FLOOR_FIRST_S: ClassVar[float] = 30.0
    FLOOR_STEP_S: ClassVar[float] = 10.0
    FACTOR: ClassVar[float] = 3.0    # the dry run's own times, three over (DDP, contention)

    @classmethod
    def from_dry_run(cls, setup_s: float | None, step_s: float | None,
                     limit_s: float) -> "Deadlines":
        step = cls.FACTOR * (step_s or 0.0)
        first = cls.FACTOR * (setup_s or 0.0) + step
        return cls(min(limit_s, max(cls.FLOOR_FIRST_S, first)),
                   min(limit_s, max(cls.FLOOR_STEP_S, 20 * step)), limit_s)


class TrialSetup:
    """One trial's temp dir (its ranks' result dir, the sandbox's scratch, the log) and how
    its ranks start: cold (`trial_command` spawned by `run`), or warm: the spawner and `warm`
    ranks with torch imported started now, inside the sandbox, waiting for `run`'s go
    (gpus: the candidate it expects, whose CUDA_VISIBLE_DEVICES they start with)."""

    def __init__(self, request: Request, policy: Policy, environ: Mapping[str, str],
                 isolated: bool, *, python: str = sys.executable, warm: int = 0,
                 gpus: tuple[int, ...] = ()):
        self.request, self.policy, self.python = request, policy, python
        self.isolated, self.size = isolated, warm
        self._closing = threading.Lock()     # the Gate's thread and the pipeline may both close
        self._tmp = tempfile.TemporaryDirectory(prefix="smartlaunch-trial-")
        self.tmp = self._tmp.name
        proc.remove_on_exit(self.tmp)
        self.out = Path(self.tmp) / "result"
        self.out.mkdir()
        self.log = Path(self.tmp) / "trial.log"
        self.base_env = dict(environ)
        self.env = dict(environ)
        self.env.update(sandbox.DRYRUN_ENV)
        self.env["SMARTLAUNCH_TRIAL"] = "1"
        self.child: proc.Child | None = None
        self.early: dict[str, str] | None = None     # start_early's go: its variables
        self.gate = str(self.out / "gate")
        if warm and gpus:
            # The trial's expected GPUs already at the import: the go then changes nothing
            # torch may have read (warm.py re-executes a rank whose driver read another value).
            self.env["CUDA_VISIBLE_DEVICES"] = visible_devices(environ, gpus)
        self.visible = self.env.get("CUDA_VISIBLE_DEVICES")
        if warm:
            with open(self.log, "wb") as out:
                self.child = proc.spawn(self._wrap(warm_command(warm, python)), env=self.env,
                                        stdin=subprocess.PIPE, stdout=out,
                                        stderr=subprocess.STDOUT)

    def bind(self, request: Request, policy: Policy) -> "TrialSetup":
        """Spawned before the command line was parsed (profile/early.py, request and policy
        None): what it will run."""
        self.request, self.policy = request, policy
        return self

    def same(self, n: int, isolated: bool, environ: Mapping[str, str], gpus) -> bool:
        """Spawned as a fresh TrialSetup(..., warm=n, gpus=gpus) would be now, and alive."""
        return (self.size == n and self.visible == visible_devices(environ, gpus)
                and self.base_env == dict(environ) and self.fits(n, isolated))

    def fits(self, n: int, isolated: bool, changes: dict[str, str] | None = None) -> bool:
        if self.early is not None and (n != self.size or (changes or {}) != self.early):
            return False            # started as one candidate: only that one
        return self.alive and n <= self.size and isolated == self.isolated

    def start_early(self, gpus: tuple[int, ...], environ: Mapping[str, str]) -> bool:
        """The warm ranks' go now, as the `size`-GPU trial on gpus: the script sets itself up
        in them beside the dry run and stops at a gate before its first forward (gate.py),
        until `run` opens it with the step count. A 1.0B GPT's set-up took 15-18 s of a
        DDP x2 trial's 20 s (2x H200, 2026-11-23); a cold decision that must try DDP then
        pays only the steps. False: not warm, or died (a later trial runs cold)."""
        changes = {"CUDA_VISIBLE_DEVICES": visible_devices(environ, gpus)}
        args = shim_args(self.request, self.policy, str(self.out), None, gate=self.gate)
        if not self.alive or self.early is not None or len(gpus) != self.size \
                or not _go(self.child, self.size, args, changes):
            return False
        self.early = changes
        return True

    def arrived(self) -> bool:
        """Started early, and every rank waits at its gate (set up, idle)."""
        return self.early is not None and gates.arrived(self.gate, self.size)

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.returncode is None

    def _wrap(self, cmd: list[str]) -> list[str]:
        if not self.isolated:
            return cmd
        return sandbox.wrap(cmd, os.path.join(self.tmp, "scratch"), [str(self.out)],
                            str(self.out / "isolation.json"), self.python)

    def run(self, n: int, steps: int, changes: dict[str, str], deadlines: "Deadlines"
            ) -> tuple[int | None, str]:
        """(the spawner's code, or None when it was killed; and why it was killed)."""
        if self.early is not None and self.child is not None:
            child, self.child = self.child, None
            gates.open_gate(self.gate, {"measure": steps})
            return watched(child, self.out, n, deadlines)
        args = shim_args(self.request, self.policy, str(self.out), steps)
        if self.child is None:
            with open(self.log, "wb") as out:
                child = proc.spawn(self._wrap(spawner_command(n, args, self.python)),
                                   env={**self.env, **changes}, stdout=out,
                                   stderr=subprocess.STDOUT)
            return watched(child, self.out, n, deadlines)
        child, self.child = self.child, None
        _go(child, n, args, changes)       # False: it died, and watched() returns its code
        return watched(child, self.out, n, deadlines)

    def close(self) -> None:
        """Kills what never got its go (the spawner and its warm ranks), removes the dir.
        Safe from two threads at once (the Gate's drops a slow trial while the pipeline may
        drop it after a dry run out of memory): the second waits, then finds nothing left."""
        with self._closing:
            if self.child is not None:
                self.child.stop(signal.SIGKILL, 0)
                self.child = None
            if self._tmp is not None:
                self._tmp.cleanup()
                proc.remove_on_exit(self.tmp, done=True)
                self._tmp = None


def _go(child: proc.Child, n: int, args: list[str], changes: dict[str, str]) -> bool:
    """The warm spawner's go (trial_group.run_warm): n ranks of the shim with args."""
    try:
        child.proc.stdin.write(json.dumps({"nproc": n, "argv": args, "env": changes}
                                          ).encode() + b"\n")
        child.proc.stdin.close()
    except OSError:
        return False
    return True


def trial_phases(result: dict | None, t_spawn: float, t_end: float, *,
                 killed: bool = False) -> dict[str, float]:
    """Where a trial's wall seconds went, from rank 0's wall-clock stamps: `start` (the
    interpreter, the launcher and the torch import up to the hooks), `setup` (the script's
    own imports, model and data up to its first step), `steps` (warm-up and the window) and
    `exit` (from the result to the last process gone). Without stamps (no result, or no
    first step), all of it is `killed` when the time limit ended the trial, else `start`."""
    total = max(0.0, t_end - t_spawn)
    r = result or {}
    stamps = [r.get("wall_start"), r.get("wall_first_step"), r.get("wall_written")]
    if not all(isinstance(x, (int, float)) for x in stamps):
        return {"killed" if killed else "start": total}
    a, b, c = (min(max(x, t_spawn), t_end) for x in stamps)
    return {"start": a - t_spawn, "setup": max(0.0, b - a), "steps": max(0.0, c - b),
            "exit": max(0.0, t_end - c)}


def trial_steps(policy: Policy, step_s: float | None) -> int:
    """Measured steps for one trial: trial_steps, or more to fill trial_seconds."""
    d = policy.decision
    if not step_s or step_s <= 0:
        return d.trial_steps
    return max(d.trial_steps, min(MAX_STEPS, math.ceil(d.trial_seconds / step_s)))


def trial_command(request: Request, policy: Policy, nproc: int, out_dir: str,
                  python: str = sys.executable, *, steps: int | None = None) -> list[str]:
    return spawner_command(nproc, shim_args(request, policy, out_dir, steps), python)


def shim_args(request: Request, policy: Policy, out_dir: str, steps: int | None, *,
              gate: str | None = None) -> list[str]:
    """Each rank's arguments to this module (below, `_shim`)."""
    args = ["--out-dir", out_dir, "--warmup", str(policy.dryrun.warmup_steps),
            "--measure", str(steps or policy.decision.trial_steps)]
    if gate is not None:
        args += ["--gate", gate]
    if request.module:
        args.append("--module")
    return [*args, request.script, *request.script_args]


def visible_devices(environ: Mapping[str, str], gpus) -> str:
    """CUDA_VISIBLE_DEVICES for the candidate: its ordinals are relative to the job's own
    CUDA_VISIBLE_DEVICES (Slurm, the user), so map them through it."""
    seen = environ.get("CUDA_VISIBLE_DEVICES")
    if seen:
        ids = [s.strip() for s in seen.split(",") if s.strip()]
        if all(g < len(ids) for g in gpus):
            return ",".join(ids[g] for g in gpus)
    return ",".join(str(g) for g in gpus)


DONE_GRACE_S = 1.0       # after rank 0's result: the ranks' own ends, then they are ended
POLL_S = 0.05


def watched(child: proc.Child, out: Path, nranks: int, deadlines: Deadlines
            ) -> tuple[int | None, str]:
    """Wait for a trial's ranks, within its deadlines: (the spawner's code, or None when
    it was killed; why it was killed). Once rank 0 has written its result the measurement
    is over: the ranks' teardown is not waited for past DONE_GRACE_S. Progress is each
    rank's step count (the dry-run hooks' tick file, `tick<rank>` in `out`)."""
    child.stage = "a trial"         # a signal to us in the block: proc.Interrupted names it
    with child:
        t0 = last = time.monotonic()
        done = 0
        while True:
            rc = child.wait(POLL_S)
            if rc is not None:
                return rc, ""
            now = time.monotonic()
            if (out / "rank0.json").exists():
                rc = child.wait(DONE_GRACE_S)
                if rc is None:
                    child.stop(signal.SIGTERM, KILL_GRACE_S)
                    return 0, ""
                return rc, ""
            ticks = [read_tick(out / f"tick{r}") for r in range(nranks)]
            k = min((t[0] if t else 0) for t in ticks)
            if k > done:
                done, last = k, now
            allowed = deadlines.first_s if done == 0 else deadlines.step_s
            why = ""
            if now - t0 >= deadlines.limit_s:
                why = f"killed at the time limit (dryrun.time_limit_s, {deadlines.limit_s:g} s)"
            elif now - last >= allowed:
                what = "its first step" if done == 0 else f"step {done + 1}"
                why = (f"killed as stalled: its ranks did not all reach {what} within "
                       f"{allowed:.0f} s (the deadline from the dry run's own "
                       f"{'set-up' if done == 0 else 'steps'})")
            if why:
                child.stop(signal.SIGTERM, KILL_GRACE_S)
                return None, why


def read_rank0(out_dir: Path) -> dict | None:
    path = out_dir / "rank0.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def samples_per_s(result: dict | None, nproc: int) -> float | None:
    """nproc x batch / rank 0's median step; batch unknown -> steps/s x nproc (the ratio to
    single, all decide() uses, is the same)."""
    if not result:
        return None
    step = result.get("step_time_s")
    if not step or step <= 0:
        return None
    batch = result.get("batch_size") or 1
    return nproc * batch / step


def _shim(argv: list[str]) -> None:
    """Per-rank entry: --out-dir DIR [dry-run options] SCRIPT ARGS."""
    if len(argv) < 2 or argv[0] != "--out-dir":
        raise SystemExit("usage: python -m smartlaunch.profile.trial --out-dir DIR "
                         "[--warmup N] [--measure N] [--module] SCRIPT [ARGS...]")
    rank = os.environ.get("RANK", "0")
    out = os.path.join(argv[1], f"rank{rank}.json")
    from smartlaunch.profile import dryrun
    dryrun.main(["--out", out, "--progress", os.path.join(argv[1], f"tick{rank}"), *argv[2:]])


if __name__ == "__main__":
    _shim(sys.argv[1:])
