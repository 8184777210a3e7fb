"""The dry-run child's command line (profile/dryrun.py's `main` reads it; runner.py writes it).

    python -m smartlaunch.profile.dryrun [--out PATH] [--progress PATH] [--warmup N]
                                         [--measure N] [--min-seconds S] [--gate PATH]
                                         [--cpu-shim] [--module] SCRIPT [ARGS...]

--progress: a file the child maps and keeps "step k of n" in (profile/tick.py).
--gate: the script's first forward (or step) waits until PATH exists: the parent creates it
when the all-reduce sweep it runs meanwhile has ended (pipeline_pools.py).

Options stop at SCRIPT: everything after it is the user's and reaches the script untouched.
"""
from __future__ import annotations

import os

USAGE = ("usage: python -m smartlaunch.profile.dryrun [--out PATH] [--progress PATH] "
         "[--warmup N] [--measure N] "
         "[--min-seconds S] [--gate PATH] [--cpu-shim] [--module] SCRIPT [ARGS...]")


def parse(argv: list[str]) -> dict:
    opts = {"out": os.environ.get("SMARTLAUNCH_DRYRUN_OUT", ""), "progress": None, "gate": None,
            "warmup": 5, "measure": 20,
            "min_seconds": 0.0,
            "module": False, "cpu_shim": os.environ.get("SMARTLAUNCH_DRYRUN_CPU_SHIM") == "1"}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a in ("--out", "--progress", "--gate", "--warmup", "--measure") and i + 1 < len(argv):
            key = a[2:]
            opts[key] = argv[i + 1] if key in ("out", "progress", "gate") else int(argv[i + 1])
            i += 2
        elif a == "--min-seconds" and i + 1 < len(argv):
            opts["min_seconds"] = float(argv[i + 1])
            i += 2
        elif a in ("--module", "-m"):
            opts["module"] = True
            i += 1
        elif a == "--cpu-shim":
            opts["cpu_shim"] = True
            i += 1
        elif a == "--no-python":
            raise SystemExit("smartlaunch dry run: --no-python entrypoints cannot be profiled")
        else:
            raise SystemExit(f"smartlaunch dry run: unknown option {a}\n{USAGE}")
    if i >= len(argv):
        raise SystemExit(USAGE)
    opts["script"], opts["args"] = argv[i], argv[i + 1:]
    return opts
