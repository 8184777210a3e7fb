"""The orphan reaper: `python -m smartlaunch.launch.reaper RUN_ID RUN_DIR NPROC`.

Started by the DDP launcher in its own session with a pipe on stdin. The launcher never
writes; when it dies, even by SIGKILL, the pipe reaches EOF and the reaper SIGKILLs every
rank's process group and every process that still carries the run id (DataLoader workers
included: PR_SET_PDEATHSIG is not inherited across fork). On a normal exit the launcher has
already cleaned up and this sweep finds nothing.
"""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    run_id, run_dir, nproc = (argv or sys.argv[1:])[:3]
    launcher = os.getppid()
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    from smartlaunch.proc import kill_run
    from smartlaunch.launch.progress import progress_path, read_progress
    leaders = []
    for lr in range(int(nproc)):
        rec = read_progress(progress_path(run_dir, lr))
        if rec is not None and rec.exit_code is None:
            leaders.append(rec.pid)
    kill_run(run_id, leaders, exclude=(launcher,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
