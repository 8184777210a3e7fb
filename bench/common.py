"""What the benchmarks share: the suite, the link conditions, the child environment, the one
child runner, the parsers of what scripts and smartlaunch print, reading record files, and the
regret arithmetic.

Pure functions apart from run() (a child in its own session) and machine_label() (asks NVML):
the benchmarks run things, this module judges them, and the CPU tests exercise it on synthetic
records.
"""
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _record
import multi_n

REPO = Path(__file__).resolve().parent.parent
# smartlaunch as this Python runs it (no console script needed on a lent machine)
SMARTLAUNCH = (sys.executable, "-c", "import sys; from smartlaunch.cli import main; "
               "sys.argv[0] = 'smartlaunch'; sys.exit(main())")

# Every child on the lent H200 machines needs these (NVLink SHARP/multicast must stay off).
REQUIRED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# The same machine made to look like three interconnects. smartlaunch gets only these
# variables and must find the link's speed by measuring it.
CONDITIONS: dict[str, dict[str, str]] = {
    "nvlink": {},
    "host": {"NCCL_P2P_DISABLE": "1"},                            # through host memory
    "sockets": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},  # TCP, a slow link
}

# Removed from the parent's environment so that each child sees only its condition and a
# fresh launcher contract.
_STRIP = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_P2P_LEVEL", "NCCL_SHM_LEVEL",
          "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
          "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Entry:
    id: str
    script: str                     # relative to the repository root
    args: tuple[str, ...]           # model/batch arguments (no --steps/--warmup)
    warmup: int
    steps: int                      # sized so a single-GPU timed region is ~2 s on an H200
                                    # (0.3-0.6 s windows moved launch-bound ratios by ~20%)
    torchvision: bool = False       # cannot run where torchvision is missing (the CPU CI)
    held_out: bool = False          # not in the cost model's fit (bench/fit_cost.py)


MLP = "examples/train.py"           # the seeds' two MLPs live in the lead's example
SUITE: tuple[Entry, ...] = (
    Entry("mlp-medium-b64", MLP, ("--model", "medium", "--batch-size", "64"), 20, 1500),
    Entry("mlp-medium-b1024", MLP, ("--model", "medium", "--batch-size", "1024"), 20, 1000),
    Entry("mlp-large-b64", MLP, ("--model", "large", "--batch-size", "64"), 20, 800),
    Entry("mlp-large-b512", MLP, ("--model", "large", "--batch-size", "512"), 20, 1000),
    Entry("cnn-small-b128", "bench/suite/cnn.py", ("--batch-size", "128"), 20, 700),
    Entry("lstm-b64", "bench/suite/lstm.py", ("--batch-size", "64"), 20, 400),
    Entry("recsys-b2048", "bench/suite/recsys.py", ("--batch-size", "2048"), 20, 450),
    Entry("resnet18-b64", "bench/suite/resnet.py", ("--arch", "resnet18", "--batch-size", "64"),
          10, 150, torchvision=True),
    Entry("resnet50-b64", "bench/suite/resnet.py", ("--arch", "resnet50", "--batch-size", "64"),
          10, 60, torchvision=True),
    Entry("bert-base-b32", "bench/suite/bert.py", ("--batch-size", "32"), 10, 60),
    Entry("gpt-124m-b8", "bench/suite/gpt.py", ("--batch-size", "8"), 10, 100),
    Entry("vit-l16-b16", "bench/suite/vit.py", ("--batch-size", "16"), 5, 40, torchvision=True),
) + (
    # Held out (issue 15): families the cost model's fit never saw, written and committed with
    # the constants frozen before any of them was measured. Steps: ~1.5 s single windows.
    Entry("embbag-b4096", "bench/suite/embbag.py", ("--batch-size", "4096"), 20, 400,
          held_out=True),
    Entry("wide-mlp-b16", "bench/suite/wide_mlp.py", ("--batch-size", "16"), 20, 400,
          held_out=True),
    Entry("many-tensors-b256", "bench/suite/many_tensors.py", ("--batch-size", "256"), 10, 80,
          held_out=True),
    Entry("bn-convnet-b64", "bench/suite/bn_convnet.py", ("--batch-size", "64"), 20, 300,
          held_out=True),
    Entry("accum4-b8", "bench/suite/accum.py", ("--batch-size", "8", "--accum", "4"), 5, 70,
          held_out=True),
    Entry("frozen-head-b128", "bench/suite/frozen_head.py", ("--batch-size", "128"), 10, 120,
          held_out=True),
    Entry("mixer-bf16-b64", "bench/suite/mixer_bf16.py", ("--batch-size", "64"), 10, 100,
          held_out=True),
    Entry("hf-style-b32", "bench/suite/hf_style.py", ("--batch-size", "32"), 10, 200,
          held_out=True),
)
HELD_OUT = tuple(e.id for e in SUITE if e.held_out)
# Not in the suite (no regret or fit row): the cold decision's goal is stated for models up to
# 1B parameters, so bench/cold_decision.py times one of that size (~1.0B: 24 layers, d=1792).
# 35 steps of its 57 ms (2x H200): ~2 s, as the suite's entries are sized. Its first entry had
# 20 (1.15 s), which left the dry run (1 + 5 warm-up + 20 measured steps by default) a window
# of 19, so every cold decision of it also ran a one-GPU trial (2026-11-23: 2 x 18 s set-up).
SIZE_PROBES: tuple[Entry, ...] = (
    Entry("gpt-1b-b4", "bench/suite/gpt.py",
          ("--batch-size", "4", "--n-layer", "24", "--n-head", "16", "--n-embd", "1792"), 5, 35),
    # A slow step (~0.45 s on an H200) for the dry run's length (issue 38, item 2): 20 steps of
    # it were ~9 s of a cold decision.
    Entry("gpt-1b-b32", "bench/suite/gpt.py",
          ("--batch-size", "32", "--n-layer", "24", "--n-head", "16", "--n-embd", "1792"), 5, 12),
    # A compiled script (issue 38: its cold decision against its compile time); its first step
    # compiles, the warm-up's second may recompile (dynamic shapes), so 5 warm-up steps.
    Entry("bn-convnet-compile-b64", "bench/suite/bn_convnet.py",
          ("--batch-size", "64", "--compile"), 5, 300),
)


def entry(entry_id: str) -> Entry:
    for e in SUITE + SIZE_PROBES:
        if e.id == entry_id:
            return e
    raise KeyError(f"unknown suite entry {entry_id!r}; known: {', '.join(e.id for e in SUITE)}")


def child_env(base: dict[str, str], condition: str | None) -> dict[str, str]:
    """The parent's environment, cleaned, plus the machine's requirements and the condition.
    condition None: a single-GPU run, which never initialises NCCL."""
    env = {k: v for k, v in base.items()
           if k not in _STRIP and not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(REQUIRED_ENV)
    if condition is not None:
        env.update(CONDITIONS[condition])
    return env


# ---- running children -------------------------------------------------------------------------
def run(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run one child in its own session, from the repository root; on timeout its whole process
    group is ended (SIGTERM, then SIGKILL), so torchrun's workers go with it. Returns rc,
    stdout, stderr, wall_s and timed_out."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout))
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                out, err = "", ""
    wall = time.perf_counter() - t0
    return {"rc": proc.returncode, "stdout": out or "", "stderr": err or "", "wall_s": wall,
            "timed_out": timed_out}


def run_error(res: dict, what: str) -> str:
    """One line for a failed run(): the timeout, or what failed and its last output lines."""
    if res["timed_out"]:
        return f"timed out after {res['wall_s']:.0f} s"
    tail = (res["stderr"].strip().splitlines() or res["stdout"].strip().splitlines() or [""])[-3:]
    return f"{what} (rc={res['rc']}): " + " | ".join(t.strip()[:300] for t in tail)


def machine_label() -> str:
    """"2xH200" for this machine (bench/_record.py label), "cpu" without GPUs."""
    return _record.label(_record.machine())


def read_jsonl(path: Path, runs=()) -> list[dict]:
    """One-level records, one per line: a benchmark's own raw lines as they are, and lines of
    the common record format (bench/_record.py) flattened, only those of the given runs when
    runs are given. A missing file is none; a line cut by a kill mid-write is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if _record.is_record(rec):
            if not _record.in_runs(rec, runs):
                continue
            rec = _record.flatten(rec)
        recs.append(rec)
    return recs


# ---- what the scripts print ----------------------------------------------------------------
_THROUGHPUT = re.compile(r"^throughput: samples/s=(?P<sps>[\d.eE+-]+) per_rank=(?P<per_rank>[\d.eE+-]+)"
                         r" world=(?P<world>\d+) step_ms=(?P<step_ms>[\d.eE+-]+)\s*$", re.M)
_PARAMS = re.compile(r"\bparams=(\d+)")
_BATCH = re.compile(r"\bbatch=(\d+)")


def parse_throughput(text: str) -> dict[str, float] | None:
    """The last `throughput:` line of a run's stdout, or None."""
    found = list(_THROUGHPUT.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {"samples_per_s": float(m["sps"]), "per_rank": float(m["per_rank"]),
            "world": int(m["world"]), "step_ms": float(m["step_ms"])}


def parse_model_line(text: str) -> dict[str, int]:
    out = {}
    for key, rx in (("params", _PARAMS), ("batch", _BATCH)):
        m = rx.search(text)
        if m:
            out[key] = int(m.group(1))
    return out


# ---- what smartlaunch prints --------------------------------------------------------------
def parse_plan(text: str) -> dict[str, Any] | None:
    """The first JSON object in `smartlaunch --explain=json`'s stdout (log lines around it
    are tolerated), or None."""
    dec = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                obj, _ = dec.raw_decode(text[i:])
            except ValueError:
                continue
            if isinstance(obj, dict) and "strategy" in obj:
                return obj
    return None


def plan_summary(plan: dict[str, Any], nproc: int) -> dict[str, Any]:
    """What the benchmark needs from a Plan (docs/plan-schema.md): the effective choice
    (`ddp` only with >= 2 ranks; single and a one-job `independent` both run one GPU), the
    DDP×nproc candidate's predicted speedup, and why."""
    strategy = str(plan.get("strategy"))
    ranks = int(plan.get("nproc_per_node") or 1)
    choice = "ddp" if strategy == "ddp" and ranks >= 2 else "single"
    cand = next((c for c in plan.get("candidates") or ()
                 if c.get("strategy") == "ddp" and len(c.get("gpus") or ()) == nproc), None)
    profile = plan.get("profile") or {}
    comm = plan.get("comm") or {}
    return {
        "strategy": strategy,
        "nproc_per_node": ranks,
        "choice": choice,
        "gpus": list(plan.get("gpus") or ()),
        "predicted_speedup": cand.get("speedup") if cand else None,
        "predicted_by_trial": bool(cand.get("measured")) if cand else None,
        "candidates": [{k: c.get(k) for k in ("strategy", "gpus", "speedup", "efficiency",
                                              "measured", "chosen", "reason")}
                       for c in plan.get("candidates") or ()],
        "reasons": [r.get("text", "") for r in plan.get("reasons") or ()][:6],
        "profile_params": profile.get("total_params"),
        "profile_batch": profile.get("batch_size"),
        "profile_status": profile.get("status"),
        "profile_cached": profile.get("cached"),
        "comm_cached": comm.get("cached"),
        "link_class": plan.get("link_class"),
        "timings": plan.get("timings") or {},
        # Enough to replay the cost model offline (bench/fit_cost.py, the report's model column).
        "profile": {k: profile.get(k) for k in REPLAY_PROFILE_KEYS if k in profile},
        "comm": {k: comm.get(k) for k in ("world_size", "backend", "points", "gpus",
                                          "busbw_256MiB_GBps", "latency_us") if k in comm},
    }


_CAND_BUSBW = re.compile(r"all-reduce ([\d.]+) GB/s")
_CAND_COMM = re.compile(r"all-reduce ([\d.]+) ms costing ([\d.]+) ms of ([\d.]+) ms per step")


def compact_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A run's record as its data file keeps it (bench/_record.py): the reasons' prose left
    out, each candidate's numbers kept along with the all-reduce figures its reason states (bus
    bandwidth at the gradient size; all-reduce, its cost and the step in ms), and the child's
    command line reduced to its timed steps."""
    out = {k: v for k, v in rec.items() if k not in ("reasons", "cmd")}
    if rec.get("cmd"):
        cmd = rec["cmd"] if isinstance(rec["cmd"], list) else str(rec["cmd"]).split()
        cmd = [str(a) for a in cmd]
        steps = [b for a, b in zip(cmd, cmd[1:]) if a == "--steps"]
        if steps and steps[-1].isdigit():
            out["steps"] = int(steps[-1])
    if rec.get("candidates"):
        out["candidates"] = []
        for c in rec["candidates"]:
            why = c.get("reason") or ""
            c = {k: v for k, v in c.items() if k != "reason"}
            if m := _CAND_BUSBW.search(why):
                c["busbw_GBps"] = float(m[1])
            if m := _CAND_COMM.search(why):
                c.update(allreduce_ms=float(m[1]), allreduce_cost_ms=float(m[2]),
                         step_ms=float(m[3]))
            out["candidates"].append(c)
    return out


REPLAY_PROFILE_KEYS = ("status", "total_params", "trainable_params", "grad_bytes",
                       "num_grad_tensors", "buffer_bytes", "batch_size", "step_time_s",
                       "step_time_p90_s", "forward_s", "backward_s", "steps_measured",
                       "peak_gpu_mem_bytes", "device")


def replay_inputs(rec: dict[str, Any] | None):
    """(ModelProfile, CommCurve) a recorded smartlaunch row decided from, or None where the
    record lacks them (records before the replay fields)."""
    if not rec or not (rec.get("profile") or {}).get("step_time_s") or \
            len((rec.get("comm") or {}).get("points") or ()) < 2:
        return None
    from smartlaunch.profile.api import CommCurve, ModelProfile
    c = rec["comm"]
    return (ModelProfile.from_dict(rec["profile"]),
            CommCurve.from_points(int(c["world_size"]), c.get("backend", "nccl"), c["points"]))


def replay_n(rec: dict[str, Any] | None) -> int | None:
    """The world size of the curve a recorded plan carried (its chosen group's)."""
    inputs = replay_inputs(rec)
    return inputs[1].world_size if inputs is not None else None


def replay_model(rec: dict[str, Any] | None, model=None) -> float | None:
    """The cost model's DDP speedup for a recorded smartlaunch row (its own profile and
    all-reduce curve), whether or not a trial decided that row. None: not replayable."""
    inputs = replay_inputs(rec)
    if inputs is None:
        return None
    from smartlaunch.decide.cost import CostModel, predict_ddp
    prof, curve = inputs
    return predict_ddp(prof, curve, curve.world_size, model or CostModel()).speedup


# ---- regret -------------------------------------------------------------------------------
SEEDS_PARAMS, SEEDS_BATCH = 10_000_000, 64


def seeds_rule(params: int | None, batch: int | None) -> str | None:
    """The seeds' checklist: DDP only for a model over 10M parameters with batch >= 64."""
    if params is None or batch is None:
        return None
    return "ddp" if params > SEEDS_PARAMS and batch >= SEEDS_BATCH else "single"


def regret(choice: str | None, single: float, ddp: float) -> float | None:
    """1 - chosen / best, from samples/s measured in the same run."""
    if choice not in ("single", "ddp") or not (single > 0 and ddp > 0):
        return None
    chosen = ddp if choice == "ddp" else single
    return 1.0 - chosen / max(single, ddp)


def latest(records: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The last record per (kind, script, condition); a successful record is never replaced
    by a later failure, so a resumed run cannot erase a measurement."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in records:
        key = (multi_n.label(r), r["script"], r.get("condition"))
        if r.get("ok") or not (out.get(key) or {}).get("ok"):
            out[key] = r
    return out


def build_rows(records: list[dict[str, Any]], conditions=tuple(CONDITIONS)) -> list[dict[str, Any]]:
    """One row per script x condition measured, in suite order, with all three policies scored
    against the best of single and every DDP×N measured (bench/multi_n.py)."""
    by = latest(records)
    seen = {r["script"] for r in records if r["kind"] in ("single", "ddp", "smartlaunch")}
    order = [e.id for e in SUITE if e.id in seen] + sorted(seen - {e.id for e in SUITE})
    ns = multi_n.sizes(records) or (multi_n.LEGACY_N,)
    rows = []
    for sid in order:
        single = by.get(("single", sid, None))
        for cond in conditions:
            ddps = {n: by.get((multi_n.ddp_label(n), sid, cond)) for n in ns}
            sl = by.get(("smartlaunch", sid, cond))
            if not (any(ddps.values()) or sl):
                continue
            measured = multi_n.rates(single, ddps)
            # The legacy columns are DDP×2's (or the smallest N run): the model was fitted there.
            first = next((n for n in ns if n in measured), ns[0])
            s_sps, d_sps = measured.get(1, 0.0), measured.get(first, 0.0)
            meas = d_sps / s_sps if s_sps and d_sps else None
            sl_ok = bool(sl and sl.get("ok"))
            params = (single or {}).get("params") or (sl or {}).get("profile_params")
            batch = (single or {}).get("batch") or (sl or {}).get("profile_batch")
            pred = sl.get("predicted_speedup") if sl_ok else None
            model, model_n = (replay_model(sl), replay_n(sl)) if sl_ok else (None, None)
            model_meas = measured.get(model_n, 0.0) / s_sps if s_sps and model_n else None
            largest = max((n for n, r in ddps.items() if r), default=ns[-1])
            choices = {"smartlaunch": sl.get("choice") if sl_ok else None,
                       "always_ddp": "ddp", "seeds": seeds_rule(params, batch)}
            picked = {"smartlaunch": multi_n.choice_n(choices["smartlaunch"],
                                                      sl.get("nproc_per_node") if sl_ok else None,
                                                      largest),
                      # torchrun --nproc-per-node <all>, and the seeds' rule's DDP on every GPU
                      "always_ddp": largest,
                      "seeds": multi_n.choice_n(choices["seeds"], None, largest)}
            preds = multi_n.predicted(sl) if sl_ok else {}
            best = multi_n.oracle(measured)
            rows.append({
                "script": sid, "condition": cond, "params": params, "batch": batch,
                "single_sps": s_sps or None, "ddp_sps": d_sps or None,
                "ddp_sps_by_n": {n: measured.get(n) for n in ns},
                "measured_speedup": meas,
                "measured_speedup_by_n": {n: measured[n] / s_sps if s_sps and n in measured
                                          else None for n in ns},
                "oracle": (("ddp" if best and best > 1 else "single") if best else None),
                "oracle_n": best,
                "choice": choices, "choice_n": picked,
                "regret": {k: multi_n.regret(n, measured) for k, n in picked.items()},
                "predicted_speedup": pred,
                "predicted_speedup_by_n": preds,
                "predicted_by_trial": sl.get("predicted_by_trial") if sl_ok else None,
                "pred_error": (pred - meas) / meas if pred is not None and meas else None,
                "pred_error_by_n": {n: preds[n] * s_sps / measured[n] - 1 for n in preds
                                    if n in measured and s_sps},
                "model_speedup": model,
                "model_error": (model - model_meas) / model_meas
                if model is not None and model_meas else None,
                "decision_s": sl.get("wall_s") if sl_ok else None,
                "decision_warm_s": sl.get("warm_wall_s") if sl_ok else None,
                "decided_at": sl.get("time") if sl_ok else None,
                "decision_warm_inproc_s": (sl.get("warm_timings") or {}).get("total") if sl_ok else None,
                "profile_cached": sl.get("profile_cached") if sl_ok else None,
                "errors": {(f"ddp×{n}" if len(ns) > 1 else "ddp") if k == "ddp" else k: r.get("error")
                           for k, n, r in (("single", 1, single),
                                           *(("ddp", n, ddps[n]) for n in ns),
                                           ("smartlaunch", 0, sl))
                           if r and not r.get("ok")},
            })
    return rows


def _stats(xs: list[float]) -> dict[str, float | int | None]:
    return {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
            "median": statistics.median(xs) if xs else None, "max": max(xs) if xs else None}


def summarize(rows: list[dict[str, Any]], baseline_s: float | None = None,
              baselines: list[tuple[str, float]] = ()) -> dict[str, Any]:
    """baseline_s: wall time of `python -c "import torch, torch.distributed.run"` on the
    same machine, the floor under any Python launcher's decision time. baselines: (time,
    seconds) of each invocation's own floor; a warm call is compared with the floor its own
    invocation measured (the import time moved by 0.6 s between invocations on one machine)."""
    policies = {}
    for pol in ("smartlaunch", "always_ddp", "seeds"):
        vals = [r["regret"][pol] for r in rows if r["regret"][pol] is not None]
        policies[pol] = {**_stats(vals), "missing": len(rows) - len(vals)}
    errs = [abs(r["pred_error"]) for r in rows if r["pred_error"] is not None]
    errs_n = [abs(e) for r in rows for e in (r.get("pred_error_by_n") or {}).values()]
    model_errs = [abs(r["model_error"]) for r in rows if r.get("model_error") is not None]
    first = [r["decision_s"] for r in rows if r["decision_s"] is not None]
    cold = [r["decision_s"] for r in rows if r["decision_s"] is not None and r["profile_cached"] is False]
    warm = [r["decision_warm_s"] for r in rows if r["decision_warm_s"] is not None]
    inproc = [r["decision_warm_inproc_s"] for r in rows if r.get("decision_warm_inproc_s") is not None]
    sl, pe, wm = policies["smartlaunch"], _stats(errs), _stats(warm)
    overs = []
    for r in rows:
        if r["decision_warm_s"] is None:
            continue
        before = [sec for t, sec in sorted(baselines) if r.get("decided_at") and t <= r["decided_at"]]
        floor = before[-1] if before else baseline_s
        if floor is not None:
            overs.append(r["decision_warm_s"] - floor)
    over = statistics.median(overs) if overs else None
    goals = {
        "mean regret <= 2%": None if sl["mean"] is None else sl["mean"] <= 0.02,
        "max regret <= 8%": None if sl["max"] is None else sl["max"] <= 0.08,
        "|pred-meas|/meas <= 15%": None if pe["max"] is None else pe["max"] <= 0.15,
        # The decision's own cost: the warm command minus what `torchrun` pays to start too.
        "warm decision beyond torch's start-up <= 0.5 s": None if over is None else over <= 0.5,
    }
    if any(len(r.get("ddp_sps_by_n") or {}) > 1 for r in rows):
        # issue 17's goal with N in {1, 2, 3, 4} on one machine
        goals["max regret <= 5% (several N)"] = None if sl["max"] is None else sl["max"] <= 0.05
    if inproc:   # the plan's own clock: policy, topology, caches, decide, prepare
        goals["warm decision in-process <= 0.5 s"] = max(inproc) <= 0.5
    return {"rows": len(rows), "regret": policies, "pred_error_abs": pe,
            "pred_within_15pct": sum(e <= 0.15 for e in errs),
            "pred_error_abs_every_n": _stats(errs_n),
            "model_error_abs": _stats(model_errs),
            "model_within_15pct": sum(e <= 0.15 for e in model_errs),
            "decision_warm_over_import_s": over,
            "python_torch_import_range_s": ([min(b for _, b in baselines), max(b for _, b in baselines)]
                                            if baselines else None),
            "decision_warm_inproc_s": _stats(inproc),
            "decision_first_s": _stats(first), "decision_cold_s": _stats(cold),
            "decision_warm_s": wm, "python_torch_import_s": baseline_s, "goals": goals}
