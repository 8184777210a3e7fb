"""`smartlaunch-node files`: the Slurm hook scripts and the shipped policies travel in the wheel
as package data, and the admin docs install them through this command, so the docs can be
followed from a wheel (no clone on the node)."""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers_common import REPO

HOOK_FILES = {"prolog", "epilog", "node-hook", "job_submit.lua"}
POLICY_FILES = {"default.yaml", "workstation-pcie.yaml", "nvlink-server.yaml",
                "shared-cluster.yaml"}
DOCS = ("docs/slurm-admin.md", "docs/policy.md", "docs/fleet.md")


def node(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:      # an unpacked wheel first, before this checkout
        env["PYTHONPATH"] = pythonpath
    code = "import sys; from smartlaunch.node_cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd="/")


def test_files_lists_every_hook_script_and_policy_under_its_heading():
    out = node("files")
    assert out.returncode == 0, out.stderr
    paths = [Path(line.strip()) for line in out.stdout.splitlines() if line.startswith("  ")]
    assert {p.name for p in paths} == HOOK_FILES | POLICY_FILES
    assert all(p.is_absolute() and p.is_file() for p in paths)
    assert "Slurm node hooks and submit filter (docs/slurm-admin.md):" in out.stdout
    assert "Policies (docs/policy.md):" in out.stdout


def test_files_name_prints_that_one_path_and_an_unknown_name_is_one_line_exit_2():
    out = node("files", "shared-cluster.yaml")
    assert out.returncode == 0 and out.stdout.count("\n") == 1
    assert Path(out.stdout.strip()).read_text().startswith("#")
    bad = node("files", "prolgo")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "no shipped file named 'prolgo'" in bad.stderr
    assert "prolog" in bad.stderr


def test_every_file_the_docs_install_is_one_the_command_names():
    named = {m for doc in DOCS for m in
             re.findall(r"smartlaunch-node files ([\w.-]+)\)", (REPO / doc).read_text())}
    assert {"prolog", "epilog", "job_submit.lua", "shared-cluster.yaml"} <= named
    for name in named:
        out = node("files", name)
        assert out.returncode == 0, (name, out.stderr)


def test_the_wheel_ships_them_and_the_command_finds_them_inside_it(tmp_path):
    """Built from a copy of the package (pip wheel writes build/ beside its source), with the
    setuptools of this environment; ~3 s."""
    try:
        if int(importlib.metadata.version("setuptools").split(".")[0]) < 77:
            pytest.skip("setuptools < 77 here (pyproject.toml's build requirement)")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("no setuptools here to build the wheel with")
    src = tmp_path / "src"
    shutil.copytree(REPO / "smartlaunch", src / "smartlaunch", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(src)],
                           capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("smartlaunch-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
        modes = {Path(i.filename).name: i.external_attr >> 16 for i in z.infolist()}
    out = node("files", pythonpath=str(unpacked))
    assert out.returncode == 0, out.stderr
    paths = [Path(line.strip()) for line in out.stdout.splitlines() if line.startswith("  ")]
    assert {p.name for p in paths} == HOOK_FILES | POLICY_FILES
    assert all(p.is_relative_to(unpacked) for p in paths)
    # prolog and epilog are links to node-hook in a clone; the wheel holds the script itself
    hook = (REPO / "smartlaunch" / "slurm" / "scripts" / "node-hook").read_text()
    for name in ("prolog", "epilog"):
        one = node("files", name, pythonpath=str(unpacked))
        assert Path(one.stdout.strip()).read_text() == hook
        assert modes[name] & stat.S_IXUSR
