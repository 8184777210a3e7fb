"""A gate in front of a script's first forward: a file the parent creates when the script may go on.

Two users (issue 15, item 7): the dry run waits at one until nothing of ours runs beside its
measured steps (pipeline_pools.Gate), and a trial whose ranks set themselves up beside the dry
run waits at one until the decision asks for it (profile.trial.TrialSetup.start_early). The
script's side (`wait`, called by the dry-run hooks) says it has arrived with a marker file per
rank beside the gate, so the parent can tell "set up, waiting" from "still setting up"; the
parent's side may put options in the gate file (a trial's step count, known only once the dry
run has measured a step), written whole before the gate appears.

The gate's directory must be shared with the script's sandbox, writable (the markers).
"""
from __future__ import annotations

import json
import os
import time

POLL_S = 0.01


def marker(gate: str, rank: int | str) -> str:
    return f"{gate}.waiting.{rank}"


def wait(gate: str) -> tuple[float, dict]:
    """The script's side: mark arrival, block until `gate` exists or its directory is gone
    (the parent gave up: go on); (seconds waited, the options in the gate file)."""
    t0 = time.perf_counter()
    try:
        open(marker(gate, os.environ.get("RANK", "0")), "x").close()
    except OSError:                 # read-only, or there already: the parent waits its cap
        pass
    while not os.path.exists(gate) and os.path.isdir(os.path.dirname(gate) or "."):
        time.sleep(POLL_S)
    try:
        with open(gate) as f:
            opts = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        opts = {}
    return time.perf_counter() - t0, opts if isinstance(opts, dict) else {}


def arrived(gate: str, ranks: int) -> bool:
    """Have ranks 0..ranks-1 all reached the gate?"""
    return all(os.path.exists(marker(gate, r)) for r in range(ranks))


def open_gate(gate: str, options: dict | None = None) -> None:
    """The parent's side: create the gate (with options, whole, by rename); a second call, or
    a directory removed meanwhile, is a no-op."""
    tmp = f"{gate}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(options or {}))
        if not os.path.exists(gate):
            os.rename(tmp, gate)
    except OSError:
        pass
