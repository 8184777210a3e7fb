"""All-reduce benchmark over a candidate GPU group -> `CommCurve`, cached per topology: one
comm_worker process per GPU (NCCL) or per emulated rank (gloo on the CPU), in the job's environment,
each in its own session; on failure or time-out every one of them is killed."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from smartlaunch import proc
from smartlaunch.errors import ExitCode, SmartlaunchError
from smartlaunch.profile.api import CommCurve
from smartlaunch.profile.cache import cached_comm, comm_key, nccl_env, read_json, store_comm
from smartlaunch.profile.session import Session, Stage, owned
from smartlaunch.worker_env import free_port

MB = 1 << 20
GPU_SIZES = tuple(MB << i for i in range(9))        # 1 MB .. 256 MB
CPU_SIZES = tuple((64 << 10) << i for i in range(7))  # 64 KB .. 4 MB: gloo over loopback is slow
TIME_LIMIT_S = 120.0


class CommBenchError(SmartlaunchError):
    """The all-reduce benchmark could not run (exit code: as a failed dry run)."""
    exit_code = ExitCode.DRY_RUN


def device_for(topology) -> str:
    """"cuda" where NVML read the GPUs; "cpu" (gloo ranks emulate the group) for a fake topology or
    none."""
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


WORKER = "smartlaunch.profile.comm_worker"
WHAT = "all-reduce benchmark"
HINT = "check the NCCL_* environment and the GPUs' health."


def _worker_args(device: str, sizes) -> list[str]:
    # gloo on a shared CPU, where noise only adds time: the minimum; NCCL: the median.
    return ["--sizes", ",".join(map(str, sizes)), "--iters", "5" if device == "cuda" else "7",
            "--stat", "median" if device == "cuda" else "min"]


def _sizes_progress(sizes, progress):
    """Rank 0's "size k of n" as progress(size, k, n)."""
    if progress is None:
        return None
    return lambda k, of: progress(sizes[k - 1], k, of) if 1 <= k <= len(sizes) else None


def measure_allreduce(gpus: tuple[int, ...], *, device: str, environ,
                      max_bytes: int | None = None, time_limit_s: float = TIME_LIMIT_S,
                      progress=None, session: Session | None = None) -> CommCurve:
    """All-reduce time vs message size over `gpus` (CUDA ordinals). device: "cuda" (NCCL, one
    process per GPU) or "cpu" (gloo). progress(size, k, n): as rank 0 starts the k-th of n sizes.
    session: the decision's, else one of its own."""
    if len(gpus) < 2:
        raise CommBenchError(f"an all-reduce benchmark needs at least 2 GPUs, got {list(gpus)}; "
                             "pass --gpus with two or more indices")
    sizes = sizes_for(device, max_bytes)
    points = run_ranks(WORKER, gpus, device, environ, _worker_args(device, sizes),
                       time_limit_s=time_limit_s, what=WHAT, hint=HINT,
                       progress=_sizes_progress(sizes, progress), session=session)
    return _curve(points, gpus, device, environ)


def _curve(points, gpus, device, environ) -> CommCurve:
    if not points:
        raise CommBenchError(f"all-reduce benchmark over GPUs {list(gpus)} wrote no result; "
                             "run `smartlaunch-node bench-comm --debug` to see why")
    return CommCurve.from_points(len(gpus), backend_for(device), [tuple(p) for p in points],
                                 env=nccl_env(environ), gpus=tuple(gpus))


def start_ranks(session: Session, module: str, gpus, device: str, environ, args, *,
                what: str, gate: bool = False) -> tuple[Stage, str]:
    """One `python -m module` per rank over `gpus` in `session`, each with the job's environment and
    its own log: (its stage, its temp dir, where rank 0 writes --out result.json). gate: they wait
    at their gate once joined."""
    n, backend, port = len(gpus), backend_for(device), free_port()
    tmp = session.tempdir("smartlaunch-ranks-")
    base = rank_base_env(environ, device)
    logs = [open(os.path.join(tmp, f"rank{r}.log"), "ab") for r in range(n)]
    try:
        commands = []
        for rank, gpu in enumerate(gpus):
            env = dict(base, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            argv = [*proc.python_m(module), "--backend", backend,
                    "--out", os.path.join(tmp, "result.json"), *args,
                    *(["--device-index", str(gpu)] if device == "cuda" else []),
                    *(["--gate"] if gate else [])]
            commands.append((argv, env, {"stdout": logs[rank], "stderr": subprocess.STDOUT}))
        stage = session.start(f"the {what}", commands, gate=gate)
    finally:
        for f in logs:
            f.close()
    return stage, tmp


def ranks_result(stage: Stage, tmp: str, gpus, device: str, what: str, hint: str):
    """The JSON rank 0 wrote, once `stage` is over; CommBenchError naming the first rank that failed
    (with its last lines), or why the stage was killed."""
    where = f"{what} over GPUs {list(gpus)} ({backend_for(device)})"
    if stage.why:
        raise CommBenchError(f"{where} failed: {stage.why}; {hint}")
    for rank, child in enumerate(stage.children):
        code = child.returncode
        if code:
            raise CommBenchError(f"{where} failed: rank {rank} {proc.describe_exit(code)}; "
                                 f"{hint} Last lines: " +
                                 " | ".join(tail(os.path.join(tmp, f"rank{rank}.log"))))
    return read_json(Path(tmp) / "result.json")


def tail(path: str, lines: int = 5) -> list[str]:
    """The last `lines` lines of a rank's log (of its last 8 KiB); none when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            return f.read().decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []


def measure_groups(groups, *, device: str, environ, max_bytes: int | None = None,
                   time_limit_s: float = TIME_LIMIT_S, progress=None,
                   session: Session | None = None) -> dict[tuple[int, ...], CommCurve]:
    """The curve of each group (CUDA ordinals), one group after another, by one rank per GPU of
    their union joined once (comm_worker --groups). progress(size, k, n): k counts the sizes of
    every group."""
    groups = [tuple(g) for g in groups]
    if not groups or any(len(g) < 2 for g in groups):
        raise CommBenchError(f"an all-reduce benchmark needs groups of at least 2 GPUs, got "
                             f"{[list(g) for g in groups]}; pass --gpus with two or more indices")
    union = tuple(sorted({i for g in groups for i in g}))
    rank = {gpu: r for r, gpu in enumerate(union)}
    sizes = sizes_for(device, max_bytes)
    spec = ";".join(",".join(str(rank[i]) for i in g) for g in groups)

    def at(k: int, of: int) -> None:
        if progress is not None and k >= 1:
            progress(sizes[(k - 1) % len(sizes)], k, of)
    got = run_ranks(WORKER, union, device, environ,
                    [*_worker_args(device, sizes), "--groups", spec],
                    time_limit_s=time_limit_s, what=WHAT, hint=HINT, progress=at,
                    session=session)
    if not isinstance(got, list) or len(got) != len(groups):
        raise CommBenchError(f"all-reduce benchmark over GPUs {list(union)} wrote no result; "
                             "run `smartlaunch-node bench-comm --debug` to see why")
    return {g: _curve(entry["points"], g, device, environ) for g, entry in zip(groups, got)}


def run_ranks(module: str, gpus, device: str, environ, args, *, time_limit_s: float, what: str,
              hint: str, progress=None, session: Session | None = None):
    """Ranks of `module` (start_ranks) bounded by time_limit_s, every rank ended on failure, time-
    out or success: the JSON rank 0 wrote. progress(k, n): rank 0's step messages. A signal to us
    meanwhile ends the ranks and raises proc.Interrupted."""
    with proc.stage(f"the {what}"), owned(session) as s:
        stage, tmp = start_ranks(s, module, gpus, device, environ, args, what=what)
        stage.on_step = progress
        if not s.wait(lambda: stage.over, time_limit_s):
            rank = next((r for r, c in enumerate(stage.children) if c.returncode is None), 0)
            s.kill(stage, f"rank {rank} did not finish within {time_limit_s:g} s")
        return ranks_result(stage, tmp, gpus, device, what, hint)


class Sweep:
    """The all-reduce curve of `gpus`, its ranks started now and held at their gate once joined
    (early.py releases them); the curve is cached once they have ended."""

    def __init__(self, session: Session, topology, gpus, policy, environ):
        self.session, self.gpus, self.policy, self.environ = session, tuple(gpus), policy, environ
        self.device = device_for(topology)
        self.key = comm_key(topology, self.gpus, backend_for(self.device), environ)
        self.sizes = sizes_for(self.device, None)
        self.stage, self.tmp = start_ranks(session, WORKER, self.gpus, self.device, environ,
                                           _worker_args(self.device, self.sizes), what=WHAT,
                                           gate=True)
        self.result: CommCurve | None = None
        self.finished = False

    def finish(self) -> CommCurve | None:
        """Once its ranks are over: its curve, stored in the cache (None: it failed)."""
        if not self.finished and self.stage.over:
            self.finished = True
            try:
                self.result = _curve(ranks_result(self.stage, self.tmp, self.gpus, self.device,
                                                  WHAT, HINT), self.gpus, self.device,
                                     self.environ)
                store_comm(self.policy, self.key, self.result, self.environ)
            except (CommBenchError, OSError, ValueError):
                self.result = None
        return self.result

    def stage_seconds(self) -> float:
        return (self.stage.t_end or time.monotonic()) - self.stage.t_start

    def curve(self, progress=None) -> CommCurve | None:
        self.stage.on_step = _sizes_progress(self.sizes, progress)
        with proc.stage(f"the {WHAT}"):
            self.session.wait(lambda: self.stage.over)
        return self.finish()


def rank_base_env(environ, device: str) -> dict[str, str]:
    """A benchmark rank's environment before its rank variables: the job's; gloo ranks on the CPU
    see no GPU and one thread each."""
    env = dict(environ)
    if device != "cuda":
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def comm_curve(topology, gpus, policy, environ, max_bytes: int | None = None,
               progress=None, session: Session | None = None, announce=None) -> CommCurve:
    """The cached curve for this topology, group and NCCL environment (cache.cached_comm), measured
    on a miss (gloo emulates the group without real GPUs). progress: as measure_allreduce's;
    announce(): once before measuring; neither on a hit."""
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
                              progress=progress, session=session)
    store_comm(policy, key, curve, environ)
    return curve
