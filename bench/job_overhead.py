"""Does a rank run as fast under smartlaunch as under torchrun? Paired rounds, with intervals.

Launch-bound scripts (1-5 ms steps, where anything added to a step shows) run one job at a
time, alternating in each round the launchers in the order A B C, then C B A in the next
(drift cancels over a pair of rounds):

    A  python -m torch.distributed.run --standalone --nproc-per-node N SCRIPT
    B  smartlaunch --strategy ddp --nproc-per-node N SCRIPT       (torchrun's plan, forced)
    C  smartlaunch --policy P --nproc-per-node N SCRIPT           (the decided launch, warm:
                                                                    one cold run first, untimed)
    (and on request D: B with launch.flight_recorder: true, what that option costs)

Each run's throughput is the script's own timer (bench/suite/_harness.py); the ratio of a
launcher to torchrun is taken per round (same round, same machine state) and reported as the
geometric mean over rounds with its 95% t-interval. Also: launch to the end of the first step
(the script stamps it), and whether smartlaunch's end-of-run summary rate agrees with the
script's timer.

Separate launches drift apart by more than the effect (torchrun's own runs moved 18% between
rounds on a lent 2x H200). --baton N instead keeps torchrun's job and one smartlaunch job alive
at once and hands a baton between them: only the holder steps, for a window of --window-s,
N window pairs, order alternating (baton_session). The ratio is then taken window pair by
window pair, and the launchers' own CPU (which both jobs' windows share) is reported beside it.

    python bench/job_overhead.py --nproc 2 --conditions host nvlink --rounds 6 --out DIR/x
    python bench/job_overhead.py --nproc 2 --conditions host --baton 130 --out DIR/b
    python bench/job_overhead.py --tiny --rounds 1 --scripts deep-mlp     # CPU smoke (gloo)
    python bench/job_overhead.py --pool RUN [RUN ...] [--control torchrun-b]

--pool reads bench/results/job-overhead.jsonl: every launch pair of the named runs (a run name
also selects the runs it prefixes), pooled by machine, row and launcher, and each launcher
against --control's pairs of the same machine and row (Welch on the logs).

Writes <out>.json after every run (a cut-off call keeps what it measured) and <out>.md.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))
from bench import common  # noqa: E402
from bench.job_overhead_report import (baton_markdown, baton_rows, markdown,  # noqa: E402
                                       rows_of, toggle_markdown, toggle_rows)
from bench.pairs import pooled_markdown, pooled_rows  # noqa: E402

SMARTLAUNCH = [sys.executable, "-c", "import sys; from smartlaunch.cli import main; "
               "sys.argv[0] = 'smartlaunch'; sys.exit(main())"]
SCRIPTS = {   # id: (script, args, steps): windows of a few seconds on one H100
    "deep-mlp": ("bench/suite/deep_mlp.py", ("--batch-size", "256"), 1500),
    "cnn-small": ("bench/suite/cnn.py", ("--batch-size", "128"), 1200),
    "gpt-small": ("bench/suite/gpt.py", ("--n-layer", "4", "--n-head", "4", "--n-embd", "256",
                                         "--block-size", "128", "--vocab", "8192",
                                         "--batch-size", "8"), 1200),
}
# torchrun-b: --baton's control, a second torchrun job; torchrun-hook: torchrun running each
# rank through smartlaunch's worker hook (its progress record, work timer, output copy and
# parent watch), which separates what the hook costs a rank from what the launcher does;
# torchrun-hook-bare: the same without a run directory (no progress record, work timer or stack
# dumps: the per-step hooks are not installed), which separates the hooks from the rest;
# torchrun-hook-notee: the hook with its run directory but no output copy (fds 1 and 2 as
# torchrun gives them); torchrun-hook-notimer / -nodump / -nosteps: the hook without its work
# timer, its stack dumps or its step counter (bench/diag/hook_variant.py)
HOOK_VARIANTS = ("notimer", "nodump", "nosteps")
KINDS = ("torchrun", "sl-ddp", "sl-auto", "sl-ddp-fr", "torchrun-b", "torchrun-hook",
         "torchrun-hook-bare", "torchrun-hook-notee",
         *(f"torchrun-hook-{v}" for v in HOOK_VARIANTS))
FR_POLICY = REPO / "bench" / "policy-flight-recorder.yaml"
BUSY_OK = REPO / "bench" / "policy-busy-ok.yaml"
_FIRST = re.compile(r"^first_step_unix=([\d.]+)$", re.M)
_SUMMARY = re.compile(r"smartlaunch: summary \(succeeded\): [\d,]+ steps; (.*)$", re.M)
# two-sided 95% t quantiles, df 1..30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scripts", nargs="*", default=list(SCRIPTS), choices=list(SCRIPTS))
    p.add_argument("--conditions", nargs="*", default=["host"], choices=list(common.CONDITIONS))
    p.add_argument("--kinds", nargs="*", default=list(KINDS[:3]), choices=list(KINDS))
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="start no round after this many seconds")
    p.add_argument("--policy", default=str(REPO / "bench" / "policy-throughput.yaml"))
    p.add_argument("--tiny", action="store_true", help="toy sizes (CPU smoke test)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--toggle-windows", type=int, default=0,
                   help="instead of rounds: one `smartlaunch --strategy ddp` job per script "
                        "(the decided launch where --nproc is 1) whose timed steps alternate in "
                        "this many windows between a part of the worker hook on and off (the "
                        "harness's --toggle-windows)")
    p.add_argument("--toggle-part", choices=("hooks", "faulthandler"), default="hooks",
                   help="--toggle-windows: the per-step hooks (step counter, work timer) or the "
                        "stack-dump handlers")
    p.add_argument("--baton", type=int, default=0,
                   help="instead of rounds: torchrun's job and one smartlaunch job of each "
                        "--kinds run at once, taking turns for this many window pairs "
                        "(only the job holding the baton steps; see baton_session)")
    p.add_argument("--window-s", type=float, default=0.3, help="--baton's window length")
    p.add_argument("--launches", type=int, default=1,
                   help="--baton: this many jobs of each launcher in one session, each pair "
                        "one ratio (the interval then spans launches; baton_session)")
    p.add_argument("--pin", action="store_true",
                   help="--baton: each rank's main thread on a fixed core, the same for local "
                        "rank k in every job (bench/suite/_harness.py baton_windows)")
    p.add_argument("--torchrun-first", action="store_true",
                   help="--baton: start torchrun's job first (smartlaunch's then runs with "
                        "bench/policy-busy-ok.yaml, which lets it use GPUs another job holds)")
    p.add_argument("--alternate-first", action="store_true",
                   help="--baton --launches K: the launch pairs take turns over which job starts "
                        "first (its CUDA context first on the GPUs): the first job of a pair is "
                        "smartlaunch's in even pairs, torchrun's in odd ones, so that the start "
                        "order's own effect (bench/results/job-overhead-2026-11-27-baton) "
                        "cancels in the mean; the report gives each order's ratio")
    p.add_argument("--pool", nargs="+", metavar="RUN", default=None,
                   help="measure nothing: pool the launch pairs of these runs of "
                        "bench/results/job-overhead.jsonl (see the module's docstring)")
    p.add_argument("--control", default=None, metavar="KIND",
                   help="--pool: also give each launcher against this one (e.g. torchrun-b)")
    p.add_argument("--across-machines", action="store_true",
                   help="--pool: one row for the same row and launcher on every machine")
    p.add_argument("--out", default=None, help="path prefix: <out>.json and <out>.md")
    args = p.parse_args(argv)
    if args.alternate_first and (args.launches < 2 or args.torchrun_first):
        p.error("--alternate-first needs --launches 2 or more and no --torchrun-first")
    return args


def argv_of(kind: str, script: str, args) -> list[str]:
    path, extra, steps = SCRIPTS[script]
    timing = (["--toggle-windows", str(args.toggle_windows), "--toggle-part",
               getattr(args, "toggle_part", "hooks")] if args.toggle_windows
              else ["--chunks", "4"])
    tail = [str(REPO / path), *extra, "--warmup", "20", "--steps", str(args.steps or steps),
            *timing, *(["--tiny"] if args.tiny else [])]
    n = ["--nproc-per-node", str(args.nproc)]
    if kind in ("torchrun", "torchrun-b"):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", *n, *tail]
    variant = kind.rsplit("-", 1)[-1]
    if kind.startswith("torchrun-hook") and variant in HOOK_VARIANTS:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", *n,
                str(REPO / "bench" / "diag" / "hook_variant.py"), variant, *tail]
    if kind.startswith("torchrun-hook"):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", *n, "-m",
                "smartlaunch.launch.worker", *tail]
    n = ["--standalone", *n]        # as torchrun's: its own free port (two jobs at once)
    if kind == "sl-ddp":
        busy_ok = ["--policy", str(BUSY_OK)] if (getattr(args, "torchrun_first", False)
                                                 or getattr(args, "launches", 1) > 1) else []
        return [*SMARTLAUNCH, *busy_ok, "--strategy", "ddp", *n, *tail]
    if kind == "sl-ddp-fr":         # what launch.flight_recorder: true costs
        return [*SMARTLAUNCH, "--policy", str(FR_POLICY), "--strategy", "ddp", *n, *tail]
    return [*SMARTLAUNCH, "--policy", auto_policy(args), *n, *tail]


def auto_policy(args) -> str:
    """The decided launch's policy file: --policy's own, or, beside another job on the same GPUs
    (--launches > 1, --torchrun-first), --policy's with decision.avoid_busy_gpus false, which
    the cold decision before the session uses too (one policy: the warm launches reuse its
    cache)."""
    if getattr(args, "launches", 1) <= 1 and not getattr(args, "torchrun_first", False):
        return args.policy
    if getattr(args, "_auto_policy", None) is None:
        import tempfile
        import yaml
        doc = yaml.safe_load(Path(args.policy).read_text()) or {}
        doc.setdefault("decision", {})["avoid_busy_gpus"] = False
        fd, path = tempfile.mkstemp(prefix="policy-busy-ok-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(doc, f)
        atexit.register(lambda: Path(path).unlink(missing_ok=True))
        args._auto_policy = path
    return args._auto_policy


def run_one(kind: str, script: str, condition: str, args) -> dict:
    env = common.child_env(dict(os.environ), condition)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    t0 = time.time()
    try:
        res = subprocess.run(argv_of(kind, script, args), env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=args.timeout)
        rc, out, err = res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    tp = common.parse_throughput(out)
    first = _FIRST.search(out)
    summary = _SUMMARY.search(err)
    rec = {"kind": kind, "script": script, "condition": condition, "rc": rc,
           "wall_s": round(time.time() - t0, 2), "ok": rc == 0 and tp is not None, **(tp or {}),
           "first_step_s": round(float(first[1]) - t0, 3) if first else None,
           "summary": summary[1] if summary else None,
           "decision": _decision_in(err)}
    m = re.search(r"chunks: step_ms=([\d.,]+)", out)
    if m:
        rec["chunks_ms"] = [float(x) for x in m[1].split(",")]
    m = re.search(r"windows: hooks=(\w+) on_ms=([\d.,]+) off_ms=([\d.,]+)"
                  r"(?: on_cpu_ms=([\d.,]+) off_cpu_ms=([\d.,]+))?", out)
    if m:
        rec["ok"] = rc == 0
        rec["hooks"] = m[1] == "yes"
        rec["on_ms"] = [float(x) for x in m[2].split(",")]
        rec["off_ms"] = [float(x) for x in m[3].split(",")]
        if m[4]:
            rec["on_cpu_ms"] = [float(x) for x in m[4].split(",")]
            rec["off_cpu_ms"] = [float(x) for x in m[5].split(",")]
    if summary and tp:
        rec["summary_vs_timer"] = summary_agreement(summary[1], tp)
    if not rec["ok"]:
        rec["error"] = (err or out)[-1500:]
    if kind == "sl-auto":       # what decided it, should a decision need explaining later
        rec["smartlaunch_lines"] = [line for line in err.splitlines()
                                    if line.startswith("smartlaunch:")][:40]
    return rec


def baton_session(kind: str, script: str, condition: str, args, store, serial: int) -> dict:
    """torchrun's job (A) and `kind`'s job (B) of the same script, alive at once, taking turns:
    window pair p runs A then B when p is odd, B then A when even, and only the job holding the
    baton steps (bench/suite/_harness.py baton_windows) while the other waits on this store.
    Both share the machine's drift at the scale of a window, which separate launches (one
    after another) do not. B starts first and A only once B has ranks: smartlaunch must find
    its GPUs free (another job's GPU is busy to it), torchrun does not look; --torchrun-first
    swaps the order (smartlaunch then told by its policy to use busy GPUs).
    --launches K: K jobs of each launcher, A0 B0 A1 B1 ... in a round (reversed every other
    round); each launch pair (Aj, Bj) gives one ratio, so the interval spans launches, whose
    own differences (their placement, their start order) one pair cannot average away.
    smartlaunch's jobs then use busy GPUs (bench/policy-busy-ok.yaml) and a lease directory
    each. What both jobs' windows share, and so cannot show, is each launcher's own work beside
    its ranks: measured separately as the CPU its non-rank processes used per second."""
    import datetime
    import tempfile
    n_launch = max(1, args.launches)
    a_names = ["torchrun"] if n_launch == 1 else [f"torchrun#{j}" for j in range(n_launch)]
    b_names = [kind] if n_launch == 1 else [f"{kind}#{j}" for j in range(n_launch)]
    tags = {**{n: f"s{serial}a{j}" for j, n in enumerate(a_names)},
            **{n: f"s{serial}b{j}" for j, n in enumerate(b_names)}}
    logs = Path(tempfile.mkdtemp(prefix="baton-"))
    procs: dict[str, subprocess.Popen] = {}
    rec = {"mode": "baton", "kind": kind, "script": script, "condition": condition,
           "launches": n_launch, "pairs": [], "ok": False}

    def start(n: str) -> None:
        k = n.split("#")[0]
        env = common.child_env(dict(os.environ), condition)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["BENCH_BATON"] = f"127.0.0.1:{store.port}/{tags[n]}/{args.window_s}"
        if args.pin:
            env["BENCH_PIN_CORES"] = ",".join(map(str, pin_cores(args.nproc)))
        if k.startswith("torchrun-hook"):  # what smartlaunch's launchers give the hook
            env.update(hook_env(logs / f"hook-run-{tags[n]}"))
            from smartlaunch.launch import worker
            if k == "torchrun-hook-bare":
                env.pop(worker.RUN_DIR_VAR)
            if k == "torchrun-hook-notee":
                env.pop(worker.TEE_DIR_VAR)
        if n_launch > 1 and k.startswith("sl-"):    # beside its twins: leases of its own
            env["SMARTLAUNCH_LEASE_DIR"] = tempfile.mkdtemp(prefix="leases-", dir=logs)
        with open(logs / f"{n}.out", "w") as out, open(logs / f"{n}.err", "w") as err:
            procs[n] = subprocess.Popen(argv_of(k, script, args), env=env, cwd=REPO, stdout=out,
                                        stderr=err, start_new_session=True)

    def ranks_started(n: str) -> None:
        """Once a process of the job has LOCAL_RANK, smartlaunch has read its GPUs and leased
        them: the other job may start."""
        import psutil
        deadline = time.monotonic() + args.timeout
        while True:
            try:
                kids = psutil.Process(procs[n].pid).children(recursive=True)
            except psutil.Error:
                kids = []
            for kid in kids:
                with contextlib.suppress(psutil.Error):
                    if "LOCAL_RANK" in kid.environ():
                        return
            if procs[n].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{n} started no rank (rc {procs[n].poll()})")
            time.sleep(0.2)

    def ready(n: str) -> None:
        deadline = time.monotonic() + args.timeout
        while not store.check([f"{tags[n]}/allready"]):
            if procs[n].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{n} never got ready (rc {procs[n].poll()})")
            time.sleep(0.2)

    def window(n: str, w: int) -> list[float] | None:
        """[wall ms, main-thread CPU ms] a step of job n's window w (None for w=0, sizing)."""
        store.set(f"{tags[n]}/go/{w}", "go")
        store.wait([f"{tags[n]}/fin/{w}"], datetime.timedelta(seconds=max(60, 50 * args.window_s)))
        return [float(x) for x in store.get(f"{tags[n]}/ms/{w}").split(b",")] if w else None

    firsts, seconds = (a_names, b_names) if args.torchrun_first else (b_names, a_names)
    if getattr(args, "alternate_first", False):
        pairs = list(zip(a_names, b_names))
        firsts = [b if j % 2 == 0 else a for j, (a, b) in enumerate(pairs)]
        seconds = [a if j % 2 == 0 else b for j, (a, b) in enumerate(pairs)]
        rec["first_by_launch"] = [n.split("#")[0] for n in firsts]
    rec["first"] = "alternating" if "first_by_launch" in rec else firsts[0].split("#")[0]
    rec["pinned"] = pin_cores(args.nproc) if args.pin else None
    rounds = [x for a, b in zip(a_names, b_names) for x in (a, b)]
    per_launch: list[list] = [[] for _ in range(n_launch)]
    try:
        for n in firsts:
            start(n)
            ranks_started(n)
        for n in seconds:
            start(n)
        for n in tags:
            ready(n)
        rec["world"] = {n: int(store.get(f"{t}/world")) for n, t in tags.items()}
        if len(set(rec["world"].values())) > 1:     # a decided launch that chose another size
            raise RuntimeError(f"the jobs' world sizes differ: {rec['world']}")
        cpu0 = {n: launcher_cpu(procs[n].pid) for n in tags}
        t0 = time.monotonic()
        for n in tags:
            window(n, 0)            # each job sizes its windows
        for p in range(1, args.baton + 1):
            order = rounds if p % 2 else rounds[::-1]
            ms = {n: window(n, p) for n in order}
            for j, (a, b) in enumerate(zip(a_names, b_names)):
                first = "torchrun" if order.index(a) < order.index(b) else kind
                per_launch[j].append([ms[a][0], ms[b][0], first])
                rec.setdefault("cpu_pairs", []).append([ms[a][1], ms[b][1]])
        rec["pairs"] = [x for one in per_launch for x in one]
        if n_launch > 1:
            rec["launch_pairs"] = per_launch
        rec["steps"] = {n: int(store.get(f"{t}/steps")) for n, t in tags.items()}
        cpu1 = {n: launcher_cpu(procs[n].pid) for n in tags}
        rec["launcher_cpu"] = {     # per wall second of the windows, not the start-up's
            n: round((cpu1[n] - cpu0[n]) / (time.monotonic() - t0), 5)
            if cpu0[n] is not None and cpu1[n] is not None else None for n in tags}
        for n, t in tags.items():
            store.set(f"{t}/go/{args.baton + 1}", "end")
        rec["rc"] = {n: proc.wait(timeout=args.timeout) for n, proc in procs.items()}
        rec["ok"] = all(rc == 0 for rc in rec["rc"].values())
    except Exception as exc:            # a job that died or hung: record it, end them all
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for proc in procs.values():
            end_group(proc)
        if not rec["ok"]:
            rec["logs"] = {f.name: f.read_text(errors="replace")[-1500:]
                           for f in sorted(logs.iterdir()) if f.is_file()}
        decisions = [decision_line(logs / f"{n}.err") for n in b_names]
        rec["decision"] = decisions[0]
        if n_launch > 1 and kind == "sl-auto":
            rec["decisions"] = decisions
    return rec


def decision_line(err: Path) -> str | None:
    """smartlaunch's decision line in a job's stderr file, if any."""
    if not err.exists():
        return None
    return _decision_in(err.read_text(errors="replace"))


def _decision_in(text: str) -> str | None:
    """The decision line ("smartlaunch: DDP×2 — ...; --explain for why", or "smartlaunch:
    single process on GPU0; --explain for why" where there was nothing to choose)."""
    return next((line for line in text.splitlines()
                 if line.startswith("smartlaunch: ") and line.endswith("--explain for why")),
                None)


def pin_cores(nproc: int) -> list[int]:
    """One core per local rank, spread over the cores this process may use (a rank's main
    thread away from its neighbour's and, on a larger machine, from core 0's interrupts)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= nproc:
        return cores
    stride = len(cores) // (nproc + 1)
    return [cores[stride * (k + 1)] for k in range(nproc)]


def hook_env(run_dir: Path) -> dict[str, str]:
    """The worker hook's variables as smartlaunch's launchers set them (worker.worker_env and
    the tee directory), for a rank torchrun starts: run directory, run id, output copies."""
    from smartlaunch.launch import worker
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = worker.worker_env(str(run_dir), f"bench-{run_dir.parent.name}")
    env.pop(worker.LAUNCHER_PID_VAR)    # torch's agent is the parent, not this process
    env[worker.TEE_DIR_VAR] = str(run_dir / "logs")
    return env


def launcher_cpu(pid: int) -> float | None:
    """CPU seconds used so far by a job's processes that are not ranks (the launcher, torch's
    agent; a rank has LOCAL_RANK, and so do its own children)."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    used = 0.0
    for p in procs:
        try:
            if "LOCAL_RANK" in p.environ():
                continue
            t = p.cpu_times()
            used += t.user + t.system
        except psutil.Error:
            continue
    return used


def end_group(proc: subprocess.Popen) -> None:
    """A job's whole process group ended: SIGTERM, then SIGKILL after 15 s."""
    gone = contextlib.suppress(ProcessLookupError, PermissionError)
    if proc.poll() is None:
        with gone:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with gone:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def pool_main(args) -> int:
    from bench import _record
    records = _record.read(REPO / "bench" / "results" / "job-overhead.jsonl", "job-overhead",
                           args.pool)
    rows = pooled_rows(records, args.control, by_machine=not args.across_machines)
    report(pooled_markdown(rows, args.pool, args.control), args)
    return 0 if rows else 1


def summary_agreement(text: str, tp: dict) -> float | None:
    """smartlaunch's summary rate over the script's own (steps/s a rank, or samples/s)."""
    steps = re.search(r"([\d,.]+) steps/s", text)
    if steps:
        return float(steps[1].replace(",", "")) / (1e3 / tp["step_ms"])
    samples = re.match(r"([\d,.]+) samples/s", text)
    if samples:
        return float(samples[1].replace(",", "")) / tp["samples_per_s"]
    return None


def gpu_names() -> str:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        names = [n.strip() for n in res.stdout.splitlines() if n.strip()]
        return f"{len(names)}× {names[0]}" if names else "no GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.pool:
        return pool_main(args)
    t_start = time.monotonic()
    records: list[dict] = []
    meta = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": os.uname().nodename,
            "gpus": gpu_names(), "nproc": args.nproc, "rounds_done": 0, "elapsed_s": 0.0,
            "argv": sys.argv[1:], "toggle_part": args.toggle_part}

    def save() -> None:
        meta["elapsed_s"] = time.monotonic() - t_start
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "records": records},
                                                           indent=1))
    if args.toggle_windows:
        for cond in args.conditions:
            for script in args.scripts:
                rec = run_one("sl-ddp" if args.nproc > 1 else "sl-auto", script, cond, args)
                records.append(rec)
                print(f"toggle {cond} {script}: rc {rec['rc']}", file=sys.stderr, flush=True)
                save()
        report(toggle_markdown(toggle_rows(records), meta), args)
        return 0 if toggle_rows(records) else 1
    if args.baton:
        return baton_main(args, records, meta, save)
    if "sl-auto" in args.kinds:          # the decided launch is measured warm: decide once first
        for cond in args.conditions:
            for script in args.scripts:
                rec = run_one("sl-auto", script, cond, args)
                rec["round"] = None
                records.append(rec)
                print(f"cold {cond} {script}: {rec.get('decision')}", file=sys.stderr, flush=True)
                save()
    for rnd in range(args.rounds):
        if time.monotonic() - t_start > args.budget_s:
            break
        kinds = args.kinds if rnd % 2 == 0 else list(reversed(args.kinds))
        for cond in args.conditions:
            for script in args.scripts:
                for kind in kinds:
                    rec = run_one(kind, script, cond, args)
                    rec["round"] = rnd
                    records.append(rec)
                    print(f"round {rnd} {cond} {script} {kind}: "
                          f"{rec.get('samples_per_s', 'FAILED')} samples/s, first step "
                          f"{rec.get('first_step_s')} s", file=sys.stderr, flush=True)
                    save()
        meta["rounds_done"] = rnd + 1
    save()
    rows = rows_of(records, KINDS)
    report(markdown(rows, meta), args)
    return 0 if rows else 1


def baton_main(args, records: list[dict], meta: dict, save) -> int:
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    meta["window_s"] = args.window_s
    t_start = time.monotonic()
    serial = 0
    sessions = [(kind, cond, script) for kind in args.kinds if kind != "torchrun"
                for cond in args.conditions for script in args.scripts]
    for kind, cond, script in sessions:     # every row of one launcher before the next's
        if time.monotonic() - t_start > args.budget_s:
            break
        if kind == "sl-auto":        # measured warm: decide once first, untimed
            cold = run_one("sl-auto", script, cond, args)
            cold["round"] = None
            records.append(cold)
            print(f"cold {cond} {script}: {cold.get('decision')}", file=sys.stderr,
                  flush=True)
        serial += 1
        rec = baton_session(kind, script, cond, args, store, serial)
        records.append(rec)
        row = baton_rows([rec])
        print(f"baton {cond} {script} {kind}: "
              + (f"{row[0]['ratio'][0]:.4f} over {row[0]['pairs']} pairs" if row
                 else rec.get("error", "no pairs")), file=sys.stderr, flush=True)
        save()
    rows = baton_rows(records)
    report(baton_markdown(rows, meta), args)
    return 0 if rows and all(r["ok"] for r in rows) else 1


def report(md: str, args) -> None:
    """The markdown report on stdout and, with --out, in <out>.md."""
    print(md)
    if args.out:
        Path(f"{args.out}.md").write_text(md)


if __name__ == "__main__":
    sys.exit(main())
