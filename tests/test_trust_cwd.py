"""The current directory can be a shared one (/tmp, a group's project folder): nothing the launch
starts imports smartlaunch from it. Every process of the launch is `python -P -m
smartlaunch.<module>` (proc.python_m); a plain `-m` put the current directory first on
sys.path, so a `smartlaunch` folder planted there ran as the user in the ranks, the dry run and
its helpers (python and torchrun run the script with its own folder first, not the current
one)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers_common import REPO, fixture_path

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P is 3.11+")

PLANTED = "open({marker!r} + '-' + str(__import__('os').getpid()), 'w').write('ran')\n"


def _launch(args, cwd, env=None):
    # The launcher itself is the installed console script in real use (its own bin/ first on
    # sys.path); here python -P stands for it.
    return subprocess.run([sys.executable, "-P", "-m", "smartlaunch.cli", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=180)


@pytest.fixture
def planted(clean_env, shared_dir):
    here = clean_env / "shared-cwd"
    (here / "smartlaunch").mkdir(parents=True)
    (here / "smartlaunch" / "__init__.py").write_text(
        PLANTED.format(marker=str(shared_dir / "planted")))
    return here, shared_dir


@pytest.mark.parametrize("args", [[], ["--strategy", "ddp", "--nproc-per-node", "2"],
                                  ["--each", "--epochs=1", "--each", "--epochs=2"]],
                         ids=["single", "ddp", "each"])
def test_a_smartlaunch_folder_planted_in_the_current_directory_is_never_imported(planted, args):
    here, marks = planted
    script = REPO / "tests" / "scripts" / "tiny_train.py"
    r = _launch([*args, str(script), "--epochs", "1"], here)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "finished" in r.stdout or "2 of 2 succeeded" in r.stderr, r.stdout
    assert sorted(p.name for p in marks.iterdir()) == []


def test_nor_by_the_dry_run_and_its_helpers(planted):
    here, marks = planted
    script = REPO / "tests" / "scripts" / "tiny_train.py"
    r = _launch(["--explain", "--reprofile", str(script), "--epochs", "1"], here,
                {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "profiling " in r.stderr and "candidate" in r.stdout, r.stderr[-3000:]
    assert sorted(p.name for p in marks.iterdir()) == []
