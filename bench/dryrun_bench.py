"""What a dry run costs (issue #4: cold <= 15 s beyond the script's start-up for models up to
1B parameters; a cache hit <= 0.5 s over plain torchrun).

    python bench/dryrun_bench.py [--cases resnet18,gpt-124m,gpt-1b,gpt-config,snapshot-ddp]
                                 [--gpu 0] [--warm 5] [--out bench/results/dryrun-h200.json]
    python bench/dryrun_bench.py --cpu --cases tiny,gpt-config   # CPU smoke run

For each case, in a private cache directory: one cold profile (a real dry run, the policy's
default 5 warm-up + 20 measured steps), then --warm cache hits through the same public call the
launcher uses (`profile_entrypoint`). Reported per case:
  cold_s         wall time of the dry run (child start -> profile in hand)
  startup_s      the script's own time from its first line to its first optimizer step
  beyond_startup_s = cold_s - startup_s: interpreter + torch import, the measured steps, exit
  warm_s         median wall time of a cache hit (key hashing + one JSON read)
and the profile itself (params, grad bytes, step time, peak memory).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from smartlaunch.policy.api import PathsPolicy, Policy  # noqa: E402
from smartlaunch.profile.cache import profile_entrypoint  # noqa: E402
from smartlaunch.request import Request  # noqa: E402

SUITE = REPO / "bench" / "suite"
SCRIPTS = REPO / "tests" / "scripts"

# name -> (script, args, needs the GPT trainer's workdir). Suite scripts get enough steps for
# 1 + 5 + 20 optimizer steps.
CASES = {
    "tiny": (SCRIPTS / "tiny_train.py", (), False),
    "resnet18": (SCRIPTS / "resnet_train.py", ("--batch-size", "64"), False),
    "snapshot-ddp": (SCRIPTS / "snapshot_ddp" / "train.py", ("50", "100"), False),
    "gpt-config": (SCRIPTS / "gpt_config" / "train.py", None, True),
    "gpt-124m": (SUITE / "gpt.py", ("--steps", "100"), False),
    # ~1.1B parameters: 18 x 12 x 2048^2 + 50304 x 2048 (tied embedding)
    "gpt-1b": (SUITE / "gpt.py", ("--steps", "100", "--n-layer", "18", "--n-embd", "2048",
                                  "--n-head", "16", "--batch-size", "4"), False),
}


def gpt_args(cpu: bool) -> tuple[str, ...]:
    from helpers_profile import GPT_ARGS
    if cpu:
        return GPT_ARGS
    # the GPU run: the trainer's own defaults (bf16), eager (compile would dominate)
    return ("--dataset=tiny", "--compile=False", "--eval_interval=100000", "--eval_iters=1",
            "--log_interval=100000", "--block_size=256", "--batch_size=8",
            "--gradient_accumulation_steps=1", "--out_dir=gpt-out")


def run_case(name: str, args, workdir: Path, env: dict) -> dict:
    script, script_args, gpt = CASES[name]
    cwd = os.getcwd()
    if gpt:
        from helpers_profile import gpt_workdir
        work = gpt_workdir(workdir / name)
        os.chdir(work)
        script, script_args = work / "train.py", gpt_args(args.cpu)
    if args.cpu and name == "snapshot-ddp":
        env = dict(env, SMARTLAUNCH_DRYRUN_CPU_SHIM="1")
    if args.cpu and script.parent == SUITE:
        script_args = (*script_args, "--tiny")
    policy = Policy(paths=PathsPolicy(cache_dir=str(workdir / "cache")))
    req = Request(script=str(script), script_args=tuple(script_args), reprofile=True)
    gpu, model = (None, "cpu") if args.cpu else (args.gpu, args.gpu_model)
    try:
        t0 = time.monotonic()
        prof = profile_entrypoint(req, policy, gpu=gpu, gpu_model=model, environ=env)
        cold = time.monotonic() - t0
        hit = Request(script=str(script), script_args=tuple(script_args))
        warm = []
        for _ in range(args.warm):
            t0 = time.monotonic()
            again = profile_entrypoint(hit, policy, gpu=gpu, gpu_model=model, environ=env)
            warm.append(time.monotonic() - t0)
            assert again.cached, "a repeated profile of the same job missed the cache"
    finally:
        os.chdir(cwd)
    row = {"case": name, "cold_s": cold, "startup_s": prof.startup_s,
           "beyond_startup_s": cold - (prof.startup_s or 0.0),
           "warm_s": statistics.median(warm) if warm else None, "profile": prof.to_dict()}
    print(f"{name:<14} {prof.status.value:<10} params={prof.trainable_params:>13,} "
          f"step={_ms(prof.step_time_s)} cold={cold:6.2f}s startup={prof.startup_s or 0:6.2f}s "
          f"beyond={row['beyond_startup_s']:6.2f}s warm={row['warm_s'] or 0:6.3f}s", flush=True)
    return row


def _ms(x) -> str:
    return f"{x * 1e3:8.1f}ms" if x else "       -  "


def gpu_model(index: str) -> str:
    try:
        from smartlaunch.topology import discover
        topo = discover(os.environ)
        return next(g.name for g in topo.gpus if str(g.index) == index)
    except Exception:  # the model only names the cache entry here
        return "unknown-gpu"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="resnet18,snapshot-ddp,gpt-config,gpt-124m,gpt-1b")
    ap.add_argument("--gpu", default="0", help="CUDA_VISIBLE_DEVICES of the dry runs")
    ap.add_argument("--cpu", action="store_true", help="dry-run on the CPU with toy sizes")
    ap.add_argument("--warm", type=int, default=5, help="cache hits timed per case")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    args.gpu_model = "cpu" if args.cpu else gpu_model(args.gpu)
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # required on the lent H200 machines
    rows = []
    with tempfile.TemporaryDirectory(prefix="dryrun-bench-") as tmp:
        for name in names:
            rows.append(run_case(name, args, Path(tmp), env))
    if args.out:
        out = {"host": platform.node(), "gpu": args.gpu_model, "python": platform.python_version(),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cases": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
