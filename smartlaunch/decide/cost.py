"""The cost model: predicted DDP step time from one single-GPU profile and one all-reduce curve.

Every term is a physical cost with a bound (docs/decision.md copies this table):

    t1        single-GPU step time (profile.step_time_s)
    B         backward time = backward_share * t1 (profile, else default_backward_share)
    s         backward slowdown under DDP: the reducer's autograd hooks and bucket copies
    G         gradient bytes, split into buckets as DDP does: 1 MiB first, then 25 MiB each
    contend   = min(kappa * G * 2(N-1)/N,  rho * overlap)
              NCCL's kernels share SMs and HBM with the backward they overlap: kappa per byte
              of ring traffic, at most rho times that overlap (s*B after the first bucket)
    ready_k   = (s*B + contend) * (bytes of buckets 0..k) / G    gradients arrive over the
              (stretched) backward
    end_k     = max(ready_k, end_{k-1}) + comm(bytes_k) + per_bucket_s   one NCCL stream
    exposed   = max(0, end_last - (s*B + contend))    the tail the optimizer waits for
    host      = ddp_overhead_s + per_tensor_s * gradient tensors
              host work DDP adds to a step: its forward pre-hook, the reducer's finalisation,
              and per gradient tensor an autograd hook and a copy into its bucket and back
    hidden    = min(host, slack)   slack = profile.host_slack_s (unknown: 0), how far the host
              ran ahead of the device in the dry run: host work delays the device only past it
    buffers   = comm(buffer bytes)    rank 0's buffers (BatchNorm statistics), broadcast at
              every forward before any compute (broadcast_buffers=True)
    t_N       = t1 + (s-1)*B + contend + exposed + buffers + host - hidden
    speedup   = N * t1 / t_N       (per-GPU batch is the script's own: torchrun semantics)

comm() is the all-reduce curve measured in the job's own environment. kappa, ddp_overhead_s and
per_tensor_s depend on the machine: `calibrated()` replaces them with a node calibration's
values, else the shipped fit below stands (docs/decision.md, "The cost model").
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from smartlaunch.profile.api import CommCurve, ModelProfile

MiB = 1024 * 1024


@dataclass(frozen=True)
class CostModel:
    """Every constant of the prediction. The last five are fitted (docs/decision.md says
    how); their error on scripts outside the fit is MODEL_ERROR."""

    first_bucket_bytes: int = 1 * MiB       # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    bucket_bytes: int = 25 * MiB            # DDP's bucket_cap_mb default; trials catch others
    default_backward_share: float = 0.6     # where the profile could not time backward
    per_bucket_s: float = 20e-6             # flattening a bucket, launching its collective
    compute_slowdown: float = 1.1           # backward under the reducer's hooks
    ddp_overhead_s: float = 1.6e-3          # host work per step: pre-hook, finalisation
    per_tensor_s: float = 22e-6             # host work per gradient tensor: hook, bucket copy
    contention_s_per_byte: float = 12e-12   # per byte of ring traffic overlapping backward
    contention_cap: float = 0.5             # at most this share of the overlapped backward

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


# The machine-dependent constants a node calibration may replace.
NODE_CONSTANTS = ("contention_s_per_byte", "ddp_overhead_s", "per_tensor_s")


def calibrated(model: CostModel, record: dict | None) -> tuple[CostModel, str]:
    """(the model with a node calibration record's constants, --explain's sentence on which
    values decide and whence); record: calibrate.derive's, or None. A constant missing,
    negative or not finite in it stays the shipped one."""
    values = (record or {}).get("constants")
    got = {k: float(v) for k, v in (values if isinstance(values, dict) else {}).items()
           if k in NODE_CONSTANTS and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0}
    if not got:
        return model, (f"{constants_text(model)} (shipped: docs/decision.md says where they were "
                       f"fitted; `smartlaunch-node calibrate` measures this node's)")
    spread = record.get("spread") if isinstance(record.get("spread"), dict) else {}
    where = "measured on this node" + (f" {record['date']}" if record.get("date") else "")
    shipped = sorted(set(NODE_CONSTANTS) - set(got))
    tail = f"; {', '.join(shipped)} shipped" if shipped else ""
    new = dataclasses.replace(model, **got)
    return new, f"{constants_text(new, spread)} ({where}{tail})"


def constants_text(model: CostModel, spread: dict | None = None) -> str:
    """"all-reduce contention 12 ms/GB, DDP overhead 0.40 ms per step, 0 µs per gradient
    tensor", with "± spread" where it is known."""
    spread = spread or {}

    def pm(key: str, scale: float, digits: int) -> str:
        v = spread.get(key)
        return f" ± {_g(v * scale, digits)}" if isinstance(v, (int, float)) and math.isfinite(v) \
            else ""
    # s/byte -> ms/GB: x 1e9 bytes x 1e3 ms
    return (f"all-reduce contention {_g(model.contention_s_per_byte * 1e12, 3)}"
            f"{pm('contention_s_per_byte', 1e12, 2)} ms/GB, DDP overhead {model.ddp_overhead_s * 1e3:.2f}"
            f"{pm('ddp_overhead_s', 1e3, 2)} ms per step, "
            f"{_g(model.per_tensor_s * 1e6, 2)}{pm('per_tensor_s', 1e6, 2)} µs per gradient tensor")


def _g(v: float, digits: int) -> str:
    """`digits` significant digits without an exponent (790, not 7.9e+02)."""
    s = f"{v:.{digits}g}"
    return f"{v:.0f}" if "e" in s else s


@dataclass(frozen=True)
class ModelError:
    """|ln(predicted / measured)| of the model's DDP speedup over script x link rows it was
    not fitted on; p90 is the decision's uncertainty band where the policy sets none."""
    p90_log: float
    median_log: float
    rows: int
    label: str                     # how --explain names it: "held-out error"
    source: str

    @property
    def band(self) -> float:
        """Relative half-width: the prediction may be off by a factor exp(p90) either way."""
        return math.expm1(self.p90_log)


# The held-out error of the frozen constants (docs/decision.md, "Trials"). Replace it only with
# the error of scripts measured after the constants it describes were frozen.
MODEL_ERROR = ModelError(p90_log=0.336, median_log=0.127, rows=12, label="held-out error",
                         source="12 held-out script x link rows (docs/decision.md)")


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
    comm_cost_s: float = 0.0       # what communication adds to the step: contention + exposed
    contention_s: float = 0.0
    tensors_s: float = 0.0         # per-tensor reducer work (host, before hiding)
    buffers_s: float = 0.0         # BatchNorm (and other) buffer broadcast per forward
    hidden_s: float = 0.0          # host work DDP adds that hides behind queued device work

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
    overlap = bwd * (1.0 - sizes[0] / total) if sizes else 0.0
    contention = min(model.contention_s_per_byte * profile.grad_bytes * 2 * (n - 1) / n,
                     model.contention_cap * overlap)
    stretched = bwd + contention
    done = 0
    end = 0.0
    comm_total = 0.0
    for size in sizes:
        done += size
        ready = stretched * done / total
        t = curve.time(size) + model.per_bucket_s
        comm_total += t
        end = max(ready, end) + t
    exposed = max(0.0, end - stretched)
    tensors = max(0.0, model.per_tensor_s) * (profile.num_grad_tensors or 0)
    host = tensors + model.ddp_overhead_s
    hidden = min(host, max(0.0, getattr(profile, "host_slack_s", None) or 0.0))
    buffers = curve.time(getattr(profile, "buffer_bytes", 0) or 0)
    step = (t1 + (s - 1.0) * share * t1 + contention + exposed + buffers + host - hidden)
    speedup = n * t1 / step
    return Prediction(n, step, speedup, speedup / n, comm_total, exposed, len(sizes), share, known,
                      contention + exposed, contention, tensors, buffers, hidden)
