"""The all-reduce between nodes: one leader rank per node, the job's backend and environment.

Every node of a multi-node job runs one rank of the single-node benchmark
(`smartlaunch.profile.comm_worker`) with RANK = its place among the nodes, WORLD_SIZE = the
number of nodes, and MASTER_ADDR / MASTER_PORT = the deciding node's address and a port that
node chose and published on the job's store (the caller's: pipeline_nodes.py). Rank 0, on the
deciding node, writes the curve; decide/nodes.py scales it to fewer nodes. The rank is a child
of ours with a bounded wait, killed on failure or time-out like the benchmark's ranks.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

from smartlaunch import proc, ranks
from smartlaunch.profile.api import CommCurve
from smartlaunch.profile.cache import nccl_env, read_json
from smartlaunch.profile.comm import backend_for, rank_base_env
from smartlaunch.worker_env import free_port

KEY = "internode"           # the deciding node's {"addr", "port", "sizes", ...} on the store
TIME_LIMIT_S = 120.0        # torch's import and the group's set-up on every node, then the sweep
MB = 1 << 20


def sizes_for(grad_bytes: int | None, device: str) -> tuple[int, ...]:
    """Powers of two from 256 KiB to the gradient's size (at most 256 MiB on GPUs, 32 MiB
    over gloo), at least two: a DDP bucket is at most 25 MiB, a whole gradient more."""
    top = (256 if device == "cuda" else 32) * MB
    cap = min(top, 1 << max(0, int((grad_bytes or 4 * MB) - 1).bit_length()))
    sizes = [256 << 10]
    while sizes[-1] < cap:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes if len(sizes) >= 2 else sizes + [sizes[-1] * 2])


def offer(store, *, addr: str, nodes: int, device: str, sizes, env: dict[str, str],
          gpu: int | None) -> dict:
    """The deciding node (rank 0): publish what every node's leader runs."""
    spec = {"addr": addr, "port": free_port(), "nodes": nodes, "device": device,
            "sizes": list(sizes), "env": env, "gpu": gpu}
    store.set(KEY, json.dumps(spec))
    return spec


def measure(spec: dict, rank: int, environ, *, time_limit_s: float = TIME_LIMIT_S
            ) -> CommCurve | None:
    """This node's leader: joins the group of spec["nodes"] ranks as `rank`; the curve on rank
    0, None elsewhere. Raises RuntimeError naming the rank's last lines when it fails."""
    device = spec["device"]
    backend = backend_for(device)
    env = dict(rank_base_env({**environ, **spec["env"]}, device),
               RANK=str(rank), WORLD_SIZE=str(spec["nodes"]), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR=spec["addr"], MASTER_PORT=str(spec["port"]))
    iters = 5 if device == "cuda" else 7
    with proc.stage("the all-reduce between nodes"), \
            tempfile.TemporaryDirectory(prefix="smartlaunch-internode-") as tmp:
        proc.remove_on_exit(tmp)
        out = os.path.join(tmp, "result.json")
        argv = ["--backend", backend, "--out", out, "--sizes", ",".join(map(str, spec["sizes"])),
                "--iters", str(iters), "--stat", "median",
                *(["--device-index", str(spec["gpu"])] if device == "cuda" else [])]
        group: list[ranks.Rank] = []
        try:
            group = ranks.start_ranks("smartlaunch.profile.comm_worker", [argv], [env],
                                      logs=[os.path.join(tmp, "leader.log")])
            failed = ranks.wait_all(group, time_limit_s)
            if failed is not None:
                raise RuntimeError(f"the leader rank {rank} {failed[1]}: " +
                                   " | ".join(ranks.tail(group[0])))
            if rank != 0:
                return None
            points = read_json(Path(out))
        finally:
            ranks.stop_all(group, signal.SIGKILL, 0)
            proc.remove_on_exit(tmp, done=True)
    if not points:
        raise RuntimeError("the leader rank 0 wrote no result")
    return CommCurve.from_points(spec["nodes"], backend, [tuple(p) for p in points],
                                 env=nccl_env({**environ, **spec["env"]}))

