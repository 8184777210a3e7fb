#!/usr/bin/env python3
"""Regret benchmark: for every suite script x link condition, measure single-GPU and DDP×N
samples/s, ask `smartlaunch --explain=json` what it would do, and score it and two peers
(always-DDP, the seeds' rule) by regret = 1 - chosen / best. See bench/README.md.

Every measurement is appended to <out>/regret-records.jsonl as soon as it ends, so a run that
is cut short loses at most the measurement in flight, and a later run resumes: measurements
already recorded successfully are skipped (--fresh re-measures). Each run, and --report-only,
then writes regret-<date>-<machine>.{md,json,png} from all the records. `python -m bench run
regret ...` keeps this invocation's measurements in bench/results/regret.jsonl (bench())."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import _record
import common
import multi_n
import report_md
from common import CONDITIONS, REPO, SMARTLAUNCH, SUITE, machine_label, read_jsonl, run

RECORDS = "regret-records.jsonl"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", default="", help="comma-separated suite ids (default: all; --list)")
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"comma-separated subset of {','.join(CONDITIONS)}")
    p.add_argument("--steps", type=int, help="timed steps for every script (default: per script)")
    p.add_argument("--warmup", type=int, help="warm-up steps for every script (default: per script)")
    p.add_argument("--nproc", default="2",
                   help="DDP sizes to measure, comma-separated (one rank per GPU): --nproc 2,3,4 "
                        "measures single and DDP×2, ×3, ×4; smartlaunch may use up to the largest")
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "bench-regret"),
                   help="working directory: its regret-records.jsonl is resumed (`python -m "
                        "bench run regret` appends the measurements to bench/results/regret.jsonl)")
    p.add_argument("--data", default=None,
                   help="with --report-only: the report from this data file of the common format "
                        "(e.g. bench/results/regret.jsonl) instead of --out's records")
    p.add_argument("--run", action="append", default=[],
                   help="with --data: only these runs (a label or its prefix; repeatable)")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per child run")
    p.add_argument("--budget", type=float, default=None,
                   help="wall seconds for the whole invocation: no run starts after it, runs are "
                        "cut at it, the report is still written")
    p.add_argument("--skip-smartlaunch", action="store_true", help="measure single/DDP only")
    p.add_argument("--warm-call", choices=("once", "all", "none"), default="once",
                   help="repeat the smartlaunch call with warm caches: for the first condition of "
                        "each script (once), for every row (all), or never")
    p.add_argument("--smartlaunch", default=None,
                   help="command that runs smartlaunch (default: this Python's smartlaunch.cli)")
    p.add_argument("--policy", default=str(REPO / "bench" / "policy-throughput.yaml"),
                   help="policy file smartlaunch decides under (default: DDP whenever faster, "
                        "the benchmark's own oracle)")
    p.add_argument("--sl-steps", type=int, default=100_000,
                   help="--steps shown to smartlaunch: it sees a long run, as a user launches one")
    p.add_argument("--extra-args", default="",
                   help="appended to every script's args; write it as --extra-args='--amp bf16'")
    p.add_argument("--tiny", action="store_true", help="toy-sized models (CPU smoke runs)")
    p.add_argument("--include-torchvision", choices=("auto", "yes", "no"), default="auto",
                   help="run the torchvision scripts (auto: when importable here)")
    p.add_argument("--machine", default=None, help="machine label (default: from NVML)")
    p.add_argument("--fresh", action="store_true", help="re-measure what is already recorded")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report")
    p.add_argument("--list", action="store_true", help="print the suite and exit")
    args = p.parse_args(argv)
    try:
        args.nprocs = multi_n.parse_nproc(args.nproc)
    except ValueError as e:
        p.error(str(e))
    return args


# ---- running children -----------------------------------------------------------------------
def script_argv(e: common.Entry, args, steps: int | None = None) -> list[str]:
    return [e.script, *e.args, "--warmup", str(args.warmup if args.warmup is not None else e.warmup),
            "--steps", str(steps if steps is not None else
                           (args.steps if args.steps is not None else e.steps)),
            *(["--tiny"] if args.tiny else []), *shlex.split(args.extra_args)]


def measure(kind: str, e: common.Entry, cond: str | None, args, timeout: float,
            nproc: int | None = None) -> dict:
    env = common.child_env(dict(os.environ), cond)
    if kind == "single":
        argv = [sys.executable, *script_argv(e, args)]
    else:
        nproc = nproc or args.nprocs[0]
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc), *script_argv(e, args)]
    res = run(argv, env, timeout)
    tp = common.parse_throughput(res["stdout"])
    rec = {"kind": kind, "script": e.id, "condition": cond, "cmd": argv[1:], "wall_s": res["wall_s"],
           **({"nproc": nproc} if kind == "ddp" else {}),
           "ok": res["rc"] == 0 and tp is not None, **(tp or {}), **common.parse_model_line(res["stdout"])}
    if not rec["ok"]:
        rec["error"] = common.run_error(res, "no throughput line" if res["rc"] == 0 else "failed")
    return rec


def decide(e: common.Entry, cond: str, args, timeout: float, warm: bool) -> dict:
    env = common.child_env(dict(os.environ), cond)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    base = shlex.split(args.smartlaunch) if args.smartlaunch else list(SMARTLAUNCH)
    # As a user with the whole node would: up to the largest size; smartlaunch picks N.
    argv = [*base, "--policy", args.policy, "--explain=json", "--nproc-per-node", str(args.nprocs[-1]),
            *script_argv(e, args, steps=args.sl_steps)]
    res = run(argv, env, timeout)
    plan = common.parse_plan(res["stdout"])
    rec = {"kind": "smartlaunch", "script": e.id, "condition": cond, "cmd": argv[len(base):],
           "wall_s": res["wall_s"], "ok": res["rc"] == 0 and plan is not None}
    if not rec["ok"]:
        rec["error"] = common.run_error(res, "no plan JSON" if res["rc"] == 0 else "failed")
        return rec
    rec.update(common.plan_summary(plan, args.nprocs[0]))
    if warm:
        again = run(argv, env, timeout)
        # The decision time that matters to a user: the whole command, caches warm.
        rec["warm_wall_s"] = again["wall_s"] if again["rc"] == 0 else None
        if again["rc"] != 0:
            rec["warm_error"] = common.run_error(again, "failed")
        else:
            plan2 = common.parse_plan(again["stdout"]) or {}
            rec["warm_choice"] = common.plan_summary(plan2, args.nprocs[0])["choice"] if plan2 else None
            rec["warm_timings"] = plan2.get("timings") or {}
    return rec


# ---- records --------------------------------------------------------------------------------
def load_records(out: Path) -> list[dict]:
    return read_jsonl(out / RECORDS)


# What the data file keeps of a record (bench/_record.py): these as conditions, the other
# scalars as figures, the plan's candidates, profile, curve and timings as detail.
CONDITION_KEYS = ("kind", "script", "condition", "nproc", "steps")


def measurement(rec: dict) -> dict:
    """One raw record of <out>/regret-records.jsonl as a measurement of the common format."""
    return _record.split(common.compact_record(rec), CONDITION_KEYS)


def records(out: Path, since: str | None = None) -> list[dict]:
    """The measurements in <out>/regret-records.jsonl (those recorded at or after `since`,
    an ISO time), in the common format."""
    return [measurement(r) for r in load_records(out)
            if not since or r.get("time", "") >= since]


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv), then the measurements this invocation made."""
    args = parse_args(argv)
    since = dt.datetime.now().isoformat(timespec="seconds")
    main(argv)
    return [] if args.report_only or args.list else records(Path(args.out), since)


def append_record(out: Path, rec: dict) -> None:
    with open(out / RECORDS, "a") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")


def write_report(records: list[dict], out: Path, conditions=tuple(CONDITIONS)) -> list[Path]:
    """regret-<date>-<machine>.md/.json (and .png when matplotlib is there) from all records."""
    if not records:
        return []
    machines = sorted({r.get("machine", "?") for r in records})
    meta = {"machine": "+".join(machines), "date": max(r.get("date", "") for r in records),
            "records": len(records)}
    rows = common.build_rows(records, conditions)
    base = [r["wall_s"] for r in records if r["kind"] == "baseline" and r.get("ok")]
    summary = common.summarize(rows, min(base) if base else None,
                               [(r.get("time", ""), r["wall_s"]) for r in records
                                if r["kind"] == "baseline" and r.get("ok")])
    stem = out / f"regret-{meta['date']}-{meta['machine']}"
    md = report_md.render_markdown(rows, summary, meta)
    paths = [stem.with_suffix(".md"), stem.with_suffix(".json")]
    try:
        import plot
        paths.append(plot.plot_speedups(rows, stem.with_suffix(".png"),
                                        f"{meta['machine']} {meta['date']}"))
    except ImportError as e:
        md += f"\nPlot not drawn: {e}.\n"
    paths[0].write_text(md)
    paths[1].write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows},
                                   indent=1, sort_keys=True, default=str))
    return paths


# ---- the run --------------------------------------------------------------------------------
def selected(args) -> list[common.Entry]:
    entries = [common.entry(s) for s in args.scripts.split(",") if s] or list(SUITE)
    tv = args.include_torchvision
    if tv == "auto":
        import importlib.util
        tv = "yes" if importlib.util.find_spec("torchvision") else "no"
    return [e for e in entries if tv == "yes" or not e.torchvision]


def run_suite(args, out: Path) -> None:
    conds = [c for c in args.conditions.split(",") if c]
    for c in conds:
        if c not in CONDITIONS:
            raise SystemExit(f"unknown condition {c!r}; choose from {', '.join(CONDITIONS)}")
    entries = selected(args)
    machine = args.machine or machine_label()
    stamp = {"machine": machine, "date": dt.date.today().isoformat()}
    done = set() if args.fresh else {k for k, r in common.latest(load_records(out)).items() if r.get("ok")}
    t_start = time.perf_counter()

    def left() -> float:
        return float("inf") if args.budget is None else args.budget - (time.perf_counter() - t_start)

    def record(rec: dict) -> None:
        rec.update(stamp, time=dt.datetime.now().isoformat(timespec="seconds"))
        append_record(out, rec)
        if not rec["ok"]:
            msg = rec.get("error")
        elif rec["kind"] == "smartlaunch":
            msg = (f"{rec['choice']}×{rec['nproc_per_node']} predicted={rec['predicted_speedup']} "
                   f"{rec['wall_s']:.1f} s, warm {rec.get('warm_wall_s') or float('nan'):.2f} s")
        elif rec["kind"] == "baseline":
            msg = f"python + torch import {rec['wall_s']:.2f} s"
        else:
            msg = f"{rec['samples_per_s']:.1f} samples/s, step {rec['step_ms']:.2f} ms"
        print(f"[{time.perf_counter() - t_start:6.0f}s] {multi_n.label(rec):11} {rec['script']:18} "
              f"{rec['condition'] or '-':8} {msg}", flush=True)

    if ("baseline", "-", None) not in done:
        # What any Python launcher pays before deciding anything: start-up plus torchrun's imports.
        # Best of 3: the first import on a fresh machine also pays a cold file cache.
        res = [run([sys.executable, "-c", "import torch, torch.distributed.run"],
                   common.child_env(dict(os.environ), None), 60) for _ in range(3)]
        record({"kind": "baseline", "script": "-", "condition": None,
                "wall_s": min(r["wall_s"] for r in res),
                "ok": all(r["rc"] == 0 for r in res), "samples_per_s": 0.0})
    for e in entries:
        todo = [("single", None, None)]
        for c in conds:
            todo += [("ddp", c, n) for n in args.nprocs]
            todo += [] if args.skip_smartlaunch else [("smartlaunch", c, None)]

        def key(kind, cond, n):
            return (multi_n.ddp_label(n) if kind == "ddp" else kind, e.id, cond)
        # A speedup is a ratio from one invocation: unless every single/DDP measurement of
        # this script is already recorded, measure them all again.
        measured = all(key(*t) in done for t in todo if t[0] != "smartlaunch")
        for kind, cond, n in todo:
            if key(kind, cond, n) in done and (kind == "smartlaunch" or measured):
                continue
            if left() < 15:
                print(f"budget spent; stopping before {kind}{n or ''} {e.id} {cond or ''}",
                      flush=True)
                return
            timeout = min(args.timeout, left() - 5)
            if kind == "smartlaunch":
                warm = args.warm_call == "all" or (args.warm_call == "once" and cond == conds[0])
                record(decide(e, cond, args, timeout, warm=warm))
            else:
                record(measure(kind, e, cond, args, timeout, n))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for e in SUITE:
            print(f"{e.id:18} {' '.join(script_argv(e, args))}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only and args.data:
        for p in write_report(read_jsonl(Path(args.data), args.run), out):
            print(f"wrote {p}")
        return 0
    try:
        if not args.report_only:
            run_suite(args, out)
    finally:
        for p in write_report(load_records(out), out):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
