"""Shared test fixtures, and nothing else: test modules never import this file by name (a
`conftest` module of another tree may be the one that name finds); what they share is in
tests/helpers_common.py, area-specific helpers in tests/helpers_<area>.py."""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# What every test module needs importable (smartlaunch's declared dependencies the tests use at
# import): without them collection would fail module by module with import errors.
NEEDED = ("torch", "psutil")


def pytest_configure(config):
    # A shell's background job starts with SIGINT ignored, and an ignored signal stays ignored
    # across exec: every smartlaunch the tests start would then ignore the Ctrl-C the signal
    # tests send it. Catching it here makes children start with the default, as under a
    # terminal or CI.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        pytest.exit(f"this interpreter lacks {', '.join(missing)} (smartlaunch's dependencies "
                    f"the tests import); make the test environment as the README's Quick "
                    f"start does: pip install torch==2.13.0 -e '.[test]'", returncode=4)

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


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture
def cluster(tmp_path):
    """make(n): n "nodes" on this host (helpers_multinode.Cluster), closed after the test;
    the test is skipped where network namespaces cannot be made."""
    from helpers_multinode import Cluster, Unavailable
    made: list = []

    def make(n: int):
        c = Cluster(tmp_path, n)
        made.append(c)
        try:
            return c.create()
        except Unavailable as exc:
            pytest.skip(str(exc))
    yield make
    for c in made:
        c.close()


@pytest.fixture
def nobody_dir(clean_env):
    """A directory other accounts can reach without a capability: access(2), which the lease
    checks use, ignores capabilities for a non-root user, and pytest's tmp_path lies in a
    0700 dir."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="smartlaunch-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
