"""The guard: `python -m smartlaunch.guard TAG`, one per smartlaunch process (smartlaunch.proc).

Reads `+g PGID` / `-g PGID` (a process group), `+p HEX` / `-p HEX` (a temp dir, hex path) and
`+e HEX` / `-e HEX` (a directory to remove only if empty) lines from its stdin. At EOF, however
smartlaunch ended, it SIGKILLs the registered groups and every process tagged
SMARTLAUNCH_GUARD=TAG*, then removes the temp dirs and the empty directories.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    tag = (argv or sys.argv[1:])[0]
    owner = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: set[int] = set()
    paths: set[str] = set()
    empties: set[str] = set()
    for line in sys.stdin.buffer:
        op, _, arg = line.decode(errors="replace").strip().partition(" ")
        try:
            if op in ("+g", "-g"):
                (groups.add if op == "+g" else groups.discard)(int(arg))
            elif op in ("+p", "-p"):
                (paths.add if op == "+p" else paths.discard)(os.fsdecode(bytes.fromhex(arg)))
            elif op in ("+e", "-e"):
                (empties.add if op == "+e" else empties.discard)(os.fsdecode(bytes.fromhex(arg)))
        except ValueError:
            continue
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    from smartlaunch.proc import GUARD_VAR, kill_tagged
    kill_tagged(GUARD_VAR, tag + "-", exclude=(owner,))
    # An overlay's scratch dir cannot go until its namespace's processes are reaped: retry.
    deadline = time.monotonic() + 5.0
    while paths and time.monotonic() < deadline:
        for p in list(paths):
            shutil.rmtree(p, ignore_errors=True)
            if not os.path.lexists(p):
                paths.discard(p)
        time.sleep(0.05)
    for p in empties:       # what others wrote into it stays, with the directory
        try:
            os.rmdir(p)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
