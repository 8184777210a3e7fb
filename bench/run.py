"""The benchmark suite's one entry point: run a registered benchmark and append its
measurements, one record each (bench/_record.py), to its data file.

    python -m bench list                                   # the benchmarks, what each needs
    python -m bench run [--data FILE] [--run LABEL] [--note TEXT] NAME [ARGS...]
    python -m bench smoke [--data FILE] [NAME ...]         # the CPU smoke runs (default: all)
    python -m bench show [--data FILE] [--run LABEL] NAME  # a run's records (default: latest)

(`python bench/run.py ...` is the same.) ARGS go to the benchmark's own command line (its
module's --help). Records go to bench/results/NAME.jsonl, except from smoke runs and runs
with --tiny, whose toy figures go to a temporary file unless --data names one. Each record
carries the machine (GPU model and count, CPU count), the date, the commit, this command line,
the conditions and the figures. Exit status: 0 when every measurement succeeded, 1 when one
failed or none was made, 2 for a bad command line.
"""
from __future__ import annotations

import argparse
import datetime as dt
import difflib
import importlib
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(HERE), str(REPO)):       # the modules import each other by bare name
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _record  # noqa: E402

RESULTS = HERE / "results"
TMP = "{tmp}"       # in smoke arguments: a fresh temporary directory


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str                      # a module of bench/ with bench(argv) -> measurements
    measures: str                    # one line
    smoke: tuple[str, ...] | None    # CPU smoke arguments; None: no CPU path (needs says why)
    smoke_env: dict[str, str] = field(default_factory=dict)
    needs: str = ""                  # beyond Python and torch


FAKE = {"SMARTLAUNCH_FAKE_TOPOLOGY": "h200-nv18-pair"}
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("regret", "regret",
              "single and DDP×N samples/s per suite script and link, smartlaunch's choice, "
              "regret against the best",
              ("--tiny", "--steps", "3", "--warmup", "1", "--scripts", "lstm-b64",
               "--conditions", "nvlink", "--warm-call", "none", "--out", TMP)),
    Benchmark("multi-n-4gpu", "multi_n_4gpu",
              "the world size smartlaunch picks on a 4-GPU node against torchrun ×1..×4, "
              "cold-decision time, its DDP×4 against torchrun's",
              ("--tiny", "--steps", "3", "--fake-gpus", "2", "--nproc", "2", "--rows", "2",
               "--out", TMP), needs="4 GPUs (CPU smoke: a fake node)"),
    Benchmark("comm-derive", "comm_derive",
              "all-reduce curves of 2..N GPUs measured against the ones derived from the largest",
              ("--device", "cpu", "--ns", "2,3", "--max-bytes", str(128 << 10), "--out", TMP),
              needs="4 GPUs (CPU: gloo ranks)"),
    Benchmark("cold-decision", "cold_decision",
              "a cold decision's seconds beyond the script's own start-up, by phase",
              ("--scripts", "lstm-b64", "--which", "throughput", "--fake", "h200-nv18-pair",
               "--tiny")),
    Benchmark("decision-overhead", "decision_overhead",
              "a warm-cache decision's seconds over `import torch, torch.distributed.run`",
              ("--rounds", "1", "--fake", "h200-nv18-pair")),
    Benchmark("calibrate", "calibrate_bench",
              "`smartlaunch-node calibrate`: wall time and the spread of its constants",
              ("--runs", "1", "--fake", "h200-nv18-pair")),
    Benchmark("independent", "independent_bench",
              "two independent jobs (one per GPU) against one job alone, aggregate samples/s",
              ("--tiny", "--steps-scale", "1", "--scripts", "cnn-small-b128", "--out", TMP)),
    Benchmark("isolation", "isolation_bench",
              "the dry run's sandbox: probe, wrapper start, dry run with isolation on and off",
              ("--rounds", "1"), needs="root or user namespaces"),
    Benchmark("profile-check", "profile_check",
              "the dry run's device-time step against the script's own timing",
              ("--cases", "lstm", "--own-steps", "20")),
    Benchmark("topology", "topology_bench",
              "how long discover() (the NVML topology read) takes", ("-n", "3")),
    Benchmark("wait", "wait_bench",
              "launchers queueing for two GPUs: exit latency after the job, lines written",
              ("--launchers", "4", "--job-s", "0.2")),
    Benchmark("multinode-link", "multinode_link",
              "the node count chosen across two netns 'nodes' against measured throughput, "
              "per tc-limited link rate",
              ("--rates", "1gbit", "--steps", "30", "--step-ms", "20", "--grad-mb", "1"),
              needs="root (ip netns, tc)"),
    Benchmark("multinode-gpu", "multinode_gpu",
              "the node count chosen across two GPU 'nodes' of one host (NCCL sockets) against "
              "torchrun on both and on one", None, needs="2 or more GPUs; no CPU path"),
    Benchmark("job-overhead", "job_overhead",
              "a rank's samples/s under smartlaunch against torchrun, paired rounds with a 95% "
              "interval (or the worker hook on ÷ off in one job)",
              ("--tiny", "--rounds", "1", "--scripts", "deep-mlp", "--kinds", "torchrun",
               "sl-ddp")),
    Benchmark("trial-bias", "trial_bias",
              "one script's DDP×N speedup measured five ways in a row: the trial's run-to-run "
              "spread (TRIAL_SPREAD)",
              ("--scripts", "cnn-small-b128", "--condition", "nvlink", "--extra=--tiny"),
              smoke_env=FAKE),
)
BY_NAME = {b.name: b for b in BENCHMARKS}
SMOKE_ENV = {"OMP_NUM_THREADS": "1"}     # a loaded 2-core machine: one thread a process


class UsageError(Exception):
    """A bad command line: one line, exit 2."""


def benchmark(name: str) -> Benchmark:
    if name in BY_NAME:
        return BY_NAME[name]
    near = difflib.get_close_matches(name, BY_NAME, n=1)
    raise UsageError(f"unknown benchmark {name!r}" + (f" (did you mean {near[0]}?)" if near else "")
                     + f"; `python -m bench list` shows them: {', '.join(BY_NAME)}")


def data_path(b: Benchmark, argv: list[str], given: str | None, smoke: bool) -> Path:
    """--data if given; toy figures (smoke, --tiny) to a temporary file; else the results."""
    if given:
        return Path(given)
    if smoke or "--tiny" in argv or "--extra=--tiny" in argv:
        return Path(tempfile.gettempdir()) / "bench-smoke" / f"{b.name}.jsonl"
    return RESULTS / f"{b.name}.jsonl"


def measure(b: Benchmark, argv: list[str]) -> list[dict]:
    """The benchmark's measurements: its module's bench(argv) (job_overhead.py through the
    adapter below, which leaves that module as it is)."""
    if b.module == "job_overhead":
        return job_overhead(argv)
    return importlib.import_module(b.module).bench(argv)


def run(b: Benchmark, argv: list[str], data: Path, label: str | None = None,
        note: str | None = None, command: str | None = None) -> int:
    """Runs the benchmark, appends one record per measurement to data; the exit status.
    A bad label or a data file that cannot be appended to is refused before anything runs."""
    if label is not None and not _record.LABEL.fullmatch(label):
        raise UsageError(f"--run {label!r}: a label is letters, digits and ._:+- only, "
                         "e.g. --run 2026-12-01-4xH200")
    try:
        data.parent.mkdir(parents=True, exist_ok=True)
        with open(data, "a"):
            pass
    except OSError as e:
        raise UsageError(f"cannot append to the data file {data} ({e.strerror}); "
                         "name a writable one with --data") from None
    machine, commit = _record.machine(), _record.commit(REPO)
    start = dt.datetime.now()
    label = label or f"{start:%Y-%m-%d}-{_record.label(machine)}-{start:%H%M%S}"
    command = command or shlex.join(["python", "-m", "bench", "run", b.name, *argv])
    measurements = measure(b, argv)
    recs = []
    for m in measurements:
        if note and not m.get("note"):
            m = {**m, "note": note}
        recs.append(_record.make(b.name, label, m, date=dt.date.today().isoformat(),
                                 machine=machine, commit=commit, command=command))
    _record.append(data, recs)
    errors = [r["error"] for r in recs if "error" in r]
    print(f"bench: {len(recs)} record(s) of {b.name} appended to {data} (run {label})"
          + (f"; {len(errors)} failed, the first: {errors[0]}" if errors else ""), flush=True)
    return 0 if recs and not errors else 1


def smoke(b: Benchmark, data: Path) -> int:
    """The benchmark's CPU smoke run, {tmp} replaced by a fresh directory; None: skipped."""
    if b.smoke is None:
        print(f"bench: {b.name} has no CPU smoke run ({b.needs})", flush=True)
        return 0
    argv = [tempfile.mkdtemp(prefix=f"bench-{b.name}-") if a == TMP else a for a in b.smoke]
    saved = {k: os.environ.get(k) for k in {**SMOKE_ENV, **b.smoke_env}}
    os.environ.update({**SMOKE_ENV, **b.smoke_env})
    t0 = time.monotonic()
    try:
        rc = run(b, argv, data, label=f"smoke-{dt.datetime.now():%Y%m%d-%H%M%S}",
                 command=shlex.join(["python", "-m", "bench", "smoke", b.name]))
    except Exception:                   # noqa: BLE001 - one broken benchmark; the others still run
        traceback.print_exc()
        rc = 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"bench: smoke {b.name}: {'ok' if rc == 0 else 'FAILED'} in {time.monotonic() - t0:.0f} s",
          flush=True)
    return rc


def show(b: Benchmark, data: Path, label: str | None) -> int:
    """Prints a run's records (the latest run unless label): conditions, then figures."""
    recs = _record.read(data, b.name)
    if not recs:
        print(f"bench: no {b.name} records in {data}")
        return 1
    label = label or recs[-1]["run"]
    mine = [r for r in recs if _record.in_runs(r, [label])]
    if not mine:
        runs = list(dict.fromkeys(r["run"] for r in recs))
        raise UsageError(f"no run {label!r} in {data}; its runs: {', '.join(runs)}")
    r0 = mine[0]
    print(f"{b.name}, run {label}: {len(mine)} record(s), {r0['date']}, "
          f"{_record.label(r0['machine'])} ({r0['machine']['gpu'] or 'no GPU'}, "
          f"{r0['machine']['cpus']} CPUs), commit {r0['commit']}\n  {r0['command']}")
    for r in mine:
        cond = " ".join(f"{k}={v}" for k, v in r["conditions"].items() if v is not None)
        figs = ", ".join(f"{k} {_fmt(v)}" for k, v in r["figures"].items() if v is not None)
        print(f"- {cond}: {figs}" + (f"  [error: {r['error']}]" if "error" in r else ""))
    return 0


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ---- job_overhead.py, registered without changing it -------------------------------------------
def job_overhead(argv: list[str]) -> list[dict]:
    """bench/job_overhead.py's main(argv) with --out (a temporary prefix unless given), then
    one measurement per job it ran, from <out>.json."""
    import job_overhead as jo
    argv = list(argv)
    if "--out" not in argv:
        argv += ["--out", os.path.join(tempfile.mkdtemp(prefix="job-overhead-"), "job")]
    jo.main(argv)
    path = Path(argv[argv.index("--out") + 1] + ".json")
    return job_overhead_records(json.loads(path.read_text())) if path.exists() else []


def job_overhead_records(data: dict) -> list[dict]:
    """The measurements of a job_overhead.py <out>.json: one per job (launcher × script ×
    condition × round; toggle jobs carry their windows' step times as detail), or one per
    --baton session (its ratio to torchrun as figures, the window pairs as detail)."""
    import job_overhead as jo
    nproc, out = data["meta"].get("nproc"), []
    for r in data["records"]:
        extra = {}
        if r.get("mode") == "baton":    # a session: its ratio as figures, its windows as detail
            rows = jo.baton_rows([r])
            if rows:
                row = rows[0]
                extra = {"ratio": row["ratio"][0], "ratio_low": row["ratio"][1],
                         "ratio_high": row["ratio"][2], "torchrun_step_ms": row["torchrun_step_ms"],
                         "same_world": row["same_world"],
                         "window_s": data["meta"].get("window_s")}
                if row["cpu_ratio"]:
                    extra.update(cpu_ratio=row["cpu_ratio"][0], cpu_ratio_low=row["cpu_ratio"][1],
                                 cpu_ratio_high=row["cpu_ratio"][2])
        m = _record.split({**r, **extra, "nproc": nproc, "round": r.get("round")},
                          ("kind", "script", "condition", "nproc", "round", "mode", "first"))
        if m.get("error"):
            m["error"] = m["error"].strip().splitlines()[-1][:300] if m["error"].strip() \
                else f"rc {r.get('rc')}"
        out.append(m)
    return out


# ---- the command line --------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the registered benchmarks")
    r = sub.add_parser("run", help="run one benchmark, append its records")
    r.add_argument("--data", help="data file (default bench/results/NAME.jsonl)")
    r.add_argument("--run", dest="label", help="the run's label (default DATE-MACHINE-TIME)")
    r.add_argument("--note", help="one line of context kept in every record")
    r.add_argument("name")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    s = sub.add_parser("smoke", help="the CPU smoke runs")
    s.add_argument("--data", help="one data file for all (default: a temporary one each)")
    s.add_argument("names", nargs="*")
    w = sub.add_parser("show", help="a run's records")
    w.add_argument("--data")
    w.add_argument("--run", dest="label")
    w.add_argument("name")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.cmd == "list":
            for b in BENCHMARKS:
                smoke_note = "" if b.smoke else "  (no CPU smoke)"
                print(f"{b.name:18} {b.measures}" + (f" [{b.needs}]" if b.needs else "")
                      + smoke_note)
            return 0
        if args.cmd == "run":
            b = benchmark(args.name)
            return run(b, args.args, data_path(b, args.args, args.data, False), args.label,
                       args.note)
        if args.cmd == "show":
            b = benchmark(args.name)
            return show(b, Path(args.data) if args.data else RESULTS / f"{b.name}.jsonl",
                        args.label)
        names = args.names or [b.name for b in BENCHMARKS]
        todo = [benchmark(n) for n in names]
        failed = [b.name for b in todo if smoke(b, data_path(b, [], args.data, True)) != 0]
        if failed:
            print(f"bench: smoke failed: {', '.join(failed)}")
        return 1 if failed else 0
    except (UsageError, _record.RecordError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
