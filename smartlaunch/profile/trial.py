"""Measured trials: a few real steps of one candidate, run as the plan would run it (torchrun
semantics, its GPUs only) under the dry-run hooks, every rank told the same step count; rank 0's
window gives samples/s = N x batch / step. The spawner is trial_group.py; run as a module, this file
is the per-rank shim handing over to smartlaunch.profile.dryrun (rank<RANK>.json)."""
from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Mapping

from smartlaunch import proc, sandbox
from smartlaunch.policy.api import Policy
from smartlaunch.profile.dryrun import MAX_STEPS
from smartlaunch.profile.early import memory_low
from smartlaunch.profile.runner import isolation_check, undo_note, undo_roots
from smartlaunch.profile.session import STOP_GRACE_S, Session, Stage, owned
from smartlaunch.request import Request
from smartlaunch.store import read_json
from smartlaunch.topology import sharing
from smartlaunch.vocab import Strategy
from smartlaunch.worker_env import narrow_visible

KILL_GRACE_S = STOP_GRACE_S
DONE_GRACE_S = 1.0       # after rank 0's result: the ranks' own ends, then they are ended
logger = logging.getLogger(__name__)


def make_trial_runner(request: Request, policy: Policy, environ: Mapping[str, str], *, topology,
                      session: Session | None = None, expected_step_s: float | None = None,
                      expected_setup_s: float | None = None, python: str = sys.executable,
                      log: Callable[[str], None] | None = None,
                      phases: Callable[[dict[str, float]], None] | None = None,
                      early: "list[Trial] | None" = None, hold: int = 0
                      ) -> Callable[[Strategy, tuple[int, ...]], float | None]:
    """A `trial(strategy, gpus) -> samples/s or None` for decide(), its ranks started in `session`
    (None: one of its own per trial) on `gpus` of `topology`. None: the trial could not measure.
    phases(seconds by phase): told after each trial (trial_phases). early: trials set up beside the
    dry run, each used when decide asks for exactly its candidate. expected_setup_s: the dry run's
    profile.startup_s, for the Deadlines. hold: how many measured trials (the latest) stay alive,
    held at their gate, so that a trial asked for again measures another window in the same ranks
    instead of starting new ones (needs `session`; early trials must be started with hold=True).
    `trial.why[(strategy, gpus)]`: why a trial that gave None gave nothing, in a few words."""
    last_step = expected_step_s          # the next trial's window is sized from the last one
    hold = hold if session is not None else 0    # a session of its own ends with its trial
    waiting = list(early or ())
    held: dict[tuple, Trial] = {}        # (strategy, gpus) -> a held trial, oldest first
    why: dict = {}

    def trial(strategy: Strategy, gpus: tuple[int, ...]) -> float | None:
        if request.no_python or not request.script:
            return None
        with owned(session) as s:
            return measure(s, strategy, gpus)

    def measure(session: Session, strategy: Strategy, gpus: tuple[int, ...]) -> float | None:
        nonlocal last_step
        isolated, note = isolation_check(request, policy, environ)
        if not isolated and policy.dryrun.isolation == "require":
            if log is not None:
                log(f"no trial: {note}")
            return None
        n = len(gpus)            # one rank per GPU of the candidate (one for the baseline)
        key = (strategy, tuple(gpus))
        steps = trial_steps(policy, last_step)
        again = held.pop(key, None)
        if again is not None and (again.stage.over or again.isolated != isolated):
            end(session, again)
            again = None
        run = again or next((w for w in waiting if w.fits(gpus, isolated)), None)
        origin = "held" if again else "set up early" if run is not None else "started for it"
        t_spawn = time.time()
        if again is not None:   # the same ranks measure another window
            session.again(run.stage, measure=steps)
        elif run is not None:   # the others wait for decide: it may still ask for them
            waiting.remove(run)
            session.go(run.stage, measure=steps)
        else:
            run = Trial.start(session, request, policy, environ, isolated, tuple(gpus),
                              topology=topology, steps=steps, python=python, hold=hold > 0)
        deadlines = Deadlines.from_dry_run(expected_setup_s, last_step, policy.dryrun.time_limit_s)
        listing = undo_roots(request, policy, isolated, (run.tmp,))
        want = run.stage.results + 1
        rc, stalled = watched(session, run.stage, deadlines, want)
        t_end = time.time()
        killed = rc is None
        if stalled:
            why[key] = stalled
        if listing is not None:
            undone = undo_note(listing, (run.tmp,))
            if log is not None:
                log(f"trial of {strategy.value}×{n} not isolated ({note}): {undone}")
        if again is not None and not killed and run.stage.results < want:
            # the script ended before another window (its own step count ran out): afresh
            logger.debug("held trial %s×%d ended with its script; starting it afresh",
                         strategy.value, n)
            end(session, run)
            return measure(session, strategy, gpus)
        # A killed trial's rank 0 writes what it had on SIGTERM: not a rate to decide by.
        result = None if killed else read_json(run.out / "rank0.json")
        shared = None if killed else sharing(topology, gpus, environ)
        if shared:              # it measured the other process as much as the candidate
            why[key] = f"another process came onto its GPUs ({shared})"
            result = None
        if log is not None and not shared and (rc != 0 or result is None):
            tail = run.log.read_text(errors="replace")[-2000:] if run.log.exists() else ""
            how = f"was {stalled}" if killed else f"ended with {rc}"
            log(f"trial of {strategy.value}×{n} {how}; log tail:\n{tail}")
        if rc == 0 and result and not shared and not run.stage.over and run.hold and hold > 0 \
                and not memory_low():
            held[key] = run                # the latest `hold` stay; the oldest ends
            while len(held) > hold:
                end(session, held.pop(next(iter(held))))
        elif not run.stage.over:
            end(session, run)
            t_end = time.time()            # its exit is the trial's time
        if phases is not None:
            phases(trial_phases(result, t_spawn, t_end, killed=killed))
        if result and result.get("step_time_s"):
            last_step = result["step_time_s"]
            # a mean far above the median says a stall sat in the window (a bug report's clue)
            logger.debug("trial %s×%d on GPUs %s (%s): %s steps, mean %.3f ms, median %.3f ms, "
                         "longest %.3f ms", strategy.value, n, ",".join(map(str, gpus)),
                         origin,
                         result.get("steps_measured"), 1e3 * result["step_time_s"],
                         1e3 * (result.get("step_time_median_s") or 0.0),
                         1e3 * (result.get("step_time_max_s") or 0.0))
        got = samples_per_s(result, n)
        if got is None and key not in why:
            why[key] = f"its script ended with {rc}" if rc else "no step was measured"
        return got

    trial.why = why
    return trial


def end(session: Session, run: "Trial") -> None:
    """A trial's ranks end now: held ones on their own once released, within DONE_GRACE_S,
    else killed."""
    session.release(run.stage)
    if not run.stage.over and not session.wait(lambda: run.stage.over, DONE_GRACE_S):
        session.kill(run.stage, "ended after its result", signal.SIGTERM, KILL_GRACE_S)


@dataclass(frozen=True)
class Deadlines:
    """How long a trial may go without progress, from the dry run: its first step (`first_s`) and
    each later step (`step_s`); and the whole trial's `limit_s`. A trial past one is killed and the
    decision goes on with the prediction."""
    first_s: float
    step_s: float
    limit_s: float

    FLOOR_FIRST_S: ClassVar[float] = 30.0
    FLOOR_STEP_S: ClassVar[float] = 10.0
    FACTOR: ClassVar[float] = 3.0    # the dry run's own times, three over

    @classmethod
    def from_dry_run(cls, setup_s: float | None, step_s: float | None,
                     limit_s: float) -> "Deadlines":
        step = cls.FACTOR * (step_s or 0.0)
        first = cls.FACTOR * (setup_s or 0.0) + step
        return cls(min(limit_s, max(cls.FLOOR_FIRST_S, first)),
                   min(limit_s, max(cls.FLOOR_STEP_S, 20 * step)), limit_s)


@dataclass
class Trial:
    """One trial's ranks (a Stage of the session) and its temp dir: result dir, sandbox scratch,
    log."""
    stage: Stage
    gpus: tuple[int, ...]
    isolated: bool
    tmp: str
    hold: bool = False      # its ranks wait for another window after each (dryrun --hold)

    @property
    def out(self) -> Path:
        return Path(self.tmp) / "result"

    @property
    def log(self) -> Path:
        return Path(self.tmp) / "trial.log"

    def fits(self, gpus, isolated: bool) -> bool:
        return not self.stage.over and tuple(gpus) == self.gpus and isolated == self.isolated

    @classmethod
    def start(cls, session: Session, request: Request, policy: Policy,
              environ: Mapping[str, str], isolated: bool, gpus: tuple[int, ...], *,
              topology, steps: int | None = None, gate: bool = False, hold: bool = False,
              python: str = sys.executable) -> "Trial":
        """Its ranks on `gpus` of `topology` (one rank on none: the CPU), started now: measuring
        `steps`, or (gate) set up and waiting before the first forward for the go that carries the
        step count; hold: after each window they wait for another (Session.again) or their
        release."""
        tmp = session.tempdir("smartlaunch-trial-")
        run = cls(None, tuple(gpus), isolated, tmp, hold)
        run.out.mkdir()
        env = {**environ, **sandbox.DRYRUN_ENV, "SMARTLAUNCH_TRIAL": "1"}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = narrow_visible(gpus, environ, topology)
        n = max(1, len(gpus))
        cmd = trial_command(request, policy, n, str(run.out), python, steps=steps, gate=gate,
                            hold=hold)
        if isolated:
            cmd = sandbox.wrap(cmd, os.path.join(tmp, "scratch"),
                               [str(run.out), *sandbox.compile_caches(env, session.made_cache)],
                               str(run.out / "isolation.json"), python)
        with open(run.log, "wb") as out:
            run.stage = session.start("a trial", [(cmd, env, {"stdout": out,
                                                              "stderr": subprocess.STDOUT})],
                                      ranks=n, gate=gate)
        return run


def trial_phases(result: dict | None, t_spawn: float, t_end: float, *,
                 killed: bool = False) -> dict[str, float]:
    """Where a trial's wall seconds went by rank 0's stamps: `start` (interpreter, launcher, torch
    import), `setup` (up to its first step), `steps` and `exit`. Without stamps, all of it is
    `killed` when the time limit ended the trial, else `start`."""
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
                  python: str = sys.executable, *, steps: int | None = None,
                  gate: bool = False, hold: bool = False) -> list[str]:
    """The spawner's command line (trial_group.py) for nproc ranks of the shim (`_shim`)."""
    return [*proc.python_m("smartlaunch.profile.trial_group", python), "--nproc", str(nproc), "--",
            "--out-dir", out_dir, "--warmup", str(policy.dryrun.warmup_steps),
            "--measure", str(steps or policy.decision.trial_steps),
            *(["--gate"] if gate else []), *(["--hold"] if hold else []),
            *(["--module"] if request.module else []),
            request.script, *request.script_args]


def watched(session: Session, stage: Stage, deadlines: Deadlines,
            results: int = 1) -> tuple[int | None, str]:
    """Serve a trial's ranks within its deadlines until rank 0 has written `results` results (or
    they ended): (0 then, else the spawner's code; None when it was killed; why it was killed)."""
    t0 = last = time.monotonic()
    done, why = 0, ""

    def over() -> bool:
        nonlocal done, last, why
        if stage.over or stage.results >= results:
            return True
        now = time.monotonic()
        k = stage.steps_done()
        if k > done:
            done, last = k, now
        allowed = deadlines.first_s if done == 0 else deadlines.step_s
        if now - t0 >= deadlines.limit_s:
            why = f"killed at the time limit (dryrun.time_limit_s, {deadlines.limit_s:g} s)"
        elif now - last >= allowed:
            what = "its first step" if done == 0 else f"step {done + 1}"
            why = (f"killed as stalled: its ranks did not all reach {what} within "
                   f"{allowed:.0f} s (the deadline from the dry run's own "
                   f"{'set-up' if done == 0 else 'steps'})")
        return bool(why)
    with proc.stage("a trial"):
        session.wait(over)
        if why:
            session.kill(stage, why, signal.SIGTERM, KILL_GRACE_S)
            return None, why
    return (stage.code, "") if stage.over else (0, "")


def samples_per_s(result: dict | None, nproc: int) -> float | None:
    """nproc x batch / rank 0's step; batch unknown -> steps/s x nproc (the ratio to single is the
    same)."""
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
    dryrun.main(["--out", out, *argv[2:]])


if __name__ == "__main__":
    _shim(sys.argv[1:])
