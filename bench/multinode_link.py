"""Where the cross-node choice flips (issue 28): two "nodes" (network namespaces joined by veth
pairs, tests/helpers_multinode.py) whose links are limited with tc to each rate in turn, and a
job whose steps compute for a fixed time (a sleep: the device works, the host waits) and
all-reduce a fixed gradient through DDP over gloo.

For each rate: smartlaunch decides on both nodes (`--explain=json`, nodes that look like GPU
nodes through a fixture, so that the deciding node dry-runs the job and measures the
all-reduce between the nodes); then the job is measured both ways on the same link, on both
nodes (DDP, world 2) and on one node (world 1); regret = best measured / chosen measured - 1.

    python bench/multinode_link.py [--rates 1gbit,10gbit] [--step-ms 100] [--grad-mb 16]
        [--out REPORT.md]                  # python -m bench run multinode-link ...

Needs root (`ip netns`, `tc`). Every namespace and process is removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers_common import fixture_path  # noqa: E402
from helpers_multinode import Cluster  # noqa: E402
from report_md import emit  # noqa: E402

FIXTURE = "pcie-phb-4070ti-pair"
TIMEOUT_S = 600


def rate_of(node) -> float:
    m = re.search(r"train: world \d+ samples/s ([\d.]+)", node.output)
    if m is None:
        raise RuntimeError(f"node {node.index}: no rate; output:\n{node.output_tail()}")
    return float(m[1])


def one_rate(root: Path, rate: str | None, job: tuple[str, ...]) -> dict:
    c = Cluster(root, 2).create()
    try:
        qdisc = c.shape(rate) if rate else "none (veth as is)"
        fake = {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path(FIXTURE)}
        t = time.monotonic()
        nodes = [c.launch(k, "--explain=json", "--nproc-per-node", "1", script=c.train,
                          job=job, env=fake) for k in range(2)]
        codes = [n.wait(TIMEOUT_S) for n in nodes]
        decide_s = time.monotonic() - t
        if codes != [0, 0]:
            raise RuntimeError("decision failed:\n" + nodes[0].output_tail())
        out = nodes[0].output
        plan = json.JSONDecoder().raw_decode(out[out.index("{"):])[0]
        why = next((r["text"] for r in plan["reasons"]
                    if r["rule"] == "multi-node: the all-reduce between nodes, measured"),
                   "no measured choice (the dry run measured no step?)")
        chosen = int(plan["nnodes"])
        both = [c.launch(k, "--nproc-per-node", "1", script=c.train, job=job) for k in range(2)]
        if [n.wait(TIMEOUT_S) for n in both] != [0, 0]:
            raise RuntimeError("the 2-node job failed:\n" + both[0].output_tail())
        one = c.launch(0, "--nproc-per-node", "1", script=c.train, job=job, nnodes=1)
        if one.wait(TIMEOUT_S) != 0:
            raise RuntimeError("the 1-node job failed:\n" + one.output_tail())
        measured = {2: rate_of(both[0]), 1: rate_of(one)}
        best = max(measured, key=measured.get)
        return {"rate": rate or "unshaped", "qdisc": qdisc, "chosen_nodes": chosen,
                "why": why, "measured_sps": measured, "best_nodes": best,
                "regret": measured[best] / measured[chosen] - 1, "decide_s": round(decide_s, 1),
                "left_running": c.left_running()}
    finally:
        c.close()


def measurement(r: dict, job: dict) -> dict:
    """One link rate's row as a measurement of the common format (bench/_record.py); job: the
    job's step_ms, grad_mb, steps and batch."""
    m = r["measured_sps"]
    two, one = m.get(2, m.get("2")), m.get(1, m.get("1"))
    return {"conditions": {"rate": r["rate"], "qdisc": r["qdisc"], **job},
            "figures": {"chosen_nodes": r["chosen_nodes"], "best_nodes": r["best_nodes"],
                        "sps_2_nodes": two, "sps_1_node": one, "regret": r["regret"],
                        "decide_s": r["decide_s"], "left_running": len(r["left_running"]),
                        "why": r["why"]}}


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv), one measurement per link rate."""
    args, rows = measure(argv)
    job = {"step_ms": args.step_ms, "grad_mb": args.grad_mb, "steps": args.steps,
           "batch": args.batch}
    return [measurement(r, job) for r in rows]


def main(argv=None) -> int:
    measure(argv)
    return 0


def measure(argv=None) -> tuple[argparse.Namespace, list[dict]]:
    """Runs every rate, prints the report (and with --out writes it and its JSON); returns the
    arguments and the rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--grad-mb", type=float, default=16.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    job = (str(args.step_ms / 1e3), str(int(args.grad_mb * (1 << 20))), str(args.steps),
           str(args.batch))
    rows = []
    with tempfile.TemporaryDirectory(prefix="sl-mnbench-") as tmp:
        for k, rate in enumerate(args.rates.split(",")):
            root = Path(tmp) / f"r{k}"
            root.mkdir()
            rows.append(one_rate(root, None if rate == "none" else rate, job))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    lines = ["# Multi-node: where the choice of nodes flips (CPU, 2 netns nodes, gloo)", "",
             f"Job: {args.step_ms:g} ms of compute a step (a sleep), {args.grad_mb:g} MiB of "
             f"gradients (DDP, gloo), batch {args.batch} a rank, {args.steps} steps (rate over "
             f"the last {args.steps - 2}). Load average at the end: "
             f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs).", "",
             "| link | qdisc | chosen | measured 2 nodes | measured 1 node | best | regret "
             "| decision s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["measured_sps"]
        lines.append(f"| {r['rate']} | {r['qdisc']} | {r['chosen_nodes']} node(s) | "
                     f"{m[2]:.2f} | {m[1]:.2f} | {r['best_nodes']} node(s) | "
                     f"{100 * r['regret']:.1f}% | {r['decide_s']} |")
    lines += ["", "Why (the deciding node's reason):", ""]
    lines += [f"- {r['rate']}: {r['why']}" for r in rows]
    lines += ["", f"Processes left running after each rate: "
                  f"{sum(len(r['left_running']) for r in rows)}."]
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    emit(lines, args.out)
    return args, rows


if __name__ == "__main__":
    sys.exit(main())
