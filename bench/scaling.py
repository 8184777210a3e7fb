#!/usr/bin/env python3
"""DDP×N against the cost model on one node: measured speedups and the inputs the model takes.

Per link condition, the all-reduce curve of every group size (`smartlaunch-node bench-comm`,
measured, never derived). Per script, its profile (`smartlaunch-node profile --reprofile`: the
dry run a cold decision runs), then per condition one `torchrun --nproc-per-node W` launch in
the harness's --scaling mode: single, DDP×2, ... DDP×W measured in interleaved windows of one
job (bench/suite/_harness.py `scaling`), so every size of a row shares the launch, the GPUs'
state and the drift. Records go to <out>/records.jsonl as each run ends; the report
(`--report`) replays the cost model on them.

    python bench/scaling.py --scripts cnn-small-b128,gpt-124m-b8 --out $OUT/scaling --budget 540
    python bench/scaling.py --report OUT.md records.jsonl [...]
    python bench/scaling.py --tiny --fake-world 4 --scripts cnn-small-b128 --out /tmp/sc  # CPU
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from smartlaunch.decide.cost import CostModel, predict_ddp  # noqa: E402
from smartlaunch.profile.api import CommCurve, ModelProfile  # noqa: E402

NODE = (sys.executable, "-m", "smartlaunch.node_cli")


def torchrun() -> tuple[str, ...]:
    return (sys.executable, "-m", "torch.distributed.run")


def gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


def measure(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = out / "records.jsonl"
    t_start = time.monotonic()
    world = args.fake_world or gpu_count()
    if world < 2:
        print("scaling: needs 2 or more GPUs (or --fake-world on CPU)", file=sys.stderr)
        return 2
    sizes = [n for n in (int(x) for x in args.ns.split(",")) if n <= world]
    label = common.machine_label()

    def left() -> float:
        return args.budget - (time.monotonic() - t_start)

    def emit(rec: dict) -> None:
        rec.update(machine=label, time=time.strftime("%Y-%m-%dT%H:%M:%S"), run=args.run)
        with records.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    base = dict(os.environ)
    base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if args.fake_world:
        base["CUDA_VISIBLE_DEVICES"] = ""
    conditions = args.conditions.split(",")
    if args.calibrate:
        for cond in conditions:
            if left() < 60:
                break
            path = out / f"calibration-{cond}.json"
            res = common.run([*NODE, "calibrate", "--gpus", "0,1", "--out", str(path)],
                             common.child_env(base, cond), min(120, left()))
            record = json.loads(path.read_text()) if res["rc"] == 0 and path.exists() else None
            emit({"kind": "calibration", "condition": cond, "record": record,
                  "wall_s": round(res["wall_s"], 2),
                  "error": None if record else common.run_error(res, "calibrate")})
            print(f"calibration {cond}: {res['wall_s']:.1f} s", flush=True)
    if not args.skip_curves:
        for cond in conditions:
            for n in sizes:
                if n < 2 or left() < 20:
                    continue
                gpus = ",".join(map(str, range(n)))
                res = common.run([*NODE, "bench-comm", "--gpus", gpus, "--no-pairs", "--json"],
                                 common.child_env(base, cond), min(120, left()))
                curve = None
                if res["rc"] == 0:
                    try:
                        curve = json.loads(res["stdout"])[0]
                    except (ValueError, IndexError):
                        pass
                emit({"kind": "curve", "condition": cond, "n": n, "curve": curve,
                      "wall_s": round(res["wall_s"], 2),
                      "error": None if curve else common.run_error(res, "bench-comm")})
                print(f"curve {cond} ×{n}: {res['wall_s']:.1f} s", flush=True)
    for item in args.scripts.split(","):
        sid, _, only = item.partition("@")       # "script@host": that condition only
        e = common.entry(sid)
        script_args = list(e.args) + (["--tiny"] if args.tiny else [])
        if left() < 40:
            print(f"budget: {sid} not started", flush=True)
            break
        res = common.run([*NODE, "profile", "--reprofile", e.script, *script_args,
                          "--warmup", str(e.warmup), "--steps", "100000"],
                         common.child_env(base, None), min(180, left()))
        try:
            prof = json.loads(res["stdout"])
        except ValueError:
            prof = None
        emit({"kind": "profile", "script": sid, "profile": prof, "wall_s": round(res["wall_s"], 2),
              "error": None if prof else common.run_error(res, "profile")})
        print(f"profile {sid}: {res['wall_s']:.1f} s", flush=True)
        for cond in ([only] if only else conditions):
            for n in sizes:
                if n < 2 or left() < 30:
                    continue
                argv = [*torchrun(), "--standalone", "--nproc-per-node", str(n), e.script,
                        *script_args, "--warmup", str(e.warmup), "--scaling", f"1,{n}",
                        "--scaling-rounds", str(args.rounds),
                        "--scaling-window-s", str(args.window_s)]
                res = common.run(argv, common.child_env(base, cond), min(args.run_timeout, left()))
                line = next((x for x in res["stdout"].splitlines()
                             if x.startswith("scaling: ")), None)
                got = json.loads(line[len("scaling: "):]) if line else None
                emit({"kind": "scaling", "script": sid, "condition": cond, "n": n, "result": got,
                      "wall_s": round(res["wall_s"], 2),
                      "error": None if got else (
                          "scaling run: exit 0 without a 'scaling:' line (the script ignores "
                          "--scaling)" if res["rc"] == 0 else common.run_error(res, "scaling run"))})
                print(f"scaling {sid} {cond} ×{n}: {res['wall_s']:.1f} s", flush=True)
                if res["timed_out"]:
                    print(res["stderr"][-3000:], flush=True)
                    print("a scaling run timed out: stopping here", flush=True)
                    return report([records], Path(args.report_to)) if args.report_to else 1
    if args.report_to:
        return report([records], Path(args.report_to))
    return 0


def rows_from(paths: list[Path]) -> list[dict]:
    recs = [json.loads(x) for p in paths for x in p.read_text().splitlines() if x.strip()]
    curves = {(r["condition"], r["n"]): CommCurve.from_dict(r["curve"])
              for r in recs if r["kind"] == "curve" and r.get("curve")}
    profiles = {r["script"]: ModelProfile.from_dict(r["profile"])
                for r in recs if r["kind"] == "profile" and r.get("profile")}
    rows = []
    for r in recs:
        if r["kind"] != "scaling" or not r.get("result"):
            continue
        sizes = r["result"]["sizes"]
        t1 = statistics.median(sizes["1"]["window_ms"]) / 1e3
        for n_text, v in sizes.items():
            r.setdefault("n", int(n_text))
            n = int(n_text)
            if n == 1 or not v["window_ms"]:
                continue
            tn = statistics.median(v["window_ms"]) / 1e3
            prof = profiles.get(r["script"])
            curve = curves.get((r["condition"], n))
            rows.append({"script": r["script"], "condition": r["condition"], "n": n,
                         "t1_s": t1, "tn_s": tn, "measured": n * t1 / tn,
                         "windows_1": sizes["1"]["window_ms"], "windows_n": v["window_ms"],
                         "host_bound_1": _median(sizes["1"].get("host_bound")),
                         "profile": prof, "curve": curve})
    return rows


def _median(values) -> float | None:
    got = [v for v in values or () if v is not None]
    return statistics.median(got) if got else None


def calibrations(paths: list[Path]) -> dict[str, CostModel]:
    """Link condition -> the cost model with that condition's node calibration (records of kind
    "calibration", made by --calibrate on the machine measured), shipped constants elsewhere."""
    from smartlaunch.decide.cost import calibrated
    recs = [json.loads(x) for p in paths for x in p.read_text().splitlines() if x.strip()]
    return {r["condition"]: calibrated(CostModel(), r["record"])[0]
            for r in recs if r.get("kind") == "calibration" and r.get("record")}


def report(paths: list[Path], out: Path, model: CostModel = CostModel()) -> int:
    rows = rows_from(paths)
    node = calibrations(paths)
    lines = ["# DDP×N: measured in one launch against the cost model", "",
             f"Records: {', '.join(f'`{p}`' for p in paths)}. Measured speedup = N × single ÷ "
             "DDP×N window medians of one launch (bench/scaling.py). Predicted: "
             "smartlaunch.decide.cost.predict_ddp on the script's profile and the curve measured "
             "at N in that condition.", "",
             "| script | link | N | 1 GPU ms (profile) | DDP ms | measured | predicted | err | "
             "added ms meas / pred | comm | exposed | contention | host work / hidden | "
             "host slack (profile) | host-bound (1 GPU) |",
             "|" + "---|" * 15]
    errs = {}
    for r in rows:
        p, c = r["profile"], r["curve"]
        if p is None or not p.usable or c is None:
            pred_txt, err_txt, extra = "–", "–", "– | – | – | – | – | –"
        else:
            pr = predict_ddp(p, c, r["n"], model)
            e = pr.speedup / r["measured"] - 1
            errs.setdefault(r["n"], []).append(abs(e))
            pred_txt, err_txt = f"{pr.speedup:.2f}", f"{100 * e:+.1f}%"
            added = (r["tn_s"] - r["t1_s"]) * 1e3            # what DDP added, in this launch
            extra = (f"{added:.2f} / {(pr.step_s - p.step_time_s) * 1e3:.2f} | "
                     f"{pr.allreduce_s * 1e3:.2f} | {pr.exposed_s * 1e3:.2f} | "
                     f"{pr.contention_s * 1e3:.2f} | "
                     f"{(pr.tensors_s + model.ddp_overhead_s) * 1e3:.2f} / {pr.hidden_s * 1e3:.2f}"
                     f" | {'–' if p.host_slack_s is None else f'{p.host_slack_s * 1e3:.2f}'}")
        hb = r["host_bound_1"]
        extra += f" | {'–' if hb is None else f'{hb:.2f}'}"
        prof_ms = f" ({p.step_time_s * 1e3:.2f})" if p and p.step_time_s else ""
        lines.append(f"| {r['script']} | {r['condition']} | {r['n']} | {r['t1_s'] * 1e3:.2f}"
                     f"{prof_ms} | {r['tn_s'] * 1e3:.2f} | {r['measured']:.2f} | {pred_txt} | "
                     f"{err_txt} | {extra} |")
    node_errs: dict[int, list[float]] = {}
    if node:
        lines += ["", "With this machine's node calibration (`smartlaunch-node calibrate`, "
                  "measured before the rows, fitted on none of them):", "",
                  "| script | link | N | measured | predicted | err |", "|---|---|---|---|---|---|"]
        for r in rows:
            p, c, m = r["profile"], r["curve"], node.get(r["condition"])
            if p is None or not p.usable or c is None or m is None:
                continue
            pr = predict_ddp(p, c, r["n"], m)
            e = pr.speedup / r["measured"] - 1
            node_errs.setdefault(r["n"], []).append(abs(e))
            lines.append(f"| {r['script']} | {r['condition']} | {r['n']} | {r['measured']:.2f} | "
                         f"{pr.speedup:.2f} | {100 * e:+.1f}% |")
    lines += ["", "| constants | N | rows | median abs err | p90 abs err |",
              "|---|---|---|---|---|"]
    for name, table in (("shipped", errs), ("node calibration", node_errs)):
        for n, es in sorted(table.items()):
            es = sorted(es)
            p90 = es[min(len(es) - 1, math.ceil(0.9 * len(es)) - 1)]  # nearest rank, as README
            lines.append(f"| {name} | {n} | {len(es)} | {100 * statistics.median(es):.1f}% | "
                         f"{100 * p90:.1f}% |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def fit(paths: list[Path]) -> dict:
    """The two host-side constants (ddp_overhead_s, per_tensor_s) that minimise the squared
    |ln(predicted / measured)| over the rows, on a grid (0-3 ms by 0.1, 0-40 µs by 1); every
    other constant stays the shipped one."""
    import dataclasses
    rows = [r for r in rows_from(paths) if r["profile"] and r["profile"].usable and r["curve"]]

    def errors(model: CostModel) -> list[float]:
        return [math.log(predict_ddp(r["profile"], r["curve"], r["n"], model).speedup
                         / r["measured"]) for r in rows]
    best = None
    for o in range(31):
        for t in range(41):
            model = dataclasses.replace(CostModel(), ddp_overhead_s=o * 1e-4, per_tensor_s=t * 1e-6)
            e = errors(model)
            score = sum(x * x for x in e)
            if best is None or score < best[0]:
                best = (score, o * 1e-4, t * 1e-6, e)
    _, o, t, e = best
    rel = sorted(abs(math.expm1(x)) for x in e)
    return {"ddp_overhead_s": o, "per_tensor_s": t, "rows": len(rows),
            "scripts": sorted({r["script"] for r in rows}),
            "median_rel": statistics.median(rel), "max_rel": rel[-1],
            "per_row": [{"script": r["script"], "condition": r["condition"], "n": r["n"],
                         "measured": round(r["measured"], 4), "err": round(math.expm1(x), 4)}
                        for r, x in zip(rows, e)]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default="cnn-small-b128")
    ap.add_argument("--conditions", default="host,nvlink")
    ap.add_argument("--ns", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=1.0)
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--run-timeout", type=float, default=90, help="seconds for one torchrun")
    ap.add_argument("--out", default="scaling-out")
    ap.add_argument("--run", default="scaling")
    ap.add_argument("--skip-curves", action="store_true")
    ap.add_argument("--calibrate", action="store_true",
                    help="first `smartlaunch-node calibrate` GPUs 0,1 under each condition; the "
                         "report replays the rows with those constants too")
    ap.add_argument("--tiny", action="store_true", help="toy models (CPU)")
    ap.add_argument("--fake-world", type=int, default=0, help="CPU: this many gloo ranks")
    ap.add_argument("--report-to", default="", help="write the report here after measuring")
    ap.add_argument("--report", nargs="+", default=None, metavar=("OUT.md", "RECORDS"))
    ap.add_argument("--fit", nargs="+", default=None, metavar="RECORDS",
                    help="fit ddp_overhead_s and per_tensor_s on these records; print JSON")
    args = ap.parse_args(argv)
    if args.fit:
        print(json.dumps(fit([Path(p) for p in args.fit]), indent=1))
        return 0
    if args.report:
        return report([Path(p) for p in args.report[1:]], Path(args.report[0]))
    return measure(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
