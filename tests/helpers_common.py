"""What tests share that is not a fixture: the repository's paths, the fixture topologies,
stderr without library warnings, and polling with a deadline. Test modules import these from
here (conftest.py holds only fixtures and is not imported by name)."""
from __future__ import annotations

import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "smartlaunch" / "topology" / "fixtures"
EXAMPLES = REPO / "examples"


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
