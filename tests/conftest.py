"""Shared test fixtures. Area-specific helpers live in tests/helpers_<area>.py."""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "smartlaunch" / "topology" / "fixtures"
EXAMPLES = REPO / "examples"

# The processes tests start import this checkout's smartlaunch, whatever else is installed (an
# editable install of another checkout): they run in their own directories, where `python -m`
# would otherwise find the installed one.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)])


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """An environment without launcher/Slurm/NCCL leftovers and with private cache, log
    and lease directories, so tests never touch the user's ~/.cache or /tmp leases."""
    for k in list(os.environ):
        if k.startswith(("PET_", "SLURM_", "NCCL_", "TORCHELASTIC_", "SMARTLAUNCH_")) or k in (
            "CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK",
        ):
            monkeypatch.delenv(k, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("SMARTLAUNCH_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def shared_dir():
    """A directory a dry run's writes reach (under /dev/shm, which the sandbox leaves shared),
    for scripts that report their worker pids to the test."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="smartlaunch-test-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


def own_lines(stderr: str) -> list[str]:
    """stderr's lines without Python warnings that imported libraries print (torch warns
    "Failed to initialize NumPy" where numpy is absent): a one-line error stays one line
    whatever torch says about its own environment."""
    out, skip_source = [], False
    for line in stderr.strip().splitlines():
        if _WARNING.match(line):
            skip_source = True
            continue
        if skip_source and line.startswith(" "):
            continue
        skip_source = False
        out.append(line)
    return out


def fixture_path(name: str) -> str:
    return str(FIXTURES / f"{name}.json")


@pytest.fixture
def python() -> str:
    return sys.executable


def wait_until(predicate, timeout: float = 10.0, what: str = "the condition"):
    """predicate()'s first true value, polled; an AssertionError naming `what` at the timeout.
    For what ends on its own a little after the code under test returns (a reaped child's
    siblings, a thread's exit): a fixed sleep there fails on a loaded machine and wastes time
    on an idle one."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert value, f"timed out after {timeout:g} s waiting for {what}"
    return value
