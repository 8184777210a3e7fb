"""Measured launches: the step rate of what actually ran, kept with the profile for next time.

Every launch counts its ranks' optimizer steps (launch/progress.py). When one ends, the launch
layer reports steps and seconds here; the next plan of the same job (the profile key: script
content and siblings, arguments, working directory, torch, GPU model; plus the topology
fingerprint and every NCCL_* variable) prefers these rates to the cost model's predictions.

Rates are compared in rank-steps per second (ranks x steps/s): under torchrun's semantics each
rank does the single-GPU step's work, so DDP×N over single is the ratio of rank-steps/s. A
script that sizes its work by the world size (profile.work_depends_on_world_size) breaks
that; the record says so (`assumed`) and the text that uses it repeats it.

Layout: <cache_dir>/launches/<key>.json = {"runs": {"single": {...}, "ddp:0,1": {...}}}, the
latest launch of each candidate: "single" for a one-rank launch, "<strategy>:<gpus>" for one
rank per GPU (DDP, or any other unit of that shape).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass

from smartlaunch.profile.cache import comm_key, profile_key
from smartlaunch.store import cache_root, private_dir, read_json, write_json

# A launch shorter than this says little about the steady rate (start-up, clock ramp, the
# first checkpoint): not recorded.
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
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        d["gpus"] = tuple(int(g) for g in d.get("gpus", ()))
        return cls(**d)


def candidate_name(strategy: str, gpus) -> str:
    return ONE_RANK if strategy == ONE_RANK else f"{strategy}:" + ",".join(str(g) for g in gpus)


def measured_rate(strategy: str, gpus, steps: int, seconds: float, profile: dict,
                  now: float | None = None) -> MeasuredRate | None:
    """The rate of one finished launch from its slowest rank's step count, or None when it
    was too short to say anything."""
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
    return hashlib.sha256(json.dumps(
        [base, comm_key(topology, (), "launch", environ)]).encode()).hexdigest()[:32]


def _path(policy, key: str, environ):
    return private_dir(private_dir(cache_root(policy, environ)) / "launches") / f"{key}.json"


def load_rates(policy, key: str, environ) -> dict[str, MeasuredRate]:
    data = read_json(_path(policy, key, environ)) or {}
    out = {}
    for name, d in (data.get("runs") or {}).items():
        try:
            out[name] = MeasuredRate.from_dict(d)
        except (KeyError, TypeError, ValueError):
            continue      # an older or damaged entry: ignored, overwritten by the next launch
    return out


def store_rate(policy, key: str, rate: MeasuredRate, environ) -> None:
    path = _path(policy, key, environ)
    data = read_json(path) or {}
    runs = data.get("runs") if isinstance(data.get("runs"), dict) else {}
    runs[candidate_name(rate.strategy, rate.gpus)] = rate.to_dict()
    write_json(path, {"runs": runs})


def one_gpu_rate(rates: dict[str, MeasuredRate], profile: dict) -> tuple[float | None, str]:
    """Rank-steps/s of one GPU, and where it comes from: a measured single launch of this job,
    else the dry run's step (train steps only, so a launch with evaluations looks slower)."""
    single = rates.get(ONE_RANK)
    if single is not None:
        return single.rank_steps_per_s, "a single-GPU launch"
    step = profile.get("step_time_s") if profile else None
    if step:
        return 1.0 / step, "the dry run's step"
    return None, ""
