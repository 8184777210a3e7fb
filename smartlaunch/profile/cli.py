"""`smartlaunch-node bench-comm` (fills the node's all-reduce cache: the whole group, then each
pair) and `smartlaunch-node profile` (an entrypoint's ModelProfile as JSON)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from smartlaunch.errors import UsageError

SHOW_SIZES = (1 << 20, 16 << 20, 64 << 20, 256 << 20)


def register(subparsers) -> None:
    p = subparsers.add_parser("bench-comm", help="measure all-reduce over the GPUs and cache it")
    p.add_argument("--gpus", type=_gpu_list, default=None,
                   help="comma-separated GPU indices (default: all)")
    p.add_argument("--no-pairs", action="store_true", help="only the whole group, not each pair")
    p.add_argument("--max-mb", type=_mib, default=None, help="largest message (MiB); default 256")
    p.add_argument("--policy", default=None, help="policy file (for paths.cache_dir)")
    p.add_argument("--json", action="store_true", help="print the curves as JSON")
    p.add_argument("--node-cache", metavar="DIR", default=None,
                   help="also write each curve under DIR/comm/, readable by every user's launch "
                        "(the Slurm prolog passes its state directory; policy paths.node_cache)")
    p.set_defaults(func=bench_comm)

    q = subparsers.add_parser("profile", help="dry-run a training script and print its profile")
    q.add_argument("--module", "-m", action="store_true", help="run SCRIPT as a module")
    q.add_argument("--gpu", default=None, help="CUDA_VISIBLE_DEVICES for the dry run "
                   "(default: the first visible GPU; 'cpu' for none)")
    q.add_argument("--reprofile", action="store_true", help="ignore the cached profile")
    q.add_argument("--policy", default=None, help="policy file (dry-run limits, cache dir)")
    q.add_argument("script")
    q.add_argument("script_args", nargs=argparse.REMAINDER)
    q.set_defaults(func=profile)


def _gpu_list(text: str) -> list[int]:
    """--gpus: indices separated by commas (a bad one: one line, exit 2)."""
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        gpus = []
    if not gpus or any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of GPU indices; e.g. --gpus 0,1")
    return gpus


def _mib(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in MiB; give at least 1")
    return n


def _policy(path):
    from smartlaunch.policy.load import load_policy
    return load_policy(path, environ=os.environ)


def bench_comm(args) -> int:
    from smartlaunch.profile.cache import nccl_env, store_node_comm
    from smartlaunch.profile.comm import comm_curve
    from smartlaunch.topology import discover
    topo = discover(os.environ)
    policy = _policy(args.policy)
    known = [g.index for g in topo.gpus]
    gpus = known if args.gpus is None else args.gpus
    unknown = sorted(set(gpus) - set(known))
    if unknown:
        raise UsageError(f"GPUs {unknown} are not visible (visible: {known}); fix --gpus")
    if len(gpus) < 2:
        raise UsageError(f"bench-comm needs at least 2 GPUs, this node shows {known}; "
                         "nothing to measure")
    # a shared place: never made from a typo, never written through a link
    if args.node_cache and (os.path.islink(args.node_cache) or not os.path.isdir(args.node_cache)):
        raise UsageError(f"--node-cache {args.node_cache} is not a directory; give the node's "
                         f"state directory (the Slurm prolog's), which must exist")
    groups = [tuple(gpus)]
    if not args.no_pairs and len(gpus) > 2:
        groups += [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    max_bytes = args.max_mb << 20 if args.max_mb else None
    curves = [comm_curve(topo, g, policy, os.environ, max_bytes=max_bytes) for g in groups]
    if args.node_cache:
        for c in curves:
            store_node_comm(args.node_cache, topo, c, os.environ)
    if args.json:
        print(json.dumps([c.to_dict() for c in curves], indent=2))
        return 0
    # measured sizes only: no extrapolated guess
    top = curves[0].points[-1][0]
    shown = [s for s in SHOW_SIZES if s <= top] or [p[0] for p in curves[0].points][-4:]
    print(f"{'GPUs':<16}{'backend':<8}{'latency':>10}  " + "".join(
        f"{_mb(s):>12}" for s in shown) + "   (bus bandwidth, GB/s)")
    for c in curves:
        row = "".join(f"{c.bus_bandwidth_Bps(s) / 1e9:>12.2f}" for s in shown)
        src = " (cached)" if c.cached else ""
        smallest = c.points[0][1]          # the fit's intercept only where it is a latency
        lat = c.latency_s if 0 < c.latency_s <= smallest else smallest
        mark = "" if lat == c.latency_s else "*"
        print(f"{','.join(map(str, c.gpus)):<16}{c.backend:<8}{lat * 1e6:>8.0f}us{mark:<1} "
              f"{row}{src}")
    if any(not 0 < c.latency_s <= c.points[0][1] for c in curves):
        print(f"* the time of the smallest size measured ({_mb(curves[0].points[0][0])}): the "
              f"fit's latency was not one")
    nccl = nccl_env(os.environ)
    if nccl:
        print("NCCL environment: " + " ".join(f"{k}={v}" for k, v in sorted(nccl.items())))
    return 0


def _mb(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def profile(args) -> int:
    from smartlaunch.profile.cache import profile_entrypoint
    from smartlaunch.request import Request
    if not args.module and not os.path.isfile(args.script):
        raise UsageError(f"no such file: {args.script}; give the training script's path (or -m "
                         f"for a module)")
    policy = _policy(args.policy)
    gpu, model = _gpu(args.gpu)
    req = Request(script=args.script, script_args=tuple(args.script_args), module=args.module,
                  reprofile=args.reprofile)
    prof = profile_entrypoint(req, policy, gpu=gpu, gpu_model=model, environ=os.environ)
    print(prof.to_json())
    print(f"smartlaunch-node: {prof.status.value}: {prof.note}", file=sys.stderr)
    return 0


def _gpu(choice: str | None) -> tuple[str | None, str]:
    """(CUDA_VISIBLE_DEVICES for the child, GPU model for the cache key)."""
    if choice == "cpu":
        return None, "cpu"
    from smartlaunch.topology import discover
    topo = discover(os.environ)
    if not topo.gpus:
        return None, "cpu"
    gpu = topo.gpus[0] if choice is None else next(
        (g for g in topo.gpus if str(g.index) == choice), None)
    if gpu is None:
        raise UsageError(f"--gpu {choice} is not visible (visible: {[g.index for g in topo.gpus]})")
    if topo.source != "nvml":
        return None, gpu.name  # a fake topology: its GPUs do not exist, profile on the CPU
    return gpu.uuid, gpu.name
