"""Who holds a GPU lease: the holder record's fields, whether its process still lives, and
the sentences that name holders in waits and errors. The locking itself is leases.py."""
from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

_START_TIME_TOLERANCE_S = 0.5   # psutil derives create_time from clock ticks; same boot, same value


@dataclass(frozen=True)
class Holder:
    pid: int
    create_time: float
    boot_id: str
    uid: int
    user: str
    host: str
    slurm_job_id: str | None
    time: float
    gpu_uuid: str
    shared: bool = False
    record: str = ""            # file name inside the lease dir

    def is_process(self, pid: int, create_time: float) -> bool:
        """The record was written by this process (not one that reused its pid)."""
        return self.pid == pid and abs(self.create_time - create_time) <= _START_TIME_TOLERANCE_S

    def describe(self) -> str:
        extra = [f"user {self.user}"] if self.user else []
        if self.slurm_job_id:
            extra.append(f"job {self.slurm_job_id}")
        return f"pid {self.pid}" + (f" ({', '.join(extra)})" if extra else "")


def alive(h: Holder, my_boot: str) -> bool:
    """The record's process still runs, and as the record's account: a record naming another
    account's process (pid 1, say) claims nothing."""
    if not h.boot_id or h.boot_id != my_boot:
        return False
    try:
        p = psutil.Process(h.pid)
        if p.status() == psutil.STATUS_ZOMBIE:       # SIGKILLed, not yet reaped
            return False
        uids = p.uids()
        return h.uid in (uids.real, uids.effective) and h.is_process(p.pid, p.create_time())
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def current_user() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, ImportError):
        return str(os.geteuid())


def fmt_indices(indices) -> str:
    return ",".join(str(i) for i in indices)


def leased_by(holders: list[Holder]) -> str:
    seen = []
    for h in holders:
        d = h.describe()
        if d not in seen:
            seen.append(d)
    return "leased by " + " and ".join(seen)


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
