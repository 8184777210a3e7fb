"""`smartlaunch-node` itself: without a command it lists the commands (as `git` does), and an
argument a command does not take is that command's one-line error, exit 2."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers_common import own_lines


def node(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smartlaunch.node_cli", *args],
                          capture_output=True, text=True, timeout=60)


def test_no_command_lists_every_command_with_one_line_each_and_exits_2():
    from smartlaunch.node_cli import build_parser
    out = node()
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert lines[0].startswith("usage: smartlaunch-node") and "commands:" in lines
    listed = [line.split()[0] for line in lines if line.startswith("  ")]
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices
               and "report" in a.choices)
    assert listed == list(sub.choices) and {"topo", "report", "files", "policy"} <= set(listed)
    assert all(len(line.split(None, 1)) == 2 for line in lines if line.startswith("  "))
    assert lines[-1] == "`smartlaunch-node COMMAND --help` shows a command's options."


@pytest.mark.parametrize("args, says", [
    (["topo", "extra"], "unrecognized arguments: extra (see `smartlaunch-node topo --help`)"),
    (["policy", "check", "--bogus"],
     "unrecognized arguments: --bogus (see `smartlaunch-node policy check --help`)"),
    (["--bogus"], "unrecognized arguments: --bogus (see `smartlaunch-node --help`)"),
    (["calibrate", "--windows", "x"], "argument --windows: invalid int value: 'x'"),
    (["report", "--by", "gpu"], "argument --by: invalid choice: 'gpu'"),
    (["nosuch"], "argument COMMAND: invalid choice: 'nosuch'"),
])
def test_a_bad_argument_is_one_line_naming_the_command_and_exit_2(args, says):
    out = node(*args)
    lines = own_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("smartlaunch-node: error: ") and says in lines[0]
    assert "Traceback" not in out.stderr
