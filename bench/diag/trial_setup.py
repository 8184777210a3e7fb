"""Diagnosis: a trial's ranks (smartlaunch.profile.trial_group, the dry-run hooks) running
bench/setup_phases.py, inside the dry run's sandbox or not, so each set-up phase can be
compared with plain torchrun's (bench/setup_phases.py).

    python bench/diag/trial_setup.py sandbox|plain NPROC [SCRIPT ARGS...]

Prints the ranks' PHASES lines and rank 0's wall stamps (start, first step, written).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from smartlaunch import sandbox
from smartlaunch.profile.trial_group import spawner_command


def main() -> None:
    mode, n = sys.argv[1], int(sys.argv[2])
    script = sys.argv[3:] or ["bench/setup_phases.py", "--out", "-"]
    tmp = tempfile.mkdtemp(prefix="diag-trial-")
    out = os.path.join(tmp, "result")
    os.mkdir(out)
    cmd = spawner_command(n, ["--out-dir", out, "--warmup", "2", "--measure", "5", *script])
    if mode == "sandbox":
        cmd = sandbox.wrap(cmd, os.path.join(tmp, "scratch"), [out],
                           os.path.join(out, "isolation.json"), sys.executable)
    env = {**os.environ, **sandbox.DRYRUN_ENV, "SMARTLAUNCH_TRIAL": "1"}
    t = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    print(f"{mode} nproc={n} wall {time.time() - t:.1f} s rc {r.returncode}")
    print("\n".join(x for x in r.stdout.splitlines() if x.startswith("PHASES")))
    if r.returncode:
        print(r.stderr[-2000:])
    try:
        res = json.load(open(os.path.join(out, "rank0.json")))
        w = [res.get(k) for k in ("wall_start", "wall_first_step", "wall_written")]
        print(f"rank0: start {w[0] - t:.1f} s, set-up {w[1] - w[0]:.1f} s, "
              f"steps {w[2] - w[1]:.1f} s, step_time {res.get('step_time_s')}")
    except (OSError, ValueError, TypeError) as exc:
        print("no rank0 result:", exc)


if __name__ == "__main__":
    main()
