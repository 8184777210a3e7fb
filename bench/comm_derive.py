"""How far a derived all-reduce curve is from a measured one (issue 26, decide/curves.py).

    python bench/comm_derive.py [--ns 2,3,4] [--conditions nvlink,host] [--out DIR]

A cold decision measures the largest group of a kind of link and derives the smaller groups'
curves from it: a ring's bus bandwidth (algbw x 2(N-1)/N) taken as the same for every N, the
latency kept (CommCurve.for_group). This measures GPUs 0..N-1 for every N of --ns under each
link condition (bench/common.CONDITIONS; gloo ranks on the CPU where there are fewer than two
GPUs), all groups of a condition by one set of ranks joined once (comm.measure_groups), the
largest group twice to show the measurement's own noise, and reports, per N and size,
derived / measured - 1 for:

    from-largest  the largest group's curve carried down, latency kept (what decide does)
    from-pair     the pair's curve carried up, latency kept
    scaled        the largest group's, every second scaled (latency too), for comparison

and the same for a DDP step's all-reduces (the gradient split into DDP's buckets, as the
cost model sums them) at a few gradient sizes. One directory (--out) holds curves.json (every
measured point), errors.json and report.md. About 10-20 s per condition on 4 GPUs.
`python -m bench run comm-derive` keeps one record per measured curve (bench/_record.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from smartlaunch.decide.cost import CostModel  # noqa: E402
from smartlaunch.profile.api import CommCurve  # noqa: E402

MiB = 1 << 20
GRADS = (25 * MiB, 100_000_000, 500_000_000)      # a bucket; ~25M and ~125M fp32 parameters
GOAL_S = 60.0


def scaled(curve: CommCurve, gpus) -> CommCurve:
    """The comparison variant: every second scaled by 2(n-1)/n / 2(m-1)/m, latency too."""
    m, n = curve.world_size, len(gpus)
    r = ((n - 1) / n) / ((m - 1) / m)
    return CommCurve.from_points(n, curve.backend, [(s, t * r) for s, t in curve.points],
                                 gpus=tuple(gpus))


def bucketed(curve: CommCurve, grad_bytes: int) -> float:
    """A DDP step's all-reduce seconds for grad_bytes, bucket by bucket (decide/cost.py)."""
    return sum(curve.time(b) for b in CostModel().split(grad_bytes))


def compare(derived: CommCurve, measured: CommCurve) -> dict:
    """derived / measured - 1 at every measured size, and of a step's bucketed all-reduces."""
    sizes = {str(s): derived.time(s) / t - 1 for s, t in measured.points}
    step = {str(g): bucketed(derived, g) / bucketed(measured, g) - 1 for g in GRADS}
    top = measured.points[-1][0]
    return {"by_size": sizes, "by_grad": step,
            "max_abs_size": max(abs(v) for v in sizes.values()),
            "max_abs_grad": max(abs(v) for v in step.values()),
            "busbw_derived_GBps": derived.bus_bandwidth_Bps(top) / 1e9,
            "busbw_measured_GBps": measured.bus_bandwidth_Bps(top) / 1e9}


def analyse(curves: dict[int, CommCurve], repeat: CommCurve | None) -> dict:
    """Errors of every derivation among curves (N -> measured curve of GPUs 0..N-1)."""
    ns = sorted(curves)
    big, pair = curves[ns[-1]], curves.get(2)
    out: dict = {"busbw_GBps": {n: curves[n].bus_bandwidth_Bps(curves[n].points[-1][0]) / 1e9
                                for n in ns},
                 "latency_us": {n: curves[n].latency_s * 1e6 for n in ns}}
    out["from_largest"] = {n: compare(big.for_group(range(n)), curves[n]) for n in ns[:-1]}
    out["scaled"] = {n: compare(scaled(big, range(n)), curves[n]) for n in ns[:-1]}
    if pair is not None:
        out["from_pair"] = {n: compare(pair.for_group(range(n)), curves[n]) for n in ns if n > 2}
    if repeat is not None:
        out["repeat_noise"] = compare(repeat, big)
    return out


def report(results: dict, meta: dict) -> str:
    lines = [f"# Derived vs measured all-reduce curves — {meta['machine']}, {meta['date']}", "",
             f"`python bench/comm_derive.py --ns {meta['ns']} --conditions {meta['conditions']}`"
             f" ({meta['device']}, {meta['backend']}; links among GPUs "
             f"{meta['links'] or 'unknown (no NVML)'}); wall {meta['wall_s']:.1f} s "
             f"(goal {GOAL_S:.0f} s).", "",
             "Error = derived / measured − 1. `from-largest` is what a cold decision does "
             "(decide/curves.py); `repeat` is the largest group measured twice: the noise any "
             "curve has.", ""]
    for cond, res in results.items():
        lines += [f"## {cond}", "",
                  "| N | busbw at the largest size | fitted latency |", "|---|---|---|"]
        for n, bw in res["busbw_GBps"].items():
            lines.append(f"| {n} | {bw:.1f} GB/s | {res['latency_us'][n]:.0f} µs |")
        lines += ["", "| derivation | N | max abs. by size | " +
                  " | ".join(f"step all-reduce, {g / 1e6:.0f} MB grads" for g in GRADS) + " |",
                  "|---|---|---|" + "---|" * len(GRADS)]
        for name in ("from_largest", "from_pair", "scaled"):
            for n, e in res.get(name, {}).items():
                lines.append(f"| {name.replace('_', '-')} | {n} | {e['max_abs_size']:.1%} | " +
                             " | ".join(f"{e['by_grad'][str(g)]:+.1%}" for g in GRADS) + " |")
        if "repeat_noise" in res:
            e = res["repeat_noise"]
            lines.append(f"| repeat | {max(res['busbw_GBps'])} | {e['max_abs_size']:.1%} | " +
                         " | ".join(f"{e['by_grad'][str(g)]:+.1%}" for g in GRADS) + " |")
        lines.append("")
    return "\n".join(lines)


def links_among(n: int) -> str:
    try:
        from smartlaunch.topology import discover
        topo = discover(dict(os.environ))
        classes = sorted({topo.link(a, b).link_class for a in range(n) for b in range(a + 1, n)})
        return ", ".join(classes)
    except Exception:             # noqa: BLE001 - only a label in the report
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="2,3,4", help="group sizes, GPUs 0..N-1 (default 2,3,4)")
    ap.add_argument("--conditions", default="nvlink,host",
                    help="link conditions of bench/common.CONDITIONS (GPUs only)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--max-bytes", type=int, default=None, help="largest size (default 256 MiB "
                    "on GPUs, 4 MiB on the CPU)")
    ap.add_argument("--out", default=None, help="output directory (default: comm-derive-DATE-"
                    "MACHINE in the temporary directory)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import common
    from smartlaunch.profile.comm import measure_groups
    ns = sorted({int(x) for x in args.ns.split(",") if x.strip()})
    if len(ns) < 2 or ns[0] < 2:
        ap.error(f"--ns {args.ns!r}: give two or more group sizes of at least 2, e.g. 2,3,4")
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.device_count() >= ns[-1] else "cpu"
    conditions = [c for c in args.conditions.split(",") if c] if device == "cuda" else ["gloo"]
    for c in conditions:
        if device == "cuda" and c not in common.CONDITIONS:
            ap.error(f"unknown condition {c!r}; use some of {', '.join(common.CONDITIONS)}")
    date = time.strftime("%Y-%m-%d")
    machine = f"{ns[-1]}x{_gpu_name()}" if device == "cuda" else f"cpu-{platform.node()}"
    out = Path(args.out or Path(tempfile.gettempdir()) / f"comm-derive-{date}-{machine}")
    out.mkdir(parents=True, exist_ok=True)
    groups = [tuple(range(n)) for n in reversed(ns)] + [tuple(range(ns[-1]))]
    raw, results = {}, {}
    for cond in conditions:
        env = common.child_env(dict(os.environ), cond) if device == "cuda" else dict(os.environ)
        t = time.perf_counter()
        # the same ranks measure every group; the largest again last: the repeat
        got = measure_groups(groups[:-1], device=device, environ=env, max_bytes=args.max_bytes)
        again = measure_groups(groups[:1], device=device, environ=env,
                               max_bytes=args.max_bytes)[groups[0]]
        curves = {len(g): c for g, c in got.items()}
        raw[cond] = {"seconds": time.perf_counter() - t,
                     "curves": {n: c.to_dict() for n, c in curves.items()},
                     "repeat": again.to_dict()}
        results[cond] = analyse(curves, again)
        print(f"{cond}: {len(groups)} curves in {raw[cond]['seconds']:.1f} s; busbw "
              + ", ".join(f"×{n} {bw:.1f} GB/s" for n, bw in results[cond]["busbw_GBps"].items()),
              flush=True)
    wall = time.perf_counter() - t0
    meta = {"date": date, "machine": machine, "device": device,
            "backend": "nccl" if device == "cuda" else "gloo", "ns": args.ns,
            "conditions": ",".join(conditions), "wall_s": wall,
            "links": links_among(ns[-1]) if device == "cuda" else ""}
    (out / "curves.json").write_text(json.dumps({"meta": meta, "raw": raw}, indent=1))
    (out / "errors.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (out / "report.md").write_text(report(results, meta))
    print(report(results, meta))
    print(f"wrote {out}/ (curves.json, errors.json, report.md); wall {wall:.1f} s"
          + ("" if wall <= GOAL_S else f" — over the {GOAL_S:.0f} s goal"))
    return 0


def records(out: Path) -> list[dict]:
    """One measurement of the common format (bench/_record.py) per curve in <out>/curves.json:
    the bus bandwidth at its largest size and its fitted latency; for a group smaller than the
    largest, also how far the curve derived from the largest is off a DDP step's all-reduces
    (derived / measured - 1, the `from-largest` row of the report)."""
    data = json.loads((Path(out) / "curves.json").read_text())
    meta, out_ = data["meta"], []
    for cond, raw in data["raw"].items():
        curves = {int(n): CommCurve.from_dict(c) for n, c in raw["curves"].items()}
        repeat = CommCurve.from_dict(raw["repeat"])
        res = analyse(curves, repeat)
        for n, curve in [*sorted(curves.items()), (None, repeat)]:
            figures = {"busbw_GBps": curve.bus_bandwidth_Bps(curve.points[-1][0]) / 1e9,
                       "latency_us": curve.latency_s * 1e6, "max_bytes": curve.points[-1][0],
                       "condition_s": raw["seconds"], "wall_s": meta["wall_s"]}
            e = res["from_largest"].get(n) if n is not None else res.get("repeat_noise")
            if e:
                figures.update({f"{'derived' if n is not None else 'repeat'}_err_{g // 10**6}MB":
                                e["by_grad"][str(g)] for g in GRADS})
            out_.append({"conditions": {"condition": cond, "n": curve.world_size,
                                        "repeat": n is None, "backend": meta["backend"],
                                        "links": meta.get("links") or None},
                         "figures": figures, "date": meta["date"],
                         "detail": {"points": [list(p) for p in curve.points],
                                    "gpus": list(curve.gpus or ())}})
    return out_


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv) into --out (a temporary directory unless given), then
    one measurement per curve measured."""
    argv = list(argv)
    if "--out" not in argv:
        argv += ["--out", tempfile.mkdtemp(prefix="comm-derive-")]
    main(argv)
    return records(Path(argv[argv.index("--out") + 1]))


def _gpu_name() -> str:
    try:
        import torch
        name = torch.cuda.get_device_name(0)
    except Exception:             # noqa: BLE001 - a label
        return "gpu"
    return name.replace("NVIDIA ", "").split()[0]


if __name__ == "__main__":
    sys.exit(main())
