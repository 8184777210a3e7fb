"""What an isolated dry run's compile leaves for the launch after it, on a machine where
torch.compile's cache directory does not exist yet (a first compile there, or a per-job /tmp).

Each round, in a fresh TMPDIR (so inductor's default cache, $TMPDIR/torchinductor_<user>, is
absent): the isolated dry run of a small compiled MLP (smartlaunch.profile.runner.run_dry_run,
the launch's own path), then the script itself under python, as the launch would run it; its
time to the end of its first step is what the job pays. `--make` runs the dry run as smartlaunch
does now (the cache made when absent, then shared), `--no-make` as before (nothing made, the
compile left in the sandbox's overlay). Rounds alternate.

    python bench/diag/compile_cache.py --rounds 3      # CPU: about 1 min a round
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """
import time
t0 = time.time()
import torch
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(model)
for i in range(40):
    step(torch.randn(32, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if i == 0:
        print(f"first_step_s={time.time() - t0:.3f}", flush=True)
"""


def one(make: bool, workdir: Path) -> dict:
    from smartlaunch import sandbox
    from smartlaunch.policy.api import DryRunPolicy, Policy
    from smartlaunch.profile.runner import run_dry_run
    from smartlaunch.request import Request
    tmp = Path(tempfile.mkdtemp(prefix="cc-", dir=workdir))
    script = tmp / "compiled.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TMPDIR": str(tmp)}
    cache = Path(sandbox._inductor_default(env))
    real = sandbox.compile_caches
    if not make:                     # as before: share only a cache that is already there
        sandbox.compile_caches = lambda environ, made=None: real(environ)
    try:
        policy = Policy(dryrun=DryRunPolicy(warmup_steps=2, measure_steps=5, measure_seconds=0.0))
        t0 = time.monotonic()
        prof = run_dry_run(Request(script=str(script)), policy, gpu=None, environ=env)
        dry = time.monotonic() - t0
    finally:
        sandbox.compile_caches = real
    files = sum(1 for f in cache.rglob("*") if f.is_file()) if cache.is_dir() else None
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    first = next((float(x.split("=")[1]) for x in r.stdout.split() if x.startswith("first_step_s=")),
                 None)
    return {"make": make, "dry_run_s": round(dry, 2), "dry_status": prof.status.value,
            "cache_files_after_dry_run": files, "launch_first_step_s": first,
            "launch_rc": r.returncode}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="JSON lines of every run")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compile-cache-"))
    rows = []
    for rnd in range(args.rounds):
        for make in ((True, False) if rnd % 2 == 0 else (False, True)):
            row = {"round": rnd, **one(make, work)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for make in (True, False):
        xs = sorted(r["launch_first_step_s"] for r in rows if r["make"] == make
                    and r["launch_first_step_s"] is not None)
        if xs:
            print(f"{'made and shared' if make else 'not made (before)'}: the launch's first step "
                  f"after {', '.join(f'{x:.1f}' for x in xs)} s (median {xs[len(xs) // 2]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
