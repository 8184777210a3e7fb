# Diagnosis only (bench/diag/loader_hang.sh puts this folder on PYTHONPATH): every python
# started under it writes all its threads' stacks to /tmp/stacks/<pid>-<time>.txt on SIGUSR2,
# and goes on.
import faulthandler
import os
import signal
import sys
import time


def _dump(signum, frame):
    os.makedirs("/tmp/stacks", exist_ok=True)
    with open(f"/tmp/stacks/{os.getpid()}-{time.time():.1f}.txt", "w") as f:
        f.write(f"pid {os.getpid()} ppid {os.getppid()} argv {sys.argv}\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)


signal.signal(signal.SIGUSR2, _dump)
