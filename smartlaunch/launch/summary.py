"""<run dir>/summary.txt, the end-of-run summary every launch leaves beside its logs."""
from __future__ import annotations

import os

from smartlaunch.launch.measured import slowest_rank
from smartlaunch.launch.progress import progress_path, read_progress
from smartlaunch.store import open_private

SUMMARY_FILE = "summary.txt"


def write_summary(run_dir: str, text: str) -> str | None:
    """Write <run_dir>/summary.txt; its path, or None when it cannot be written."""
    path = os.path.join(run_dir, SUMMARY_FILE)
    try:
        with open_private(path, "w", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n")
    except OSError:
        return None
    return path


def single_summary(state: str, exit_code: int, wall_s: float, run_dir: str,
                   batch: int | None = None) -> str:
    """One job's summary: exit code, wall time, and step rate when the hook counted steps."""
    head = f"smartlaunch: summary ({state}): exit code {exit_code} after {wall_s:.1f} s"
    seen = slowest_rank(run_dir, 1)
    if seen is not None:
        rec = read_progress(progress_path(run_dir, 0))
        rate = seen[0] / seen[1]
        head += f"; {rec.steps if rec else seen[0] + 1:,} steps, {rate:.2f} steps/s"
        if batch:
            head += f" ({rate * batch:,.1f} samples/s)"
    return f"{head}\n  run files: {run_dir}"
