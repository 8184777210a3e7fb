"""Measured launches: the step rate of what actually ran, kept per job and candidate
(<cache_dir>/launches/<key>.json) for the next plan, which prefers it to predictions. Rates are
compared in rank-steps per second; a script that sizes its work by the world size is `assumed`."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from smartlaunch.profile.cache import comm_key, digest, entry_path, profile_key
from smartlaunch.store import (
    MAX_ITEMS, MAX_SECONDS, BadRecord, cache_root, integer, items, keep, load, number, obj,
    optional, required, text, within,
)
from smartlaunch.wire import RECORD

# A launch shorter than this says little about the steady rate: not recorded.
MIN_STEPS = 20
MIN_SECONDS = 1.0
ONE_RANK = "single"     # the record of a one-process launch (single, or one independent job)
ASSUMED_PER_RANK = ("each rank doing the profiled single-GPU work (torchrun's semantics); the "
                    "script reads the world size and accumulates, so it may do less")


@dataclass(frozen=True)
class MeasuredRate:
    strategy: str                  # ONE_RANK, or the strategy that ran one rank per GPU
    gpus: tuple[int, ...]
    steps: int                     # optimizer steps of the slowest rank
    seconds: float                 # from its first step's end to its last step's end
    steps_per_s: float             # per rank
    rank_steps_per_s: float        # ranks x steps_per_s: what DDP×N is compared by
    samples_per_s: float | None    # rank_steps_per_s x the profile's samples per step
    assumed: str = ""              # what samples_per_s assumes, when it assumes anything
    measured_at: float = 0.0

    @property
    def nproc(self) -> int:
        return 1 if self.strategy == ONE_RANK else len(self.gpus)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MeasuredRate":
        """The rate to_dict wrote, checked: BadRecord naming the first field of the wrong type or
        out of range, or at odds with the others (measured_rate's arithmetic)."""
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in obj(d, RECORD).items() if k in names}
        d["strategy"] = text(required(d, "strategy"), "strategy", 64)
        d["gpus"] = tuple(integer(g, f"gpus[{i}]", 0, MAX_ITEMS)
                          for i, g in enumerate(items(required(d, "gpus"), "gpus")))
        if not d["gpus"] or (d["strategy"] == ONE_RANK) != (len(d["gpus"]) == 1):
            raise BadRecord("gpus", f"{len(d['gpus'])} GPUs for strategy {d['strategy']!r}")
        d["steps"] = integer(required(d, "steps"), "steps", 2)
        d["seconds"] = number(required(d, "seconds"), "seconds", hi=MAX_SECONDS, positive=True)
        for k in ("steps_per_s", "rank_steps_per_s"):
            d[k] = number(required(d, k), k, positive=True)
        d["samples_per_s"] = optional(number, d.get("samples_per_s"), "samples_per_s",
                                      positive=True)
        d["assumed"] = text(d.get("assumed", ""), "assumed")
        d["measured_at"] = number(d.get("measured_at", 0.0), "measured_at", 0.0)
        rate = cls(**d)
        for k, want in (("steps_per_s", (rate.steps - 1) / rate.seconds),
                        ("rank_steps_per_s", rate.nproc * rate.steps_per_s)):
            if abs(getattr(rate, k) - want) > 1e-6 * want:
                raise BadRecord(k, f"{getattr(rate, k):.6g}, not the {want:.6g} its steps and "
                                   f"seconds give")
        return rate


def candidate_name(strategy: str, gpus) -> str:
    return ONE_RANK if strategy == ONE_RANK else f"{strategy}:" + ",".join(str(g) for g in gpus)


def measured_rate(strategy: str, gpus, steps: int, seconds: float, profile: dict,
                  now: float | None = None) -> MeasuredRate | None:
    """The rate of one finished launch from its slowest rank's step count; None when it was too
    short to say anything."""
    if steps < MIN_STEPS or seconds < MIN_SECONDS:
        return None
    gpus = tuple(gpus)
    n = 1 if strategy == ONE_RANK else len(gpus)
    per_rank = (steps - 1) / seconds          # intervals between the first and last step end
    batch = profile.get("batch_size") if profile else None
    sizes = profile.get("reads_world_size") and (profile.get("micro_batches") or 1) > 1
    assumed = ASSUMED_PER_RANK if n > 1 and sizes else ""
    return MeasuredRate(strategy, gpus, steps, seconds, per_rank, n * per_rank,
                        n * per_rank * batch if batch else None, assumed,
                        time.time() if now is None else now)


def job_key(request, policy, topology, environ) -> str:
    gpu_model = topology.gpus[0].name if topology.gpus else "cpu"
    base = profile_key(request, policy, gpu_model=gpu_model, environ=environ)
    return digest([base, comm_key(topology, (), "launch", environ)])


def rates_path(policy, key: str, environ, *, create: bool = False):
    """Where the job's rates are kept; its folder made only to write there."""
    return entry_path(policy, environ, "launches", key, create=create)


def rates_from_dict(d: dict) -> dict[str, MeasuredRate]:
    """{"runs": {candidate name: MeasuredRate.to_dict()}}, checked: BadRecord naming the first bad
    field, or a run kept under another candidate's name."""
    runs = obj(required(obj(d, RECORD), "runs"), "runs", MAX_ITEMS)
    out = {}
    for name, run in runs.items():
        rate = within(f"runs.{name}", MeasuredRate.from_dict, run)
        if candidate_name(rate.strategy, rate.gpus) != name:
            raise BadRecord(f"runs.{name}", f"the run of "
                                            f"{candidate_name(rate.strategy, rate.gpus)}")
        out[name] = rate
    return out


def load_rates(policy, key: str, environ) -> dict[str, MeasuredRate]:
    """The kept rates of this job's launches by candidate name; none when absent or damaged (said
    once)."""
    return load(rates_path(policy, key, environ), rates_from_dict, "launch rates",
                then="predicting instead; the next launch measures it again") or {}


def store_rate(policy, key: str, rate: MeasuredRate, environ) -> bool:
    """Keep `rate` with the job's other candidates' (False: the cache cannot take it)."""
    runs = {name: r.to_dict() for name, r in load_rates(policy, key, environ).items()}
    runs[candidate_name(rate.strategy, rate.gpus)] = rate.to_dict()
    return keep(cache_root(policy, environ), rates_path(policy, key, environ, create=True),
                {"runs": runs})


def one_gpu_rate(rates: dict[str, MeasuredRate], profile: dict) -> tuple[float | None, str]:
    """Rank-steps/s of one GPU and where it comes from: a measured single launch of this job, else
    the dry run's step."""
    single = rates.get(ONE_RANK)
    if single is not None:
        return single.rank_steps_per_s, "a single-GPU launch"
    step = profile.get("step_time_s") if profile else None
    if step:
        return 1.0 / step, "the dry run's step"
    return None, ""
