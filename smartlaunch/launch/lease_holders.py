"""Who holds a GPU lease: a record's text (input from a stranger) parsed into typed fields, and
the sentences that name holders in waits and errors."""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass

_TEXT_MAX = 256                 # any string field; names, hosts and job ids are far shorter
_PID_MAX = 1 << 22              # the kernel's largest pid_max


class RecordError(ValueError):
    """A record that does not parse; the text says which field and why."""


@dataclass(frozen=True)
class Holder:
    """One live record: a launch holding (or waiting for) GPUs; `user` is the file's owner."""
    pid: int
    create_time: float
    uid: int
    user: str
    host: str | None
    slurm_job_id: str | None
    time: float
    gpu_uuid: str
    shared: bool = False
    record: str = ""            # file name inside the lease dir

    def describe(self) -> str:
        extra = [f"user {self.user}"]
        if self.slurm_job_id:
            extra.append(f"job {self.slurm_job_id}")
        return f"pid {self.pid} ({', '.join(extra)})"


def parse_record(data: bytes, *, owner: int, record: str = "") -> Holder:
    """The Holder a record's bytes describe, its user the file's owner (uid `owner`).
    RecordError, naming the first bad field, for anything but a JSON object with pid int in
    1..2**22, create_time and time finite >= 0, uid the owner's, gpu_uuid a printable string,
    user/host/slurm_job_id/boot_id printable strings or null, shared a bool."""
    try:
        rec = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RecordError("it is not JSON") from None
    if not isinstance(rec, dict):
        raise RecordError(f"it is a JSON {type(rec).__name__}, not an object")
    pid = rec.get("pid")
    if not _is_int(pid) or not 0 < pid <= _PID_MAX:
        raise RecordError("field pid is not a positive integer")
    uid = rec.get("uid")
    if not _is_int(uid) or uid != owner:
        raise RecordError(f"field uid is not the file's owner (uid {owner})")
    for key in ("create_time", "time"):
        if not _is_number(rec.get(key)):
            raise RecordError(f"field {key} is not a finite number >= 0")
    for key in ("gpu_uuid", "user", "host", "slurm_job_id", "boot_id"):
        value = rec.get(key)
        if value is None and key != "gpu_uuid":
            continue
        if not (isinstance(value, str) and 0 < len(value) <= _TEXT_MAX and value.isprintable()):
            raise RecordError(f"field {key} is not a printable string of at most {_TEXT_MAX} "
                              "characters" + ("" if key == "gpu_uuid" else " or null"))
    shared = rec.get("shared", False)
    if not isinstance(shared, bool):
        raise RecordError("field shared is not true or false")
    return Holder(pid=pid, create_time=float(rec["create_time"]), uid=uid, user=user_name(owner),
                  host=rec.get("host"), slurm_job_id=rec.get("slurm_job_id"),
                  time=float(rec["time"]), gpu_uuid=rec["gpu_uuid"], shared=shared,
                  record=record)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


@functools.lru_cache(maxsize=256)      # a waiting launch reads the records every poll
def user_name(uid: int) -> str:
    """The account name of `uid`, or `uid N` when it has none."""
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def current_user() -> str:
    return user_name(os.geteuid())


def fmt_indices(indices) -> str:
    return ",".join(str(i) for i in indices)


def leased_by(holders: list[Holder]) -> str:
    return "leased by " + " and ".join(dict.fromkeys(h.describe() for h in holders))


def summarise(why: dict[int, str]) -> str:
    """'GPUs 0,1 are leased by pid 1234 (user bob, job 77); GPU 2 is in use by pid 9 ...'"""
    groups: dict[str, list[int]] = {}
    leased: list[int] = []
    holders: list[str] = []
    for i, reason in why.items():
        if reason.startswith("leased by pid "):      # one clause for every GPU leased by someone
            leased.append(i)
            holders += [d for d in reason[len("leased by "):].split(" and ") if d not in holders]
        else:
            groups.setdefault(reason, []).append(i)
    if leased:
        groups = {"leased by " + " and ".join(holders): leased, **groups}
    parts = [f"GPU{'s' if len(ix) > 1 else ''} {fmt_indices(ix)} {'are' if len(ix) > 1 else 'is'} {reason}"
             for reason, ix in groups.items()]
    return "; ".join(parts) or "no GPU to choose from"
