"""The cost model: predicted DDP step time from one single-GPU profile and one all-reduce curve.

Formula (all constants live in `CostModel`; the README copies this):

    t1        single-GPU step time (profile.step_time_s)
    B         backward time = backward_share * t1   (profile.backward_share, else the default)
    G         gradient bytes; buckets split the way DDP does: first bucket first_bucket_bytes
              (1 MiB), then bucket_bytes (25 MiB) each, the remainder last
    s         backward slowdown under DDP (the reducer's autograd hooks and bucket copies)
    ready_k   = s * B * (bytes of buckets 0..k) / G     gradients arrive evenly over backward
    end_k     = max(ready_k, end_{k-1}) + comm(bytes_k) + per_bucket_s
              comm = CommCurve.time() of the group, measured in the job's environment;
              one NCCL stream, so buckets queue behind each other
    exposed   = max(0, end_last - s * B)        the tail the optimizer step waits for
    contend   = kappa * G * 2(N-1)/N            GPU time the overlapped all-reduce takes from
                                                backward (ring traffic per GPU times kappa)
    t_N       = t1 + (s - 1) * B + max(exposed, contend) + ddp_overhead_s
    speedup   = N * t1 / t_N         (per-GPU batch is the script's own: torchrun semantics)
    efficiency = speedup / N

Why `contend`: on 2x H200 (2026-11-22) the all-reduce of compute-bound models costs the step
far more than its standalone time even though it fits inside backward: ResNet-50 2.1 ms for a
0.68 ms all-reduce, GPT-124M 11.4 ms for 3.6 ms, ViT-L/16 21.7 ms for 8.8 ms, on NVLink. Per
gradient byte it is steady, ~16-23 ms/GB, on NVLink and on the host path alike, so it is a cost
of sharing SMs and HBM with NCCL's kernels, not of the link. On slow links the exposed tail is
larger and wins the max(). Launch-bound models (steps of a few ms, GPU partly idle) pay less
than kappa * G; the model over-charges them, which the measured trial near the threshold
catches.

Reference, measured on 2x H200 on 2026-11-21 (DDP x2 samples/s over single, same per-GPU
batch), used to pick the defaults, not asserted anywhere:

    model                      NVLink (~296 GB/s busbw)   host path (27 GB/s)   sockets (3.1 GB/s)
    6.9M MLP, batch 64               1.92x                      1.47x                 0.42x
    ResNet-50, batch 64              1.31x                      1.49x                 0.68x
    163M GPT, 8x512 tokens           1.29x                      1.12x                 0.18x
"""
from __future__ import annotations

from dataclasses import dataclass

from smartlaunch.profile.api import CommCurve, ModelProfile

MiB = 1024 * 1024


@dataclass(frozen=True)
class CostModel:
    """Every calibrated constant of the prediction, with its default and why."""

    # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDP makes the first bucket small so the
    # first all-reduce starts early in backward.
    first_bucket_bytes: int = 1 * MiB
    # DDP's bucket_cap_mb default (25). Scripts that change it are rare; the trial catches them.
    bucket_bytes: int = 25 * MiB
    # Backward's share of a step when the profile could not time it (forward:backward ~ 1:2,
    # plus optimizer and data loading).
    default_backward_share: float = 0.6
    # DDP bookkeeping per step outside the all-reduce: DDP's forward pre-hook, reducer
    # finalisation, the final wait and copy-back. Mostly CPU time, so it shows in launch-bound
    # steps. Fitted with the two constants below (see compute_slowdown).
    ddp_overhead_s: float = 0.6e-3
    # Per bucket: copying grads into the flat bucket and launching the collective.
    per_bucket_s: float = 20e-6
    # Backward runs this much slower under DDP: the reducer's autograd hooks and bucket copies.
    # Fitted on 2x H200 (2026-11-22) with ddp_overhead_s and contention_s_per_byte by a grid
    # search minimising the mean relative speedup error over 28 script x link rows of
    # bench/results/regret-2026-11-22-2xH200.md (bench/fit_cost.py): mean |error| 11%, 20 of
    # 28 within 15%, against 14% / 15 of 28 for the previous single-slowdown fit (1.5, 0.2 ms).
    compute_slowdown: float = 1.05
    # Seconds of step time per byte of ring all-reduce traffic per GPU while the all-reduce
    # overlaps backward: NCCL's kernels and the bucket copies share SMs and HBM with it
    # (16 ms/GB on H200; see the module docstring). 0 switches the term off.
    contention_s_per_byte: float = 16e-12

    def split(self, grad_bytes: int) -> list[int]:
        """Bucket sizes in the order DDP all-reduces them."""
        if grad_bytes <= 0:
            return []
        first = min(self.first_bucket_bytes, grad_bytes)
        rest = grad_bytes - first
        out = [first]
        while rest > 0:
            b = min(self.bucket_bytes, rest)
            out.append(b)
            rest -= b
        return out


@dataclass(frozen=True)
class Prediction:
    n: int
    step_s: float                  # predicted wall time of one step on each rank
    speedup: float                 # samples/s over single GPU
    efficiency: float              # speedup / n
    allreduce_s: float             # total all-reduce time per step (hidden + exposed)
    exposed_s: float               # the overlap tail the step waits for
    buckets: int
    backward_share: float
    backward_share_known: bool
    comm_cost_s: float = 0.0       # what communication adds to the step: max(exposed, contention)

    def samples_per_s(self, batch: int | None) -> float | None:
        return self.n * batch / self.step_s if batch else None


def backward_share(profile: ModelProfile, model: CostModel) -> tuple[float, bool]:
    share = profile.backward_share
    if share is None or share <= 0:
        return model.default_backward_share, False
    return share, True


def predict_single(profile: ModelProfile, model: CostModel = CostModel()) -> Prediction:
    share, known = backward_share(profile, model)
    t1 = float(profile.step_time_s)
    return Prediction(1, t1, 1.0, 1.0, 0.0, 0.0, 0, share, known)


def predict_ddp(profile: ModelProfile, curve: CommCurve, n: int,
                model: CostModel = CostModel()) -> Prediction:
    """DDP on n GPUs, the same per-GPU batch as the profiled single-GPU run."""
    t1 = float(profile.step_time_s)
    share, known = backward_share(profile, model)
    s = model.compute_slowdown
    bwd = s * share * t1
    sizes = model.split(profile.grad_bytes)
    total = float(sum(sizes)) or 1.0
    done = 0
    end = 0.0
    comm_total = 0.0
    for size in sizes:
        done += size
        ready = bwd * done / total
        t = curve.time(size) + model.per_bucket_s
        comm_total += t
        end = max(ready, end) + t
    exposed = max(0.0, end - bwd)
    contention = model.contention_s_per_byte * profile.grad_bytes * 2 * (n - 1) / n
    cost = max(exposed, contention)
    step = t1 + (s - 1.0) * share * t1 + cost + model.ddp_overhead_s
    speedup = n * t1 / step
    return Prediction(n, step, speedup, speedup / n, comm_total, exposed, len(sizes), share, known,
                      cost)
