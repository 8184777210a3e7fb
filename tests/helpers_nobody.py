"""Other accounts for attack tests: commands run as uid 65534 (`nobody`, the attacker) or as
uid 4242 (a victim with no passwd entry and no capability), through setpriv. Each has a skip
mark that says why where this machine cannot do it."""
from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers_jobs import LEASE_HOLDER, PY, python_env

NOBODY = 65534
VICTIM = 4242


def as_user(uid: int, *, read_all: bool = True) -> list[str]:
    """setpriv's argv prefix for `uid`. read_all: with CAP_DAC_READ_SEARCH, which lets it read
    and search what it does not own (this python may live under root's 0700 home), never
    write; without it the account reads only what any other user may."""
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"] if read_all else []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *caps]


AS_NOBODY = as_user(NOBODY)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _why_not(uid: int, read_all: bool) -> str | None:
    if os.geteuid() != 0:
        return "running a command as another uid needs root"
    # What the tests run as that account imports: the launcher, psutil and torch (a venv
    # under a 0700 folder lets the interpreter start but hides its site-packages).
    probe = subprocess.run([*as_user(uid, read_all=read_all), PY, "-c",
                            "import smartlaunch.launch.leases, smartlaunch.cli, psutil, torch"],
                           capture_output=True, text=True, env=python_env())
    return None if probe.returncode == 0 else f"setpriv cannot run python as uid {uid} " \
        f"{'' if read_all else 'without capabilities '}here: {probe.stderr.strip()[-200:]}"


_WHY_NOT_NOBODY = _why_not(NOBODY, True)
needs_nobody = pytest.mark.skipif(_WHY_NOT_NOBODY is not None, reason=_WHY_NOT_NOBODY or "")
_WHY_NOT_VICTIM = _WHY_NOT_NOBODY or _why_not(VICTIM, False)
needs_victim = pytest.mark.skipif(_WHY_NOT_VICTIM is not None, reason=_WHY_NOT_VICTIM or "")


def as_nobody(code: str, *args: str, **popen) -> subprocess.Popen:
    """`python -c code args` as uid 65534."""
    popen.setdefault("env", python_env())
    return subprocess.Popen([*AS_NOBODY, PY, "-c", code, *args], text=True, **popen)


def shared_lease_dir(path: str) -> str:
    """`path` as a shared lease directory (1777, root's): where other users make files."""
    from smartlaunch.launch.leases import LeaseManager
    LeaseManager(path, private=False).close()
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o1777
    return path


# Leases the GPUs argv[3] names of the topology file argv[1] (argv[2] unused), prints them, and
# holds them until its stdin closes.
HOLD_UNTIL_STDIN = LEASE_HOLDER.replace(
    'open(ready, "w").write(",".join(map(str, lease.gpus)))',
    'print(",".join(map(str, lease.gpus)), flush=True)').replace("time.sleep(300)",
                                                                "sys.stdin.read()")
assert HOLD_UNTIL_STDIN != LEASE_HOLDER and "sys.stdin.read()" in HOLD_UNTIL_STDIN


def shared_tmp() -> Path:
    """A fresh sticky world-writable directory (as /tmp) outside pytest's 0700 tmp tree, so
    another uid can reach it; the caller removes it."""
    d = Path(tempfile.mkdtemp(prefix="smartlaunch-shared-"))
    d.chmod(0o1777)
    return d
