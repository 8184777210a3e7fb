"""The dry-run child's command line (profile/dryrun.py's `main` reads it; runner.py writes it).

    python -m smartlaunch.profile.dryrun [--out PATH] [--warmup N] [--measure N]
                                         [--min-seconds S] [--precision P] [--gate]
                                         [--cpu-shim] [--module]
                                         SCRIPT [ARGS...]

--gate: the script's first forward (or step) waits for its go on the control socket
(profile/control.py): the session gives it when nothing of ours runs beside the measured steps
(profile/early.py). Progress ("step k of n") goes to the same socket.

Options stop at SCRIPT: everything after it is the user's and reaches the script untouched.
"""
from __future__ import annotations

import os

USAGE = ("usage: python -m smartlaunch.profile.dryrun [--out PATH] [--warmup N] [--measure N] "
         "[--min-seconds S] [--precision P] [--gate] [--cpu-shim] [--module] SCRIPT [ARGS...]")


def parse(argv: list[str]) -> dict:
    opts = {"out": os.environ.get("SMARTLAUNCH_DRYRUN_OUT", ""), "gate": False,
            "warmup": 5, "measure": 20,
            "min_seconds": 0.0, "precision": 0.0,
            "module": False, "cpu_shim": os.environ.get("SMARTLAUNCH_DRYRUN_CPU_SHIM") == "1"}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a in ("--out", "--warmup", "--measure") and i + 1 < len(argv):
            key = a[2:]
            opts[key] = argv[i + 1] if key == "out" else int(argv[i + 1])
            i += 2
        elif a == "--gate":
            opts["gate"] = True
            i += 1
        elif a in ("--min-seconds", "--precision") and i + 1 < len(argv):
            opts[a[2:].replace("-", "_")] = float(argv[i + 1])
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
