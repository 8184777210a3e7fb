"""torch's NCCL Flight Recorder, pointed at the run's log directory and read on a hang.

Each process polls a FIFO `<stem><rank>.pipe` (TORCH_NCCL_DEBUG_INFO_PIPE_FILE); a write makes
it dump its ring of last collectives to `<prefix><rank>` (TORCH_FR_DUMP_TEMP_FILE), a pickle of
plain dicts: {"entries": [{"process_group": (name, desc), "collective_seq_id",
"profiling_name", "state", "input_sizes", ...}]}. Variables the user set are kept.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass

PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")   # torch reads in this order
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
TORCH_DEFAULT_DUMP = "/tmp/nccl_trace_rank_"
BUFFER_ENTRIES = "2000"        # torch's own default ring size where it has one
NO_PIPE = ("no Flight Recorder pipe to ask (this torch makes none, or the ring is off: "
           "TORCH_FR_BUFFER_SIZE=0)")
DUMP_WAIT_S = 6.0              # the heartbeat thread polls the pipe every second (default)
MAX_DUMP_BYTES = 256 << 20     # a ring of 2000 entries with their stacks is tens of MiB


@dataclass(frozen=True)
class FlightRecorder:
    pipe_stem: str | None       # None: no pipe, nothing to trigger
    dump_prefixes: tuple[str, ...]   # where a dump may land: the configured prefix, torch's default

    def pipe(self, rank: int) -> str:
        return f"{self.pipe_stem}{rank}.pipe"

    def dumps(self, rank: int) -> list[str]:
        return [f"{p}{rank}" for p in self.dump_prefixes]


def enabled_by(environ: Mapping[str, str]) -> bool:
    """The job's own environment turns the ring on (a buffer size above 0)."""
    for var in BUFFER_VARS:
        try:
            if int(environ.get(var, "0") or 0) > 0:
                return True
        except ValueError:
            pass
    return False


def recorder_env(environ: Mapping[str, str], run_dir: str) -> tuple[dict[str, str], FlightRecorder]:
    """Variables to add for the workers (none the user set) and where the dumps will be."""
    folder = os.path.join(run_dir, "flight-recorder")
    add: dict[str, str] = {}
    prefix = next((environ[v] for v in DUMP_VARS if environ.get(v)), None)
    if prefix is None:
        prefix = add[DUMP_VARS[0]] = os.path.join(folder, "rank")
    if PIPE_VAR not in environ:
        add[PIPE_VAR] = os.path.join(folder, "pipe")
    if not any(v in environ for v in BUFFER_VARS):
        add[BUFFER_VARS[0]] = BUFFER_ENTRIES
    if add:
        os.makedirs(folder, exist_ok=True)      # mkfifo does not create directories
    stem = environ.get(PIPE_VAR, add.get(PIPE_VAR)) or None
    prefixes = (prefix,) if prefix == TORCH_DEFAULT_DUMP else (prefix, TORCH_DEFAULT_DUMP)
    return add, FlightRecorder(stem, prefixes)


def ask(fr: FlightRecorder, ranks: list[int]) -> list[tuple[int, float]]:
    """Ask every rank for a dump through its pipe; return (rank, when) for those asked."""
    if fr.pipe_stem is None:
        return []
    asked = []
    for r in ranks:
        try:
            fd = os.open(fr.pipe(r), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:          # no FIFO (not NCCL, older torch) or nobody reading it
            continue
        try:
            os.write(fd, b"1")
            asked.append((r, time.time()))
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def collect(fr: FlightRecorder, asked: list[tuple[int, float]],
            wait_s: float = DUMP_WAIT_S) -> dict[int, str]:
    """rank -> dump file written since it was asked (complete: its size held for one poll);
    only this user's regular files (torch's default place is the shared /tmp)."""
    from smartlaunch.store import own_file
    sizes: dict[int, int] = {}
    got: dict[int, str] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and len(got) < len(asked):
        for r, when in asked:
            for path in fr.dumps(r):
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if own_file(st) and st.st_mtime >= when - 1 and st.st_size > 0:
                    if sizes.get(r) == st.st_size:
                        got[r] = path
                    sizes[r] = st.st_size
                    break
        time.sleep(0.2)
    return got


class _Plain(pickle.Unpickler):
    """A dump holds plain data: refuse anything that would construct an object."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a Flight Recorder dump")


def read_dump(path: str) -> dict | None:
    """The dump's plain data, or None: not this user's regular file (store.read_own), over
    MAX_DUMP_BYTES, or neither a plain pickle nor JSON."""
    from smartlaunch.store import read_own
    data = read_own(path, MAX_DUMP_BYTES)
    if data is None:
        return None
    try:
        return _Plain(io.BytesIO(data)).load()
    except Exception:
        try:
            return json.loads(data)
        except ValueError:
            return None


def _pg_key(e: dict) -> str:
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0])
    return str(e.get("pg_id", "?"))


def collective_state(dump: dict) -> dict[str, dict]:
    """pg name -> {"entered": seq, "completed": seq, "ops": {seq: (op, sizes)}} of one rank."""
    out: dict[str, dict] = {}
    for e in dump.get("entries", ()):
        if e.get("is_p2p") or not e.get("collective_seq_id"):
            continue
        pg = out.setdefault(_pg_key(e), {"entered": 0, "completed": 0, "ops": {}})
        seq = int(e["collective_seq_id"])
        pg["entered"] = max(pg["entered"], seq)
        if e.get("state") == "completed":
            pg["completed"] = max(pg["completed"], seq)
        pg["ops"][seq] = (e.get("profiling_name", "?"), e.get("input_sizes"))
    return out


def verdict(dumps: Mapping[int, dict | None], ranks: list[int]) -> tuple[list[str], list[int]]:
    """(report lines: which rank did not enter or finish which collective, by sequence number;
    ranks that did not enter a collective the others entered)."""
    lines: list[str] = []
    laggards: list[int] = []
    states = {r: collective_state(d) for r, d in dumps.items() if d}
    missing = [r for r in ranks if r not in states]
    if missing:
        lines.append(f"no Flight Recorder dump from rank{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(str, missing))} (not an NCCL job, or this torch has no dump pipe)")
    for pg in sorted({pg for s in states.values() for pg in s}):
        per = {r: s.get(pg, {"entered": 0, "completed": 0, "ops": {}}) for r, s in states.items()}
        top = max(p["entered"] for p in per.values())
        if top == 0:
            continue
        op = next((p["ops"][top] for p in per.values() if top in p["ops"]), ("?", None))
        what = f"collective #{top} ({op[0]}, process group {pg})"
        behind = sorted(r for r, p in per.items() if p["entered"] < top)
        if behind:
            laggards += behind
            lines += [f"rank {r} did not enter {what}; its last was #{per[r]['entered']}, "
                      f"the other ranks entered #{top}" for r in behind]
            continue
        ops = {r: p["ops"].get(top) for r, p in per.items()}
        if len({repr(v) for v in ops.values() if v}) > 1:
            lines.append(f"ranks called different operations as {what}: " +
                         "; ".join(f"rank {r}: {v[0]} {v[1]}" for r, v in sorted(ops.items()) if v) +
                         " (a rank skipped or added a collective before it)")
        unfinished = sorted(r for r, p in per.items() if p["completed"] < top)
        if unfinished:
            lines.append(f"all ranks entered {what}; rank{'s' if len(unfinished) > 1 else ''} "
                         f"{', '.join(map(str, unfinished))} did not finish it")
    return lines, laggards
