"""Two independent jobs vs one job on one GPU (issue #8: >= 1.9x aggregate samples/s for the
suite's models under 30M parameters, on 2x H200).

    python bench/independent_bench.py [--scripts mlp-medium-b64,cnn-small-b128] [--out DIR]
                                      [--steps-scale 5] [--budget S]
    OMP_NUM_THREADS=1 python bench/independent_bench.py --tiny --steps-scale 1 --out /tmp/ib  # CPU smoke

Per suite script (bench/common.py SUITE):
  1. single: `python script ARGS --seed 0` alone, CUDA_VISIBLE_DEVICES=<first GPU>;
  2. pair:   `smartlaunch --strategy independent --nproc-per-node 2 --each "--seed 0"
             --each "--seed 1" script ARGS`: two copies at once, one per GPU (leased);
then ratio = (samples/s of job 0 + job 1) / samples/s of single. Each script prints
`throughput: samples/s=<x> ...` (bench/suite/_harness.py); the pair's numbers come from the
job logs smartlaunch names on stderr. Steps are the suite's x --steps-scale (default 5) so the
two timed regions overlap although the jobs start a few hundred ms apart; the report gives
each job's wall time so a non-overlapping pair shows.

Writes <out>/independent-<date>-<machine>.json and .md (rows so far, after every script).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import common  # noqa: E402
from common import SMARTLAUNCH, run  # noqa: E402  (one child runner: own session, killpg on timeout)

SMALL_PARAMS = 30_000_000
GOAL = 1.9
_JOB_LOG = re.compile(r"job (\d+) started on (GPU \d+|CPU) \(pid \d+\): .*; log (\S.*)$", re.M)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", default="", help="comma-separated suite ids (default: all)")
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "bench-independent"),
                   help="where independent-<date>-<machine>.json/.md go")
    p.add_argument("--steps-scale", type=float, default=5.0, help="suite steps x this")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per child run")
    p.add_argument("--budget", type=float, default=None, help="start no script after S seconds")
    p.add_argument("--gpu", default="0", help="GPU of the single run (CUDA ordinal)")
    p.add_argument("--tiny", action="store_true", help="toy-sized models on the CPU (smoke run)")
    p.add_argument("--include-torchvision", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--machine", default=None, help="machine label (default: GPU name or host)")
    return p.parse_args(argv)


def script_args(e: common.Entry, args) -> list[str]:
    steps = max(1, int(round(e.steps * args.steps_scale)))
    tiny = ["--tiny"] if args.tiny and e.script.startswith("bench/suite/") else []   # train.py has no --tiny
    return [*e.args, "--warmup", str(e.warmup), "--steps", str(steps), *tiny]


def job_logs(stderr: str) -> dict[int, tuple[str, str]]:
    """{job index: (where, log path)} from smartlaunch's 'job N started on ...' lines."""
    return {int(m[1]): (m[2], m[3].strip()) for m in _JOB_LOG.finditer(stderr)}


def measure_single(e: common.Entry, args) -> dict:
    env = common.child_env(dict(os.environ), None)
    if not args.tiny:
        env["CUDA_VISIBLE_DEVICES"] = args.gpu
    res = run([sys.executable, e.script, *script_args(e, args), "--seed", "0"], env, args.timeout)
    tp = common.parse_throughput(res["stdout"])
    out = {"ok": res["rc"] == 0 and tp is not None, "wall_s": round(res["wall_s"], 2),
           **common.parse_model_line(res["stdout"])}
    if tp:
        out["samples_per_s"] = tp["samples_per_s"]
    else:
        out["error"] = _tail(res)
    return out


def measure_pair(e: common.Entry, args) -> dict:
    env = common.child_env(dict(os.environ), None)
    argv = [*SMARTLAUNCH, "--strategy", "independent", "--nproc-per-node", "2",
            "--each", "--seed 0", "--each", "--seed 1", e.script, *script_args(e, args)]
    res = run(argv, env, args.timeout)
    logs = job_logs(res["stderr"])
    jobs = []
    for i in sorted(logs):
        where, path = logs[i]
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            text = ""
        tp = common.parse_throughput(text)
        jobs.append({"job": i, "where": where, "log": path,
                     "samples_per_s": tp["samples_per_s"] if tp else None})
    summary = _summary_json(logs)
    for j in jobs:
        j["wall_s"] = next((s["wall_s"] for s in summary.get("jobs", []) if s["index"] == j["job"]), None)
    ok = res["rc"] == 0 and len(jobs) == 2 and all(j["samples_per_s"] for j in jobs)
    out = {"ok": ok, "wall_s": round(res["wall_s"], 2), "jobs": jobs, "cmd": shlex.join(argv[len(SMARTLAUNCH):])}
    if ok:
        out["samples_per_s"] = sum(j["samples_per_s"] for j in jobs)
        out["same_device"] = jobs[0]["where"] == jobs[1]["where"]
    else:
        out["error"] = _tail(res)
    return out


def _summary_json(logs) -> dict:
    if not logs:
        return {}
    path = Path(next(iter(logs.values()))[1]).parent / "summary.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _tail(res: dict) -> str:
    if res["timed_out"]:
        return f"timed out after {res['wall_s']:.0f} s"
    lines = (res["stderr"].strip() or res["stdout"].strip()).splitlines()[-3:]
    return f"rc={res['rc']}: " + " | ".join(x.strip()[:300] for x in lines)


def row(e: common.Entry, single: dict, pair: dict) -> dict:
    ratio = pair["samples_per_s"] / single["samples_per_s"] if single.get("ok") and pair.get("ok") else None
    params = single.get("params")
    small = params is not None and params < SMALL_PARAMS
    return {"id": e.id, "params": params, "batch": single.get("batch"), "single": single, "pair": pair,
            "ratio": ratio, "small": small,
            "meets_goal": (ratio >= GOAL) if (ratio is not None and small) else None}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Two independent jobs vs one GPU — {meta['machine']}, {meta['date']}", "",
             f"Aggregate samples/s of two copies run at once by `smartlaunch --strategy independent` "
             f"(one per GPU) over one copy alone. Goal: >= {GOAL}x for models under 30M parameters. "
             f"Steps: suite x {meta['steps_scale']}.", "",
             "| script | params | single samples/s | job 0 | job 1 | aggregate | ratio | goal | job walls (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, p = r["single"], r["pair"]
        jobs = p.get("jobs", [])
        sps = [f"{j['samples_per_s']:.1f}" if j.get("samples_per_s") else "–" for j in jobs] + ["–", "–"]
        walls = ", ".join(f"{j['wall_s']:.1f}" for j in jobs if j.get("wall_s") is not None) or "–"
        goal = {True: "yes", False: "**no**", None: "n/a"}[r["meets_goal"]]
        lines.append(f"| {r['id']} | {_params(r['params'])} | {_num(s.get('samples_per_s'))} | {sps[0]} | {sps[1]} "
                     f"| {_num(p.get('samples_per_s'))} | {_num(r['ratio'], '{:.2f}x')} | {goal} | {walls} |")
    small = [r["ratio"] for r in rows if r["small"] and r["ratio"] is not None]
    if small:
        lines += ["", f"Models under 30M: min {min(small):.2f}x, mean {sum(small) / len(small):.2f}x over "
                      f"{len(small)} script(s); {sum(x >= GOAL for x in small)} meet {GOAL}x."]
    failed = [(r["id"], k, r[k].get("error")) for r in rows for k in ("single", "pair") if not r[k].get("ok")]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- {i} {k}: {err}" for i, k, err in failed]
    return "\n".join(lines) + "\n"


def _num(x, fmt="{:.1f}") -> str:
    return fmt.format(x) if x is not None else "–"


def _params(n) -> str:
    return "–" if n is None else f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"


def machine_label(args) -> str:
    if args.machine:
        return args.machine
    if not args.tiny:
        try:
            import pynvml
            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            name = name.decode() if isinstance(name, bytes) else name
            return f"{n}x {name.replace('NVIDIA ', '')}"
        except Exception:   # no NVML here: the host name will do
            pass
    return f"{socket.gethostname()} (cpu)" if args.tiny else socket.gethostname()


def measurement(r: dict, meta: dict) -> dict:
    """One row of the report's JSON as a measurement of the common format (bench/_record.py)."""
    s, p = r["single"], r["pair"]
    jobs = {f"job{j['job']}_sps": j.get("samples_per_s") for j in p.get("jobs", [])}
    m = {"conditions": {"script": r["id"], "steps_scale": meta.get("steps_scale"),
                        "tiny": bool(meta.get("tiny"))},
         "figures": {"params": r["params"], "batch": r["batch"],
                     "single_sps": s.get("samples_per_s"), "pair_sps": p.get("samples_per_s"),
                     **jobs, "ratio": r["ratio"], "single_wall_s": s.get("wall_s"),
                     "pair_wall_s": p.get("wall_s"), "same_device": p.get("same_device"),
                     "meets_goal": r["meets_goal"]},
         "date": meta["date"]}
    if not (s.get("ok") and p.get("ok")):
        m["error"] = str(s.get("error") or p.get("error") or "failed")
    return m


def records(path: Path) -> list[dict]:
    """The measurements of a report's JSON (independent-<date>-<machine>.json)."""
    data = json.loads(Path(path).read_text())
    return [measurement(r, data["meta"]) for r in data["rows"]]


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv), then this invocation's measurements."""
    args = parse_args(argv)
    before = set(Path(args.out).glob("independent-*.json"))
    t0 = time.time()
    main(argv)
    out = [p for p in Path(args.out).glob("independent-*.json")
           if p not in before or p.stat().st_mtime >= t0]
    return [m for p in out for m in records(p)]


def main(argv=None) -> int:
    args = parse_args(argv)
    wanted = [s for s in args.scripts.split(",") if s]
    entries = [common.entry(s) for s in wanted] if wanted else list(common.SUITE)
    tv = args.include_torchvision
    if tv == "no" or (tv == "auto" and not _has_torchvision()):
        entries = [e for e in entries if not e.torchvision]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine_label(args), "date": datetime.date.today().isoformat(),
            "steps_scale": args.steps_scale, "python": platform.python_version(), "tiny": args.tiny}
    slug = re.sub(r"[^A-Za-z0-9]+", "-", meta["machine"]).strip("-").lower()
    stem = out / f"independent-{meta['date']}-{slug}"
    t0, rows = time.monotonic(), []
    for e in entries:
        if args.budget is not None and time.monotonic() - t0 > args.budget:
            print(f"budget spent: {e.id} and later scripts not run", flush=True)
            break
        single = measure_single(e, args)
        pair = measure_pair(e, args) if single["ok"] else {"ok": False, "error": "single run failed"}
        rows.append(row(e, single, pair))
        r = rows[-1]
        print(f"{e.id}: single {_num(single.get('samples_per_s'))}  pair {_num(pair.get('samples_per_s'))}  "
              f"ratio {_num(r['ratio'], '{:.2f}x')}" + ("" if pair["ok"] else f"  ({pair.get('error') or single.get('error')})"),
              flush=True)
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        stem.with_suffix(".md").write_text(markdown(rows, meta))
    print(f"wrote {stem}.json and {stem}.md")
    return 0 if rows and all(r["pair"].get("ok") for r in rows) else 1


def _has_torchvision() -> bool:
    import importlib.util
    return importlib.util.find_spec("torchvision") is not None


if __name__ == "__main__":
    sys.exit(main())
