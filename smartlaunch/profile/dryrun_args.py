"""The dry-run child's command line (USAGE; dryrun.py reads it, runner.py writes it). --gate: the
first forward waits for its go on the control socket; --hold: after each measured window, the next
go on it measures another (dryrun.Recorder.hold_on). Options stop at SCRIPT."""
from __future__ import annotations

import os

USAGE = ("usage: python -m smartlaunch.profile.dryrun [--out PATH] [--warmup N] [--measure N] "
         "[--min-seconds S] [--precision P] [--gate] [--hold] [--cpu-shim] [--module] "
         "SCRIPT [ARGS...]")


_VALUES = {"--out": ("out", str), "--warmup": ("warmup", int), "--measure": ("measure", int),
           "--min-seconds": ("min_seconds", float), "--precision": ("precision", float)}
_FLAGS = {"--gate": "gate", "--hold": "hold", "--module": "module", "-m": "module",
          "--cpu-shim": "cpu_shim"}


def parse(argv: list[str]) -> dict:
    opts = {"out": os.environ.get("SMARTLAUNCH_DRYRUN_OUT", ""), "gate": False, "hold": False,
            "warmup": 5, "measure": 20, "min_seconds": 0.0, "precision": 0.0, "module": False,
            "cpu_shim": os.environ.get("SMARTLAUNCH_DRYRUN_CPU_SHIM") == "1"}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a in _VALUES and i + 1 < len(argv):
            key, kind = _VALUES[a]
            opts[key] = kind(argv[i + 1])
            i += 2
        elif a in _FLAGS:
            opts[_FLAGS[a]] = True
            i += 1
        elif a == "--no-python":
            raise SystemExit("smartlaunch dry run: --no-python entrypoints cannot be profiled")
        else:
            raise SystemExit(f"smartlaunch dry run: unknown option {a}\n{USAGE}")
    if i >= len(argv):
        raise SystemExit(USAGE)
    opts["script"], opts["args"] = argv[i], argv[i + 1:]
    return opts
