"""Another local user for attack tests: uid 65534 (nobody), and commands run as it.

A test that plants a file as another user chowns it (needs root); a test that runs a command
as that user wraps argv in AS_NOBODY (setpriv, needs root too). Each is skipped, with the
reason, where the machine does not allow it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
# dac_read_search: nobody may read and search this checkout's directories (it may live under
# root's 0700 home), never write anything it does not own.
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "running a command as another uid needs root"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import smartlaunch"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else \
        f"setpriv cannot run python as uid {NOBODY} here: {probe.stderr.strip()[-200:]}"


_WHY_NOT = _why_not()
needs_nobody = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def shared_tmp() -> Path:
    """A fresh sticky world-writable directory (as /tmp) outside pytest's 0700 tmp tree, so
    another uid can reach it; the caller removes it."""
    d = Path(tempfile.mkdtemp(prefix="smartlaunch-shared-"))
    d.chmod(0o1777)
    return d
