"""What a cold decision starts beside its dry run (`what_to_start`: the all-reduce sweep of the
largest DDP group, early DDP trials), each held at its gate, and `Early.rule`, the one rule for when
each may go: the sweep once the trials are set up (or gone), the dry run's measured steps once the
sweep has ended. A trial still setting up when the dry run has waited long enough, or while host
memory runs low, is killed and the decision goes on without it."""
from __future__ import annotations

import time
from dataclasses import dataclass

from smartlaunch.profile.session import Session, State

SPARE_CORES = 2          # left to the dry run's script and smartlaunch itself
READY_LIMIT_S = 15.0     # the least the dry run waits at its gate for the early trial
# Early trials are killed below this share of the job's memory left, before the OOM killer
# picks the dry run (or us) instead.
LOW_MEMORY = 0.10
DRY_RUN = "the dry run"


@dataclass(frozen=True)
class EarlyWork:
    group: tuple[int, ...]              # the largest DDP candidate's GPUs: its curve
    sweep: bool                         # measured before the dry run's steps
    trials: tuple[tuple[int, ...], ...]  # DDP trials set up beside the dry run, largest first


def what_to_start(*, dry_run: bool, groups: list[tuple[int, ...]], cores: int,
                  sweep_cached: bool, trial_wanted: list[bool]) -> EarlyWork | None:
    """What to start with the dry run: `dry_run` (a decision will measure), the DDP candidates'
    groups decide would try, largest first, the cores this process may use, whether the largest
    group's curve is cached and whether each group's trial is wanted. Each start costs about a core
    per rank: the sweep comes first, then the trials in order while cores are left."""
    if not dry_run or not groups or len(groups[0]) < 2:
        return None
    budget = cores - SPARE_CORES
    sweep = budget >= len(groups[0]) and not sweep_cached
    budget -= len(groups[0]) * sweep
    trials = []
    for group, wanted in zip(groups, trial_wanted):
        if wanted and budget >= len(group):
            trials.append(tuple(group))
            budget -= len(group)
    if not sweep and not trials:
        return None
    return EarlyWork(tuple(groups[0]), sweep, tuple(trials))


class Early:
    """The stages started early (trials: possibly none; sweep: None or one) and the rule ordering
    them."""

    def __init__(self, session: Session, trials: list, sweep, *, sweep_limit_s: float,
                 low_memory=None):
        """trials: profile.trial.Trial each, started with its gate; sweep: profile.comm.Sweep."""
        self.session, self.trials, self.sweep = session, list(trials), sweep
        self.sweep_limit_s = sweep_limit_s
        self.low_memory = low_memory if low_memory is not None else memory_low
        self.dropped = ""               # why the early trials were killed
        session.rules.append(self.rule)

    def rule(self) -> None:
        s = self.session
        sweep = self.sweep.stage if self.sweep is not None else None
        now = time.monotonic()
        dry = next((st for st in reversed(s.stages) if st.role == DRY_RUN and not st.over), None)
        setting_up = [t.stage for t in self.trials if t.stage.state == State.STARTED]
        if setting_up:
            if self.low_memory():
                self._drop("host memory ran low", setting_up)
            elif dry is not None and dry.t_gate is not None and \
                    now - dry.t_gate > max(READY_LIMIT_S, dry.t_gate - dry.t_start):
                self._drop("its set-up outlasted the dry run's wait", setting_up)
        trials_ready = all(t.stage.over or t.stage.state != State.STARTED for t in self.trials)
        if sweep is not None and not sweep.over:
            if sweep.state == State.AT_GATE and trials_ready:
                s.go(sweep)
            elif now - sweep.t_start > self.sweep_limit_s:
                s.kill(sweep, f"it ran past {self.sweep_limit_s:g} s")
        if sweep is not None and sweep.over:
            self.sweep.finish()         # cached, whether or not decide asks for it
        if dry is not None and dry.state == State.AT_GATE and trials_ready and \
                (sweep is None or sweep.over):
            s.go(dry)

    def _drop(self, why: str, stages) -> None:
        self.dropped = why
        for stage in stages:
            self.session.kill(stage, why)

    def drop_trials(self) -> bool:
        """Kill the early trials (their ranks hold GPU memory); False: none was alive."""
        alive = [t.stage for t in self.trials if not t.stage.over]
        if alive:
            self._drop("the dry run ran out of GPU memory beside it", alive)
        return bool(alive)

    def take_trials(self) -> list:
        """The early trials, for the trials decide runs (profile.trial), once."""
        trials, self.trials = self.trials, []
        return trials


def memory_low(share: float = LOW_MEMORY) -> bool:
    """Is less than `share` of the memory this job may use left? Its cgroup's (v2 memory.max)
    when it sets one, else the host's."""
    import psutil
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0::"))
    except (OSError, StopIteration):
        path = "/"
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), 0, -1):        # this cgroup and each parent with a limit
        base = "/sys/fs/cgroup/" + "/".join(parts[:depth])
        try:
            with open(f"{base}/memory.max") as f:
                limit = f.read().strip()
            if limit == "max":
                continue
            with open(f"{base}/memory.current") as f:
                if int(limit) - int(f.read()) < share * int(limit):
                    return True
        except (OSError, ValueError):
            continue
    m = psutil.virtual_memory()
    return m.available < share * m.total
