"""The all-reduce between nodes: one leader rank per node (comm_worker) with RANK = its place
among the nodes, WORLD_SIZE = the number of nodes and MASTER_PORT = a port the deciding node
published on the job's store in an `Offer`. Rank 0 writes the curve. The offer comes from an
unauthenticated store: `read_offer` checks each field against this node's own view."""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from smartlaunch import proc, wire
from smartlaunch.errors import WireError
from smartlaunch.profile.api import CommCurve
from smartlaunch.profile.cache import nccl_env, read_json
from smartlaunch.profile.comm import backend_for, rank_base_env, tail
from smartlaunch.profile.session import Session
from smartlaunch.worker_env import free_port

KEY = "internode"           # the deciding node's Offer, as JSON, on the store
TIME_LIMIT_S = 120.0        # torch's import and the group's set-up on every node, then the sweep
MB = 1 << 20
MIN_SIZE = 256 << 10
MAX_OFFER_BYTES = 64 << 10


@dataclass(frozen=True)
class Offer:
    """What every node's leader rank runs: the group's port on the deciding node, its size, the
    device and message sizes, and the decision whose environment the ranks measure in. The rank
    measures on gpus[0] when the device is "cuda"."""
    port: int
    nodes: int
    device: str                         # "cuda" | "cpu"
    sizes: tuple[int, ...]
    strategy: str
    gpus: tuple[int, ...] = ()
    link_class: str | None = None


def _top(device: str) -> int:
    return (256 if device == "cuda" else 32) * MB


def sizes_for(grad_bytes: int | None, device: str) -> tuple[int, ...]:
    """Powers of two from 256 KiB to the gradient's size (at most 256 MiB on GPUs, 32 MiB over
    gloo), at least two."""
    cap = min(_top(device), 1 << max(0, int((grad_bytes or 4 * MB) - 1).bit_length()))
    sizes = [MIN_SIZE]
    while sizes[-1] < cap:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes if len(sizes) >= 2 else sizes + [sizes[-1] * 2])


def offer(store, *, nodes: int, device: str, sizes, strategy: str, gpus=(),
          link_class: str | None = None) -> Offer:
    """The deciding node (rank 0): publish what every node's leader runs."""
    made = Offer(free_port(), nodes, device, tuple(sizes), strategy, tuple(gpus), link_class)
    store.set(KEY, json.dumps(asdict(made)))
    return made


def read_offer(raw: bytes, *, nodes: int, gpus: Collection[int], links: Collection[str],
               strategies: Collection[str]) -> Offer:
    """The Offer in `raw` as this node may run it, checked against this node's own --nnodes
    (`nodes`), GPU indices, link classes and registered units (`strategies`). Raises WireError
    naming the first field that is not."""
    def sizes(v, where):
        got = tuple(wire.integer(s, f"{where}[{i}]", MIN_SIZE, _top("cuda"))
                    for i, s in enumerate(wire.items(v, where, 16)))
        if len(got) < 2 or any(s & (s - 1) for s in got) or list(got) != sorted(set(got)):
            raise WireError(where, "not two or more increasing powers of two")
        return got

    def own_gpus(v, where):
        got = tuple(wire.integer(g, f"{where}[{i}]") for i, g in
                    enumerate(wire.items(v, where, len(gpus))))
        if not set(got) <= set(gpus) or len(set(got)) != len(got):
            raise WireError(where, f"{list(got)[:8]} is not a list of this node's GPUs "
                            f"({', '.join(map(str, sorted(gpus))) or 'none'})")
        return got

    def own_nodes(v, where):
        return wire.integer(v, where, nodes, nodes)
    got = Offer(**wire.record(Offer, wire.loads(raw, MAX_OFFER_BYTES), "offer", fields={
        "port": lambda v, w: wire.integer(v, w, 1, 65535), "nodes": own_nodes,
        "device": lambda v, w: wire.choice(v, w, ("cuda", "cpu")), "sizes": sizes,
        "strategy": lambda v, w: wire.choice(v, w, strategies), "gpus": own_gpus,
        "link_class": lambda v, w: None if v is None else wire.choice(v, w, links)}))
    if got.device == "cuda" and not got.gpus:
        raise WireError("offer.gpus", "none, for a measurement on the GPU")
    if got.sizes[-1] > _top(got.device):
        raise WireError("offer.sizes", f"{got.sizes[-1]} bytes, more than {_top(got.device)} "
                        f"on the {got.device}")
    return got


def measure(spec: Offer, rank: int, environ: Mapping[str, str], *, host: str,
            time_limit_s: float = TIME_LIMIT_S) -> CommCurve | None:
    """This node's leader: joins the group of spec.nodes ranks as `rank` (master at `host`,
    spec.port); `environ` is the rank's whole environment before its rank variables. The curve on
    rank 0, None elsewhere; RuntimeError naming the rank's last lines when it fails."""
    device = spec.device
    backend = backend_for(device)
    env = dict(rank_base_env(environ, device),
               RANK=str(rank), WORLD_SIZE=str(spec.nodes), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR=host, MASTER_PORT=str(spec.port))
    iters = 5 if device == "cuda" else 7
    with proc.stage("the all-reduce between nodes"), Session() as session:
        tmp = session.tempdir("smartlaunch-internode-")
        out, log = os.path.join(tmp, "result.json"), os.path.join(tmp, "leader.log")
        argv = [*proc.python_m("smartlaunch.profile.comm_worker"), "--backend", backend,
                "--out", out, "--sizes", ",".join(map(str, spec.sizes)),
                "--iters", str(iters), "--stat", "median",
                *(["--device-index", str(spec.gpus[0])] if device == "cuda" else [])]
        with open(log, "ab") as f:
            stage = session.start("the all-reduce between nodes",
                                  [(argv, env, {"stdout": f, "stderr": subprocess.STDOUT})])
        if not session.wait(lambda: stage.over, time_limit_s):
            session.kill(stage, f"did not finish within {time_limit_s:g} s")
        if stage.why or stage.code:
            raise RuntimeError(f"the leader rank {rank} "
                               f"{stage.why or proc.describe_exit(stage.code)}: " +
                               " | ".join(tail(log)))
        if rank != 0:
            return None
        points = read_json(Path(out))
    if not points:
        raise RuntimeError("the leader rank 0 wrote no result")
    return CommCurve.from_points(spec.nodes, backend, [tuple(p) for p in points],
                                 env=nccl_env(environ))

