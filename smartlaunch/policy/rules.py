"""What each policy key may hold beyond its type in api.py: ranges, allowed values, how an
admin's `enforce:` combines with a user's value."""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any

from smartlaunch.policy.api import (
    DecisionPolicy, DryRunPolicy, JobsPolicy, LaunchPolicy, PathsPolicy, SlurmPolicy,
)
from smartlaunch.vocab import ISOLATION_MODES, LINK_FAMILIES, NUMA_MODES, STRATEGIES

SECTIONS: dict[str, type] = {
    "decision": DecisionPolicy,
    "launch": LaunchPolicy,
    "dryrun": DryRunPolicy,
    "jobs": JobsPolicy,
    "paths": PathsPolicy,
    "slurm": SlurmPolicy,
}
DAY_S = 24 * 3600.0


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float
    lo_open: bool = False       # lo itself not allowed (a zero timeout means "never wait")

    def holds(self, v: float) -> bool:
        return (v > self.lo if self.lo_open else v >= self.lo) and v <= self.hi

    def describe(self) -> str:
        if self.lo_open:
            return f"above {self.lo:g} and at most {self.hi:g}"
        return f"from {self.lo:g} to {self.hi:g}"


RANGES: dict[str, Range] = {
    "decision.min_efficiency": Range(0.0, 1.0),       # >1 would need superlinear speedup
    "decision.uncertainty_band": Range(0.0, 2.0),   # relative error; 2.0 = off by 3x
    "decision.trial_steps": Range(1, 10_000),
    "decision.trial_seconds": Range(0.0, 600.0),
    "decision.max_gpus": Range(1, 1024),
    "decision.world_sizes": Range(1, 1024),           # each entry
    "decision.memory_headroom": Range(0.0, 1.0, lo_open=True),
    "launch.rank_failure_timeout_s": Range(0.0, DAY_S, lo_open=True),
    "launch.hang_timeout_s": Range(0.0, 7 * DAY_S, lo_open=True),
    "launch.hang_step_multiple": Range(1.0, 1000.0),  # <1 would flag every normal step
    "launch.startup_grace_s": Range(0.0, DAY_S),
    "launch.signal_grace_s": Range(0.0, 3600.0),
    "launch.straggler_threshold": Range(0.0, 1.0, lo_open=True),
    "launch.straggler_window_s": Range(1.0, DAY_S),     # <1 s: a few steps decide
    "launch.gpu_sample_s": Range(0.5, 3600.0),         # a sample is a few NVML calls
    "launch.clock_drift_threshold": Range(0.0, 1.0, lo_open=True),
    "dryrun.time_limit_s": Range(0.0, DAY_S, lo_open=True),
    "dryrun.warmup_steps": Range(0, 10_000),
    "dryrun.measure_steps": Range(1, 10_000),
    "dryrun.measure_seconds": Range(0.0, 600.0),
    "dryrun.precision": Range(0.0, 1.0),
    "jobs.jobs_per_gpu": Range(1, 16),
    "jobs.wait_timeout_s": Range(0.0, 30 * DAY_S),
    "paths.comm_cache_max_age_s": Range(0.0, 365 * DAY_S),
}

# key -> (allowed values, what one of them is called in a message)
CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "decision.allowed_strategies": (STRATEGIES, "strategy"),
    "decision.ddp_link_classes": (LINK_FAMILIES, "link family"),
    "decision.fallback_strategy": (STRATEGIES, "strategy"),
    "launch.numa_binding": (NUMA_MODES, "NUMA mode"),
    "dryrun.isolation": (ISOLATION_MODES, "isolation mode"),
}

# How an enforced value combines with the value below it. "max": the admin value is a cap (a
# user may be stricter); "min": a floor; "subset": the user's list is cut down to the admin's;
# every other key: the admin value replaces the user's.
ENFORCE_MODES: dict[str, str] = {
    "decision.max_gpus": "max",
    "decision.min_efficiency": "min",
    "decision.allowed_strategies": "subset",
    "decision.ddp_link_classes": "subset",
    "decision.world_sizes": "subset",
    "decision.memory_headroom": "max",
    "launch.rank_failure_timeout_s": "max",
    "launch.hang_timeout_s": "max",
    "launch.startup_grace_s": "max",
    "launch.signal_grace_s": "max",
    "dryrun.time_limit_s": "max",
    "jobs.jobs_per_gpu": "max",
    "jobs.wait_timeout_s": "max",
}

# Keys only the admin's `enforce:` section may hold (absent: no limit) -> what the key holds.
ENFORCE_ONLY: dict[str, str] = {
    "launch.user_env": "the variables users' policy files may set in launch.env and "
                       "launch.nccl",
}

# Text keys whose empty value has a meaning of its own (the others must not be empty).
EMPTY_MEANS: dict[str, str] = {
    "launch.log_dir": "logs/ under paths.cache_dir",
}

KIND_NAMES = {
    "float": "a number", "int": "an integer", "bool": "true or false", "str": "a string",
    "optint": "an integer or null", "optfloat": "a number or null",
    "strtuple": "a list of names", "inttuple": "a list of integers", "nccl": "a mapping of link "
    "families to NCCL variables", "env": "a mapping of variable names to values",
}


def _kind(tp: Any) -> str:
    if tp in (bool, int, float, str):
        return tp.__name__
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and set(args) == {int, type(None)}:
        return "optint"
    if origin in (typing.Union, types.UnionType) and set(args) == {float, type(None)}:
        return "optfloat"
    if origin is tuple and args == (str, ...):
        return "strtuple"
    if origin is tuple and args == (int, ...):
        return "inttuple"
    if origin is dict and args == (str, dict[str, str]):
        return "nccl"
    if origin is dict and args == (str, str):
        return "env"
    raise TypeError(f"policy schema has no rule for the type {tp!r}; add one in rules._kind")


@functools.cache
def section_fields(section: str) -> dict[str, str]:
    """{field name: kind} of one section, in declaration order."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: _kind(hints[f.name]) for f in dataclasses.fields(cls)}


def field_default(dotted: str) -> Any:
    """The built-in value of 'section.field'."""
    section, name = dotted.split(".")[:2]
    f = next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def base_key(dotted: str) -> str:
    """'launch.nccl.PHB' -> 'launch.nccl'; the key whose schema row applies."""
    return ".".join(dotted.split(".")[:2])
