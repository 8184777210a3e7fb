"""Does launching through smartlaunch cost DDP throughput? torchrun vs smartlaunch, ABAB.

For each suite model, alternately runs the same script under
    python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT ...      (A)
    smartlaunch --strategy ddp --nproc-per-node N SCRIPT ...                        (B)
for --rounds rounds, parses the `throughput: samples/s=...` line, and reports the ratio of
medians B/A per model (issue 7 wants >= 1.00 on 2x H200), with the NCCL variables and NUMA
bindings smartlaunch's plan gave the workers (from `--explain=json`).

    python bench/ddp_overhead.py --rounds 3 --out bench/results/ddp_overhead-h200
    python bench/ddp_overhead.py --tiny --models mlp-medium-b64 --rounds 1   # CPU smoke (gloo)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import common  # noqa: E402

SMARTLAUNCH = (sys.executable, "-c", "import sys; from smartlaunch.cli import main; "
               "sys.argv[0] = 'smartlaunch'; sys.exit(main())")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=None, help="suite ids (default: all runnable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--condition", default="nvlink", choices=tuple(common.CONDITIONS))
    p.add_argument("--tiny", action="store_true", help="toy-size models (CPU smoke test)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--smartlaunch", default=None, help="command that runs smartlaunch")
    p.add_argument("--out", default=None, help="path prefix: writes <out>.json and <out>.md")
    return p.parse_args(argv)


def script_argv(e: common.Entry, args) -> list[str]:
    return [e.script, *e.args, "--warmup", str(args.warmup or e.warmup), "--steps", str(args.steps or e.steps),
            *(["--tiny"] if args.tiny else [])]


def run(argv: list[str], env: dict, timeout: float) -> dict:
    t = time.monotonic()
    try:
        res = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        rc, out, err = res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, exc.stdout or "", exc.stderr or ""
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    return {"rc": rc, "stdout": out, "stderr": err, "wall_s": time.monotonic() - t}


def measure(kind: str, e: common.Entry, args, base: list[str]) -> dict:
    env = common.child_env(dict(os.environ), args.condition)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if kind == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(args.nproc), *script_argv(e, args)]
    else:
        argv = [*base, "--strategy", "ddp", "--nproc-per-node", str(args.nproc), *script_argv(e, args)]
    res = run(argv, env, args.timeout)
    tp = common.parse_throughput(res["stdout"])
    rec = {"kind": kind, "model": e.id, "wall_s": round(res["wall_s"], 2), "rc": res["rc"],
           "ok": res["rc"] == 0 and tp is not None, **(tp or {})}
    if not rec["ok"]:
        rec["error"] = (res["stderr"] or res["stdout"])[-800:]
    return rec


def launch_env(e: common.Entry, args, base: list[str]) -> dict:
    """What smartlaunch's DDP plan hands the workers: NCCL variables and NUMA bindings."""
    env = common.child_env(dict(os.environ), args.condition)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    res = run([*base, "--explain=json", "--strategy", "ddp", "--nproc-per-node", str(args.nproc),
               *script_argv(e, args)], env, args.timeout)
    plan = common.parse_plan(res["stdout"])
    if plan is None:
        return {"error": (res["stderr"] or res["stdout"])[-400:]}
    return {"env": plan.get("env", []), "numa": plan.get("numa", []), "link_class": plan.get("link_class"),
            "gpus": plan.get("gpus")}


def summarize(records: list[dict]) -> list[dict]:
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        a = [r["samples_per_s"] for r in records if r["model"] == model and r["kind"] == "torchrun" and r["ok"]]
        b = [r["samples_per_s"] for r in records if r["model"] == model and r["kind"] == "smartlaunch" and r["ok"]]
        ma, mb = (statistics.median(a) if a else None), (statistics.median(b) if b else None)
        rows.append({"model": model, "torchrun": ma, "smartlaunch": mb, "runs": (len(a), len(b)),
                     "ratio": (mb / ma) if ma and mb else None})
    return rows


def render_markdown(rows: list[dict], envs: dict, meta: dict) -> str:
    out = [f"# DDP overhead: smartlaunch vs torchrun ({meta['nproc']} ranks, {meta['condition']}, "
           f"{meta['rounds']} ABAB rounds)", "", f"{meta['when']} on {meta['host']}", "",
           "| model | torchrun samples/s | smartlaunch samples/s | ratio | runs |", "|---|---|---|---|---|"]
    def f(x, fmt="{:.2f}"):
        return "–" if x is None else fmt.format(x)
    for r in rows:
        out.append(f"| {r['model']} | {f(r['torchrun'])} | {f(r['smartlaunch'])} | "
                   f"{f(r['ratio'], '{:.3f}')} | {r['runs'][0]}/{r['runs'][1]} |")
    out += ["", "## What smartlaunch gave the workers", ""]
    for model, e in envs.items():
        env = ", ".join(f"{v['name']}={v['value']} ({v['source']})" for v in e.get("env", [])) or "none"
        numa = "; ".join(f"rank {b['local_rank']}: GPU {b['gpu']} node {b['numa_node']} {b['mechanism']}"
                         f"{' (' + b['note'] + ')' if b.get('note') else ''}" for b in e.get("numa", [])) or "none"
        out.append(f"- {model}: link {e.get('link_class')}; env: {env}; NUMA: {numa}"
                   + (f"; error: {e['error']!r}" if e.get("error") else ""))
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    base = shlex.split(args.smartlaunch) if args.smartlaunch else list(SMARTLAUNCH)
    have_tv = importlib.util.find_spec("torchvision") is not None
    entries = [common.entry(m) for m in args.models] if args.models else \
        [e for e in common.SUITE if have_tv or not e.torchvision]
    records, envs = [], {}
    for e in entries:
        envs[e.id] = launch_env(e, args, base)
        for rnd in range(args.rounds):
            for kind in ("torchrun", "smartlaunch"):          # ABAB
                rec = measure(kind, e, args, base)
                rec["round"] = rnd
                records.append(rec)
                print(f"{e.id} round {rnd} {kind}: "
                      f"{rec.get('samples_per_s', 'FAILED')} samples/s", file=sys.stderr, flush=True)
    rows = summarize(records)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": os.uname().nodename, "nproc": args.nproc,
            "condition": args.condition, "rounds": args.rounds, "tiny": args.tiny}
    md = render_markdown(rows, envs, meta)
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows, "launch_env": envs,
                                                        "records": records}, indent=2))
        Path(f"{args.out}.md").write_text(md)
    return 0 if all(r["ratio"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
