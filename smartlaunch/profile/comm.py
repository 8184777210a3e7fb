"""All-reduce benchmark over a candidate GPU group -> `CommCurve`, cached per topology.

One `smartlaunch.profile.comm_worker` process per GPU (NCCL) or per emulated rank (gloo on the
CPU, e.g. with a fake topology), started in the job's environment so NCCL variables already set
(NCCL_P2P_DISABLE, the policy's PHB tuning, ...) shape what is measured. Each worker runs in its
own session; on failure or time-out every one of them is killed, nothing is left behind.

Reference (issue #4, 2x H200 NVLink, 256 MB, bus bandwidth): ~296 GB/s default, 27 GB/s with
NCCL_P2P_DISABLE=1, 3.1 GB/s with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1.
"""
from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from smartlaunch import proc, ranks
from smartlaunch.errors import ExitCode, SmartlaunchError
from smartlaunch.profile.api import CommCurve
from smartlaunch.profile.cache import cached_comm, comm_key, nccl_env, read_json, store_comm
from smartlaunch.profile.tick import TickWatch
from smartlaunch.worker_env import free_port

MB = 1 << 20
GPU_SIZES = tuple(MB << i for i in range(9))        # 1 MB .. 256 MB
CPU_SIZES = tuple((64 << 10) << i for i in range(7))  # 64 KB .. 4 MB: gloo over loopback is slow
TIME_LIMIT_S = 120.0   # NCCL init on 8 GPUs takes seconds; the sweep itself ~1-3 s


class CommBenchError(SmartlaunchError):
    """The all-reduce benchmark could not run (exit code: as a failed dry run)."""
    exit_code = ExitCode.DRY_RUN


def device_for(topology) -> str:
    """"cuda" where NVML read the GPUs; "cpu" for a fake topology (CI, a replayed node) or none:
    gloo ranks on the CPU then emulate the group."""
    return "cuda" if topology is not None and topology.source == "nvml" else "cpu"


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def sizes_for(device: str, max_bytes: int | None) -> tuple[int, ...]:
    """Powers of two up to max_bytes rounded up to the next power of two (at least 2 sizes)."""
    sizes = GPU_SIZES if device == "cuda" else CPU_SIZES
    if max_bytes:
        cap = 1 << max(0, int(max_bytes - 1).bit_length())
        kept = tuple(s for s in sizes if s <= cap)
        sizes = kept if len(kept) >= 2 else sizes[:2]
    return sizes


def measure_allreduce(gpus: tuple[int, ...], *, device: str, environ,
                      max_bytes: int | None = None, time_limit_s: float = TIME_LIMIT_S,
                      progress=None, pool=None, cancel=None, gate: str | None = None
                      ) -> CommCurve:
    """All-reduce time vs message size over `gpus` (CUDA ordinals as this job sees them).
    device: "cuda" (NCCL, one process per GPU) or "cpu" (gloo, len(gpus) processes).
    progress(size, k, n): called as rank 0 starts the k-th of the n sizes. cancel: a
    threading.Event; set, the ranks are killed and CommBenchError raised (run_ranks). gate: a
    file (profile/gate.py) the ranks wait for once their group is up, before the first size."""
    n = len(gpus)
    if n < 2:
        raise CommBenchError(f"an all-reduce benchmark needs at least 2 GPUs, got {list(gpus)}; "
                             "pass --gpus with two or more indices")
    backend = backend_for(device)
    sizes = sizes_for(device, max_bytes)
    iters = 5 if device == "cuda" else 7

    def watch(tmp: str) -> TickWatch:
        def at_size(k: int, of: int) -> None:
            if progress is not None and k <= len(sizes):
                progress(sizes[k - 1], k, of)
        return TickWatch(os.path.join(tmp, "sizes.bin"), at_size)

    # gloo emulates a group on a shared CPU, where noise only adds time: take the minimum;
    # NCCL on GPUs: the median, as a training step would see it.
    points = run_ranks(
        "smartlaunch.profile.comm_worker", gpus, device, environ,
        lambda tmp: ["--sizes", ",".join(map(str, sizes)), "--iters", str(iters),
                     "--stat", "median" if device == "cuda" else "min",
                     "--progress", os.path.join(tmp, "sizes.bin"),
                     *(["--gate", gate] if gate else [])],
        time_limit_s=time_limit_s, what="all-reduce benchmark",
        hint="check the NCCL_* environment and the GPUs' health.", watch=watch, pool=pool,
        cancel=cancel)
    if not points:
        raise CommBenchError(f"all-reduce benchmark over GPUs {list(gpus)} wrote no result; "
                             "run `smartlaunch-node bench-comm --debug` to see why")
    return CommCurve.from_points(n, backend, [tuple(p) for p in points], env=nccl_env(environ),
                                 gpus=tuple(gpus))


def run_ranks(module: str, gpus, device: str, environ, args, *, time_limit_s: float, what: str,
              hint: str, watch=None, pool=None, cancel=None):
    """One `python -m module` per rank over `gpus` (NCCL, one per GPU; or gloo ranks on the
    CPU), each in its own session with the job's environment, bounded by time_limit_s; every
    rank is killed on failure, time-out or success. Returns the JSON rank 0 wrote to --out.
    args(tmp) -> the module's own arguments; watch(tmp) -> a TickWatch polled meanwhile.
    pool: a warm.WarmPool started with `rank_base_env` (ranks it has are not started cold).
    cancel: a threading.Event another thread sets to end the ranks now (pipeline_pools).
    Used by the all-reduce benchmark and the node calibration (baseline.py). A signal to us
    meanwhile (main thread) kills the ranks and raises proc.Interrupted("the " + what)."""
    n = len(gpus)
    backend = backend_for(device)
    port = free_port()
    with proc.stage(f"the {what}"), \
            tempfile.TemporaryDirectory(prefix="smartlaunch-ranks-") as tmp:
        proc.remove_on_exit(tmp)
        out = os.path.join(tmp, "result.json")
        ticks = watch(tmp) if watch is not None else None
        base = rank_base_env(environ, device)
        envs, argvs = [], []
        for rank, gpu in enumerate(gpus):
            envs.append(dict(base, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                             LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port)))
            argvs.append(["--backend", backend, "--out", out, *args(tmp),
                          *(["--device-index", str(gpu)] if device == "cuda" else [])])
        group: list[ranks.Rank] = []

        def poll() -> None:
            if ticks is not None:
                ticks.poll()
            if cancel is not None and cancel.is_set():
                raise CommBenchError(f"{what} over GPUs {list(gpus)} was cancelled")
        try:
            group = ranks.start_ranks(module, argvs, envs, pool=pool,
                                      logs=[os.path.join(tmp, f"rank{r}.log") for r in range(n)])
            failed = ranks.wait_all(group, time_limit_s, poll)
            if ticks is not None:
                ticks.poll()
            if failed is not None:
                rank, why = failed
                raise CommBenchError(f"{what} over GPUs {list(gpus)} ({backend}) failed: rank "
                                     f"{rank} {why}; {hint} Last lines: " +
                                     " | ".join(ranks.tail(group[rank])))
            return read_json(Path(out))
        finally:
            ranks.stop_all(group, signal.SIGKILL, 0)
            proc.remove_on_exit(tmp, done=True)


def rank_base_env(environ, device: str) -> dict[str, str]:
    """A benchmark rank's environment before its rank variables: the job's (NCCL settings
    shape what is measured); gloo ranks on the CPU see no GPU and one thread each."""
    env = dict(environ)
    if device != "cuda":
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def comm_curve(topology, gpus, policy, environ, max_bytes: int | None = None,
               progress=None, pool=None, announce=None) -> CommCurve:
    """The cached curve for this topology, group and NCCL environment (this user's cache, else
    the node cache the Slurm prolog fills: cache.cached_comm); measured on a miss.
    Without GPUs in the topology (fake topologies, CI) the group is emulated with gloo.
    progress: as measure_allreduce's; announce(): called once before measuring. Neither is
    called on a cache hit. pool: warm ranks (run_ranks)."""
    gpus = tuple(gpus)
    device = device_for(topology)
    backend = backend_for(device)
    key = comm_key(topology, gpus, backend, environ)
    need = sizes_for(device, max_bytes)[-1]
    hit = cached_comm(policy, topology, gpus, backend, environ, need_bytes=need)
    if hit is not None:
        return hit
    if announce is not None:
        announce()
    curve = measure_allreduce(gpus, device=device, environ=environ, max_bytes=max_bytes,
                              progress=progress, pool=pool)
    store_comm(policy, key, curve, environ)
    return curve
