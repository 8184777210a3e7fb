"""A killed process holds its files (on a GPU node: its CUDA context) until its exit is done,
which outlives the moment its environment stops being readable. kill_tagged and kill_run return
only once each process they killed has finished exiting, so a launcher that returns has left its
GPUs free for the next command."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from smartlaunch.proc import GUARD_VAR, RUN_ID_VAR, kill_run, kill_tagged, proc_state

# A process slow to exit: it touches 3 GiB (~0.15 s to free), which the kernel tears down after the process has
# stopped showing its environment (and before it is a zombie).
_BIG = ("import sys, time; b = bytearray(3 << 30); "
        "[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; "
        "print('ready', flush=True); time.sleep(120)")


def _start(env_extra: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _BIG], env={**os.environ, **env_extra},
                         stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout.readline().strip() == b"ready"
    return p


@pytest.mark.parametrize("how", ["kill_tagged", "kill_run"])
def test_a_killed_process_has_finished_exiting_when_the_kill_returns(how):
    tag = uuid.uuid4().hex
    procs = [_start({GUARD_VAR: f"t{tag}-a", RUN_ID_VAR: tag})]
    try:
        killed = kill_tagged(GUARD_VAR, f"t{tag}", timeout_s=30) if how == "kill_tagged" \
            else kill_run(tag, timeout_s=30)
        assert sorted(set(killed)) == sorted(p.pid for p in procs)
        # zombies (not yet reaped by us, their parent) or gone: nothing still exiting
        assert [proc_state(p.pid).state for p in procs] == ["Z"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
