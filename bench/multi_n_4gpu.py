#!/usr/bin/env python3
"""Issue 27's 4-GPU measurement in one or two device calls of at most 10 minutes.

Twelve rows: six scripts of different shapes x two links (host memory, NVLink). Per script
block, one after another, never two jobs at once:
  single (torchrun --nproc-per-node 1) at the start;
  per row: torchrun DDP×2, ×3, ×4; smartlaunch cold (`--explain=json`, empty cache, the
  throughput policy); smartlaunch under the default policy (same cache); a real launch,
  `smartlaunch --strategy ddp --nproc-per-node 4` (same cache), for the DDP×4 ratio;
  single again at the end (drift of the reference across the block).
Every training run prints its window in parts (`--chunks`), so a window that slows down shows.
With --check (first call), a one-GPU check first: the dry run's window (smartlaunch-node
profile) against torchrun one-GPU runs of gpt-124m-b8 with the same and with the bench's steps,
the previous bench's plain `python` single, and OMP_NUM_THREADS=1 (what torchrun gives DDP
ranks), then the dry run again.

Records are appended to <out>/records.jsonl as each run ends and the README is rebuilt after
each one (bench/multi_n_4gpu_report.py), so a call cut by the device's limit keeps what ended.
--budget: no run starts unless its estimated time fits; children are cut at the budget.
--rows 1-6 / --rows 7-12 split the work; --skip-done RECORDS skips rows a previous call finished.

    python bench/multi_n_4gpu.py --rows 1-6 --check --budget 540 --out $OUT/multi-n-4gpu
    python bench/multi_n_4gpu.py --tiny --fake-gpus 4 --rows 1 --out /tmp/mn4   # CPU
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _record
import common
import multi_n_4gpu_report as report
from common import REPO, SMARTLAUNCH

NODE_CLI = (sys.executable, "-m", "smartlaunch.node_cli")
THROUGHPUT_POLICY = REPO / "bench" / "policy-throughput.yaml"
RECORDS = "records.jsonl"

# Most information first: the disputed row (GPT, host) leads; host before NVLink in a block.
SCRIPTS = ("gpt-124m-b8", "embbag-b4096", "wide-mlp-b16", "bn-convnet-b64",
           "many-tensors-b256", "cnn-small-b128")
CONDITIONS = ("host", "nvlink")
ROWS = tuple((s, c) for s in SCRIPTS for c in CONDITIONS)        # row k is ROWS[k - 1]
# (warm-up, steps): single windows of ~1.2-1.6 s at the 2x/4x H200 step times recorded
# (gpt 17-22 ms, embbag 5.0, wide-mlp 3.7, bn-convnet 4.1, many-tensors 72, cnn 3.1).
WINDOWS = {"gpt-124m-b8": (10, 70), "embbag-b4096": (20, 280), "wide-mlp-b16": (20, 360),
           "bn-convnet-b64": (20, 360), "many-tensors-b256": (5, 20),
           "cnn-small-b128": (20, 460)}
DDP_WINDOW_S = 2.5    # DDP windows: steps cut so the window stays near this (host links are slow)
MIN_STEPS = 15
CHUNKS = 4
# Seconds per run before any was timed in this call (4x H200, 2026-11-26: single 11-15 s,
# torchrun DDP 16-23 s, cold decisions 12-36 s, a warm call ~4 s, ~15 s more with trials);
# then the mean of this call's.
ESTIMATE_S = {"single": 13.0, "ddp": 19.0, "cold": 30.0, "default": 12.0, "launch": 20.0,
              "check": 14.0, "baseline": 8.0}
RESERVE_S = 8.0       # kept at the end: the report and the tar


@dataclass(frozen=True)
class Task:
    kind: str                 # single | ddp | cold | default | launch
    script: str
    condition: str | None = None
    nproc: int | None = None
    row: int | None = None
    position: str | None = None      # single: start | end


def parse_rows(text: str, total: int = len(ROWS)) -> list[int]:
    """"1-6" -> [1..6], "1,3,7-8" -> [1, 3, 7, 8]; ValueError naming the fix."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            lo, _, hi = part.partition("-")
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"--rows {text!r}: write row numbers 1-{total}, e.g. --rows 1-6 "
                             f"or --rows 1,3,7-8") from None
        if not 1 <= a <= b <= total:
            raise ValueError(f"--rows {text!r}: rows are 1-{total} (--list shows them)")
        out += [k for k in range(a, b + 1) if k not in out]
    if not out:
        raise ValueError(f"--rows {text!r} names no row; write e.g. --rows 1-6")
    return out


def plan(rows: list[int], nprocs=(2, 3, 4), done: set[int] = frozenset(),
         decisions: list[int] = ()) -> list[Task]:
    """The runs of these rows in order: per script block (suite order above), single first,
    each row's references then its decisions and launch, single again at the end.
    decisions: rows whose smartlaunch decisions (cold, then default) run again first, alone,
    to be scored against the references of the call that measured them (--skip-done)."""
    todo = [k for k in sorted(rows) if k not in done]
    tasks: list[Task] = [Task(kind, ROWS[k - 1][0], ROWS[k - 1][1], max(nprocs), k)
                         for k in sorted(decisions) for kind in ("cold", "default")]
    for script in SCRIPTS:
        mine = [k for k in todo if ROWS[k - 1][0] == script]
        if not mine:
            continue
        tasks.append(Task("single", script, position="start"))
        for k in mine:
            cond = ROWS[k - 1][1]
            tasks += [Task("ddp", script, cond, n, k) for n in nprocs]
            tasks += [Task(kind, script, cond, max(nprocs), k)
                      for kind in ("cold", "default", "launch")]
        tasks.append(Task("single", script, position="end"))
    return tasks


def ddp_steps(steps: int, step_s: float | None, target_s: float = DDP_WINDOW_S) -> int:
    """A DDP run's steps: the script's, cut so the window stays near target_s at the step time
    this call last measured for the row (host links make DDP steps several times longer)."""
    if not step_s or step_s <= 0:
        return steps
    return max(min(steps, MIN_STEPS), min(steps, int(target_s / step_s)))


def done_rows(records: list[dict]) -> set[int]:
    """Rows whose every part a previous call recorded successfully."""
    by: dict[int, set[str]] = {}
    for r in records:
        if r.get("ok") and r.get("row"):
            by.setdefault(int(r["row"]), set()).add(report.part(r))
    need = {"ddp2", "ddp3", "ddp4", "cold", "default", "launch"}
    return {k for k, parts in by.items() if need <= parts}


class Budget:
    def __init__(self, seconds: float | None, clock=time.monotonic):
        self.clock, self.t0, self.seconds = clock, clock(), seconds
        self.walls: dict[str, list[float]] = {}

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (self.clock() - self.t0)

    def estimate(self, kind: str) -> float:
        seen = self.walls.get(kind)
        return sum(seen) / len(seen) if seen else ESTIMATE_S[kind]

    def fits(self, kind: str) -> bool:
        return self.left() - RESERVE_S >= self.estimate(kind)

    def timeout(self, cap: float) -> float:
        return max(1.0, min(cap, self.left() - RESERVE_S / 2))

    def spent(self, kind: str, wall: float) -> None:
        self.walls.setdefault(kind, []).append(wall)


def fake_topology(n: int, path: Path) -> Path:
    """An n-GPU NV18-all-pairs node made from the 2x H200 fixture (CPU runs only)."""
    src = REPO / "smartlaunch" / "topology" / "fixtures" / "h200-nv18-pair.json"
    data = json.loads(src.read_text())
    gpu = data["gpus"][0]
    data["gpus"] = [{**gpu, "index": i, "nvml_index": i, "uuid": f"{gpu['uuid'][:-2]}{i:02d}",
                     "pci_bus_id": f"00000000:{0x19 + 0x10 * i:02X}:00.0"} for i in range(n)]
    link = data["links"][0]
    data["links"] = [{**link, "a": a, "b": b} for a in range(n) for b in range(a + 1, n)]
    data["note"] = f"{n} GPUs made from h200-nv18-pair by bench/multi_n_4gpu.py (CPU tests)"
    path.write_text(json.dumps(data, indent=1))
    return path


class Runner:
    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.budget = Budget(args.budget)
        self.stamp = {"machine": args.machine or common.machine_label(),
                      "date": dt.date.today().isoformat(),
                      "call": args.call or dt.datetime.now().strftime("%H%M%S")}
        self.base = dict(os.environ)
        self.base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                                self.base.get("PYTHONPATH")]))
        if args.fake_gpus:
            self.base["SMARTLAUNCH_FAKE_TOPOLOGY"] = str(
                fake_topology(args.fake_gpus, out / f"fake-{args.fake_gpus}gpu.json"))
        self.caches = Path(tempfile.mkdtemp(prefix="mn4-cache-"))
        self.step_s: dict[tuple, float] = {}     # (script, condition) -> last DDP step (s)
        self.t_start = time.monotonic()

    # ---- children ---------------------------------------------------------------------------
    def script_args(self, script: str, steps: int | None = None, warmup: int | None = None,
                    chunks: int = CHUNKS) -> list[str]:
        e = common.entry(script)
        w, s = WINDOWS.get(script, (e.warmup, e.steps))
        if self.args.steps:
            s = self.args.steps
        return [e.script, *e.args, "--warmup", str(warmup if warmup is not None else w),
                "--steps", str(steps if steps is not None else s),
                *(["--chunks", str(chunks)] if chunks else []),
                *(["--tiny"] if self.args.tiny else [])]

    def env(self, condition: str | None, cache: Path | None = None, **extra) -> dict[str, str]:
        env = common.child_env(self.base, condition)
        if cache is not None:      # as bench/cold_decision.py: a cache of the row's own
            cache.mkdir(parents=True, exist_ok=True)
            env.update(HOME=str(cache), XDG_CACHE_HOME=str(cache / "cache"),
                       SMARTLAUNCH_LEASE_DIR=str(cache / "leases"))
        env.update(extra)
        return env

    def torchrun(self, nproc: int, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc), *args]

    def record(self, rec: dict, kind: str) -> dict:
        rec.update(self.stamp, time=dt.datetime.now().isoformat(timespec="seconds"))
        self.budget.spent(kind, rec.get("wall_s") or 0.0)
        _append(self.out, rec)
        print(f"[{time.monotonic() - self.t_start:5.0f}s] {report.describe(rec)}", flush=True)
        return rec

    def train(self, kind: str, task_fields: dict, argv: list[str], env: dict) -> dict:
        res = common.run(argv, env, self.budget.timeout(self.args.timeout))
        tp = common.parse_throughput(res["stdout"])
        rec = {**task_fields, "cmd": argv[1:], "wall_s": res["wall_s"],
               "ok": res["rc"] == 0 and tp is not None, **(tp or {}),
               **common.parse_model_line(res["stdout"]),
               "chunks_ms": report.parse_chunks(res["stdout"])}
        if not rec["ok"]:
            rec["error"] = common.run_error(res, "no throughput line" if res["rc"] == 0 else "failed")
        return self.record(rec, kind)

    def decide(self, task: Task, policy: Path | None, cache: Path) -> dict:
        argv = [*SMARTLAUNCH, *(["--policy", str(policy)] if policy else []), "--explain=json",
                "--nproc-per-node", str(task.nproc),
                *self.script_args(task.script, steps=self.args.sl_steps, chunks=0)]
        res = common.run(argv, self.env(task.condition, cache), self.budget.timeout(self.args.timeout))
        plan = common.parse_plan(res["stdout"])
        rec = {**fields(task), "policy": "throughput" if policy else "default",
               "cmd": argv[len(SMARTLAUNCH):], "wall_s": res["wall_s"],
               "ok": res["rc"] == 0 and plan is not None}
        if not rec["ok"]:
            rec["error"] = common.run_error(res, "no plan JSON" if res["rc"] == 0 else "failed")
        else:
            rec.update(common.plan_summary(plan, 2))
            prof = plan.get("profile") or {}
            rec.update(startup_s=prof.get("startup_s"), dry_run_s=prof.get("dry_run_s"),
                       step_time_s=prof.get("step_time_s"),
                       steps_measured=prof.get("steps_measured"))
        return self.record(rec, task.kind)

    # ---- the parts ----------------------------------------------------------------------------
    def baseline(self) -> None:
        res = [common.run([sys.executable, "-c", "import torch, torch.distributed.run"],
                          self.env(None), 60) for _ in range(2)]
        self.record({"kind": "baseline", "script": "-", "condition": None,
                     "wall_s": min(r["wall_s"] for r in res),
                     "ok": all(r["rc"] == 0 for r in res)}, "baseline")

    def check(self) -> None:
        """The one-GPU check: which one-GPU number to trust for gpt-124m-b8."""
        script = "gpt-124m-b8"
        w, s = WINDOWS[script]
        e = common.entry(script)
        tiny = ["--tiny"] if self.args.tiny else []
        dry = None

        def dry_run(label: str):
            if not self.budget.fits("check"):
                return None
            cache = self.caches / f"check-{label}"
            argv = [*NODE_CLI, "profile", "--gpu", "0", "--reprofile", e.script, *e.args,
                    "--warmup", str(w), "--steps", str(self.args.sl_steps), *tiny]
            res = common.run(argv, self.env(None, cache), self.budget.timeout(self.args.timeout))
            try:
                prof = json.loads(res["stdout"])
            except ValueError:
                prof = None
            rec = {"kind": "check", "variant": label, "script": script, "condition": None,
                   "cmd": argv[len(NODE_CLI):], "wall_s": res["wall_s"],
                   "ok": res["rc"] == 0 and bool(prof and prof.get("step_time_s"))}
            if rec["ok"]:
                rec.update({k: prof.get(k) for k in ("step_time_s", "step_time_p90_s",
                                                     "steps_measured", "startup_s", "batch_size",
                                                     "forward_s", "backward_s", "device")})
                rec["samples_per_s"] = prof["batch_size"] / prof["step_time_s"] \
                    if prof.get("batch_size") else None
                rec["step_ms"] = prof["step_time_s"] * 1e3
            else:
                rec["error"] = common.run_error(res, "no profile JSON" if res["rc"] == 0 else "failed")
            return self.record(rec, "check")

        def one(label: str, argv: list[str], kind: str = "check", **env):
            if not self.budget.fits(kind):
                return None
            f = {"kind": kind, "variant": label, "script": script, "condition": None}
            if kind == "single":
                f.update(position="start", check=True)
            return self.train(kind, f, argv, self.env(None, **env))

        dry = dry_run("dry run (smartlaunch-node profile)")
        n = int((dry or {}).get("steps_measured") or 30)
        # torchrun×1 with the bench's window: also this block's starting single reference
        one("torchrun×1, bench window", self.torchrun(1, self.script_args(script, chunks=8)),
            kind="single")
        one("python (the partial run's single)",
            [sys.executable, *self.script_args(script, steps=100, warmup=10, chunks=10)])
        one(f"torchrun×1, the dry run's window ({n} steps after 6)",
            self.torchrun(1, self.script_args(script, steps=n, warmup=6, chunks=3)))
        one("torchrun×1, bench window, OMP_NUM_THREADS=1",
            self.torchrun(1, self.script_args(script, chunks=8)), OMP_NUM_THREADS="1")
        dry_run("dry run again")

    def run_task(self, t: Task) -> None:
        cache = self.caches / f"row{t.row}"
        if t.kind == "single":
            self.train("single", fields(t), self.torchrun(1, self.script_args(t.script)),
                       self.env(None))
        elif t.kind == "ddp":
            w, s = WINDOWS[t.script]
            steps = ddp_steps(self.args.steps or s, self.step_s.get((t.script, t.condition)))
            rec = self.train("ddp", fields(t), self.torchrun(t.nproc, self.script_args(
                t.script, steps=steps)), self.env(t.condition))
            if rec["ok"]:
                self.step_s[(t.script, t.condition)] = rec["step_ms"] / 1e3
        elif t.kind == "cold":
            shutil.rmtree(cache, ignore_errors=True)          # cold: nothing cached
            self.decide(t, THROUGHPUT_POLICY, cache)
        elif t.kind == "default":
            self.decide(t, None, cache)
        elif t.kind == "launch":
            ddp4 = next((r for r in reversed(_load(self.out)) if r.get("row") == t.row
                         and r["kind"] == "ddp" and r.get("nproc") == t.nproc and r.get("ok")
                         and r.get("call") == self.stamp["call"]), None)
            # the same window as torchrun's DDP×4 of this row
            steps = _steps_of(ddp4["cmd"]) if ddp4 else None
            argv = [*SMARTLAUNCH, "--policy", str(THROUGHPUT_POLICY), "--strategy", "ddp",
                    "--nproc-per-node", str(t.nproc), *self.script_args(t.script, steps=steps)]
            self.train("launch", {**fields(t), "policy": "throughput"}, argv,
                       self.env(t.condition, cache))

    def go(self, tasks: list[Task]) -> str:
        """Runs the tasks in order; returns why it stopped."""
        if self.budget.fits("baseline"):
            self.baseline()
        if self.args.check:
            self.check()
        checked = {r["script"] for r in _load(self.out) if r.get("check") and r.get("ok")
                   and r.get("call") == self.stamp["call"]}
        for t in tasks:
            if t.kind == "single" and t.position == "start" and t.script in checked:
                continue                  # the check's torchrun×1 run was this block's start
            if not self.budget.fits(t.kind):
                return (f"budget: {self.budget.left():.0f} s left, {t.kind} "
                        f"{t.script} {t.condition or ''} needs ~{self.budget.estimate(t.kind):.0f} s")
            self.run_task(t)
            if t.kind in ("launch", "single"):
                write_outputs(self.out)
        return "done"


def _steps_of(cmd: list[str]) -> int | None:
    for a, b in zip(cmd, cmd[1:]):
        if a == "--steps":
            return int(b)
    return None


def fields(t: Task) -> dict:
    f = {"kind": t.kind, "script": t.script, "condition": t.condition, "row": t.row}
    if t.nproc is not None and t.kind != "single":
        f["nproc"] = t.nproc
    if t.position:
        f["position"] = t.position
    return f


def _append(out: Path, rec: dict) -> None:
    with open(out / RECORDS, "a") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")


def _load(out: Path) -> list[dict]:
    return report.load([out / RECORDS])


def write_outputs(out: Path, tar: Path | None = None) -> list[Path]:
    paths = report.write(report.load([out / RECORDS]), out)
    if tar is not None:
        with tarfile.open(tar, "w:gz") as tf:
            tf.add(out, arcname=out.name)
        paths.append(tar)
    return paths


# What the data file keeps of a record (bench/_record.py): these as conditions, the other
# scalars as figures, the window's parts and the plan's candidates and timings as detail (what
# the report reads; the plan's profile and curve stay in records.jsonl).
CONDITION_KEYS = ("kind", "script", "condition", "nproc", "row", "position", "policy", "call",
                  "variant", "check", "steps")


def measurement(rec: dict) -> dict:
    """One raw record of <out>/records.jsonl as a measurement of the common format."""
    rec = {k: v for k, v in common.compact_record(rec).items() if k not in ("profile", "comm")}
    return _record.split(rec, CONDITION_KEYS)


def records(out: Path, since: str | None = None) -> list[dict]:
    """The measurements in <out>/records.jsonl (those at or after `since`, an ISO time)."""
    return [measurement(r) for r in _load(out) if not since or r.get("time", "") >= since]


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv), then the measurements this invocation made."""
    args = parse_args(argv)
    since = dt.datetime.now().isoformat(timespec="seconds")
    main(argv)
    return [] if args.list else records(Path(args.out), since)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1-12", help="row numbers, e.g. 1-6 or 7-12 (--list)")
    p.add_argument("--out", required=False, default=None, help="output directory")
    p.add_argument("--budget", type=float, default=None,
                   help="wall seconds for this invocation: no run starts unless its estimate "
                        "fits, runs are cut at it, the report and tar are still written")
    p.add_argument("--check", action="store_true",
                   help="the one-GPU check first (gpt-124m-b8: dry run vs torchrun×1)")
    p.add_argument("--skip-done", action="append", default=[], metavar="RECORDS",
                   help="records.jsonl of an earlier call: skip the rows it finished")
    p.add_argument("--decisions", default="", metavar="ROWS",
                   help="rows whose decisions alone run again first (new code, earlier "
                        "references: give their records to the report), e.g. 1-8")
    p.add_argument("--nproc", default="2,3,4")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per child at most")
    p.add_argument("--sl-steps", type=int, default=100_000,
                   help="--steps shown to smartlaunch's decisions (a long run, as users launch)")
    p.add_argument("--steps", type=int, help="timed steps for every run (CPU smoke runs)")
    p.add_argument("--tiny", action="store_true", help="toy models (CPU)")
    p.add_argument("--fake-gpus", type=int, default=0,
                   help="smartlaunch sees this many fake NV18 GPUs (CPU runs)")
    p.add_argument("--machine", help="machine label (default: from NVML)")
    p.add_argument("--call", help="this call's label in the records (default: the time)")
    p.add_argument("--tar", help="write the output directory to this .tar.gz at the end")
    p.add_argument("--list", action="store_true", help="print the rows and the plan, then exit")
    args = p.parse_args(argv)
    try:
        args.row_list = parse_rows(args.rows) if args.rows else []
        args.decision_rows = parse_rows(args.decisions) if args.decisions else []
        import multi_n
        args.nprocs = multi_n.parse_nproc(args.nproc)
    except ValueError as e:
        p.error(str(e))
    if not args.list and not args.out:
        p.error("--out DIR is required (e.g. --out $OUT/multi-n-4gpu)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    done: set[int] = set()
    for path in args.skip_done:
        done |= done_rows(report.load([Path(path)]))
    tasks = plan(args.row_list, args.nprocs, done, args.decision_rows)
    if args.list:
        for k, (s, c) in enumerate(ROWS, 1):
            print(f"{k:2} {s:18} {c}{'  (done)' if k in done else ''}")
        est = sum(ESTIMATE_S[t.kind] for t in tasks)
        print(f"{len(tasks)} runs for rows {args.rows}, ~{est / 60:.1f} min by the estimates")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(args, out)
    why = "interrupted"
    try:
        why = runner.go(tasks)
    finally:
        print(f"stopped: {why}", flush=True)
        (out / "stopped.txt").write_text(f"{why}\n")
        for p in write_outputs(out, Path(args.tar) if args.tar else None):
            print(f"wrote {p}", flush=True)
        shutil.rmtree(runner.caches, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
