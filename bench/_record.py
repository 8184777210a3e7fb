"""The one record format of every benchmark: one JSON object per measurement, appended to one
JSON Lines data file per benchmark (bench/results/<name>.jsonl, written by bench/run.py).

A record has these keys, always:

    bench       the benchmark's registered name (bench/run.py BENCHMARKS)
    run         a label shared by the records of one invocation, e.g. "2026-11-22-2xH200-s2"
    date        "YYYY-MM-DD", the day of the measurement
    machine     {"gpu": model name or null, "gpus": count, "cpus": the host's CPU count or null}
    commit      the git commit measured (short hash, "+dirty" with uncommitted changes), or null
                where unknown; records converted from older files carry the commit that added
                the file, which is the code measured or just after it
    command     the command line that ran the benchmark
    conditions  what was fixed or varied: script, link condition, world size, policy, kind of
                run (JSON scalars)
    figures     what was measured: numbers, flags, and a decision's outcome as a short string
                (floats keep 6 significant digits)

and, where there is one:

    time        ISO time the measurement ended
    error       one line: why this measurement failed (figures hold what it had before that)
    detail      structured data an analysis replays (a plan's profile and all-reduce curve, a
                window's parts); never needed to read the figures
    note        one line of context (what this run was for, what was odd about it)

Pure functions over dicts and files, plus machine() and commit(), which ask the machine.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterable

REQUIRED = ("bench", "run", "date", "machine", "commit", "command", "conditions", "figures")
OPTIONAL = ("time", "error", "detail", "note")
SCALARS = (str, int, float, bool, type(None))
SIGNIFICANT = 6           # digits a float keeps in a record
LABEL = re.compile(r"[A-Za-z0-9._:+-]+")


class RecordError(ValueError):
    """A record that does not follow the format; the message names the key and the fix."""


def check(rec: Any, where: str = "record") -> dict:
    """rec itself when it follows the format, else RecordError naming what is wrong."""
    if not isinstance(rec, dict):
        raise RecordError(f"{where}: a record is a JSON object, not {type(rec).__name__}")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise RecordError(f"{where}: missing {', '.join(missing)} (every record has "
                          f"{', '.join(REQUIRED)})")
    unknown = sorted(set(rec) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise RecordError(f"{where}: unknown key(s) {', '.join(unknown)}; put measurements "
                          "under figures, settings under conditions, the rest under detail")
    for key in ("bench", "run", "command"):
        if not isinstance(rec[key], str) or not rec[key]:
            raise RecordError(f"{where}: {key} must be a non-empty string")
    if not LABEL.fullmatch(rec["run"]):
        raise RecordError(f"{where}: run {rec['run']!r} is not a label (letters, digits and "
                          "._:+- only, e.g. 2026-11-22-2xH200-s2)")
    try:
        dt.date.fromisoformat(rec["date"])
    except (TypeError, ValueError):
        raise RecordError(f"{where}: date {rec['date']!r} is not YYYY-MM-DD") from None
    m = rec["machine"]
    if not (isinstance(m, dict) and set(m) == {"gpu", "gpus", "cpus"}
            and isinstance(m["gpus"], int) and (m["gpu"] is None) == (m["gpus"] == 0)):
        raise RecordError(f"{where}: machine must be {{\"gpu\": name or null, \"gpus\": count, "
                          f"\"cpus\": count or null}} with a name exactly when gpus > 0, "
                          f"not {m!r}")
    if rec["commit"] is not None and not isinstance(rec["commit"], str):
        raise RecordError(f"{where}: commit must be a string or null")
    for key in ("conditions", "figures"):
        if not isinstance(rec[key], dict):
            raise RecordError(f"{where}: {key} must be an object")
        bad = [k for k, v in rec[key].items() if not isinstance(v, SCALARS)]
        if bad:
            raise RecordError(f"{where}: {key}.{bad[0]} is not a number, string, flag or null; "
                              "structured values go under detail")
    if "detail" in rec and not isinstance(rec["detail"], dict):
        raise RecordError(f"{where}: detail must be an object")
    for key in ("time", "error", "note"):
        if key in rec and not isinstance(rec[key], str):
            raise RecordError(f"{where}: {key} must be a string")
    return rec


def make(bench: str, run: str, measurement: dict, *, date: str, machine: dict,
         commit: str | None, command: str) -> dict:
    """A checked record from one measurement as a benchmark returns it: {"conditions",
    "figures"} and any of "detail", "error", "note", "time", "date" (its own date wins)."""
    extra = sorted(set(measurement) - {"conditions", "figures", "date", *OPTIONAL})
    if extra:
        raise RecordError(f"{bench}: a measurement has unknown key(s) {', '.join(extra)}")
    rec = {"bench": bench, "run": run, "date": measurement.get("date") or date,
           "machine": machine, "commit": commit, "command": command,
           "conditions": measurement.get("conditions") or {},
           "figures": compact(measurement.get("figures") or {})}
    for key in OPTIONAL:
        if measurement.get(key) not in (None, {}, ""):
            rec[key] = compact(measurement[key]) if key == "detail" else measurement[key]
    return check(rec, f"{bench} record")


def compact(value: Any, digits: int = SIGNIFICANT) -> Any:
    """value with every float kept to `digits` significant digits (a measurement's noise is
    far above the sixth), recursively through lists and dicts."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: compact(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v, digits) for v in value]
    return value


def append(path: Path, records: Iterable[dict]) -> int:
    """Appends the records (checked) to the data file, one line each; returns how many."""
    lines = [json.dumps(check(r), sort_keys=True, separators=(",", ":")) + "\n" for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(lines))
    return len(lines)


def read(path: Path, bench: str | None = None, runs: Iterable[str] = ()) -> list[dict]:
    """The records of a data file, in file order, each checked; a missing file has none.
    bench: only that benchmark's. runs: only records whose run is one of these or starts with
    one of them followed by "-" (so "heldout" selects "heldout-1" and "heldout-2")."""
    path = Path(path)
    if not path.exists():
        return []
    runs = tuple(runs)
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise RecordError(f"{path}:{n}: not JSON ({e})") from None
        check(rec, f"{path}:{n}")
        if bench and rec["bench"] != bench:
            continue
        if in_runs(rec, runs):
            out.append(rec)
    return out


def in_runs(rec: dict, runs: Iterable[str]) -> bool:
    """True when runs is empty, or rec's run is one of them or starts with one and "-"."""
    runs = tuple(runs)
    return not runs or any(rec["run"] == r or rec["run"].startswith(r + "-") for r in runs)


def is_record(obj: Any) -> bool:
    """A line in this format (rather than a benchmark's own raw line)."""
    return isinstance(obj, dict) and "bench" in obj and "figures" in obj


def label(machine: dict) -> str:
    """"2xH200" for {"gpu": "NVIDIA H200", "gpus": 2}; "cpu" without GPUs."""
    if not machine.get("gpus"):
        return "cpu"
    words = str(machine["gpu"]).replace("NVIDIA", "").split()
    short = next((w for w in words if any(c.isdigit() for c in w)), words[-1] if words else "GPU")
    return f"{machine['gpus']}x{short}"


def flatten(rec: dict) -> dict:
    """The one-level dict the analysis code (regret, multi_n_4gpu_report) reads: conditions,
    figures and detail merged, with ok, error, date, time and the machine's label."""
    flat = {**rec.get("detail", {}), **rec["conditions"], **rec["figures"],
            "ok": "error" not in rec, "date": rec["date"], "machine": label(rec["machine"]),
            "run": rec["run"]}
    for key in ("error", "time"):
        if key in rec:
            flat[key] = rec[key]
    return flat


def split(flat: dict, condition_keys: Iterable[str],
          drop: Iterable[str] = ("ok", "error", "date", "time", "machine")) -> dict:
    """A measurement from a benchmark's one-level record: the condition keys, then every other
    scalar as a figure and every structured value as detail (the inverse of flatten)."""
    keys = tuple(condition_keys)
    skip = set(drop) | set(keys)
    m: dict = {"conditions": {k: flat[k] for k in keys if k in flat},
               "figures": {k: v for k, v in flat.items()
                           if k not in skip and isinstance(v, SCALARS)},
               "detail": {k: v for k, v in flat.items()
                          if k not in skip and not isinstance(v, SCALARS)}}
    if flat.get("ok") is False:
        m["error"] = str(flat.get("error") or "failed")
    for key in ("date", "time"):
        if flat.get(key):
            m[key] = str(flat[key])
    if not m["detail"]:
        del m["detail"]
    return m


# ---- the machine and the checkout -------------------------------------------------------------
def machine(runner=subprocess.run) -> dict:
    """This machine: its GPUs' model and count (NVML, else nvidia-smi; none found: 0) and the
    host's CPU count."""
    names: list[str] = []
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(n.decode() if isinstance(n, bytes) else n)
        finally:
            pynvml.nvmlShutdown()
    except Exception:               # noqa: BLE001 - no NVML here: ask nvidia-smi
        try:
            out = runner(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
            names = [ln.strip() for ln in out.splitlines() if ln.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return {"gpu": names[0] if names else None, "gpus": len(names), "cpus": os.cpu_count()}


def commit(repo: Path, runner=subprocess.run) -> str | None:
    """The checkout's short commit, "+dirty" when tracked files differ from it; None outside git."""
    try:
        head = runner(["git", "-C", str(repo), "rev-parse", "--short=10", "HEAD"],
                      capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = runner(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")
