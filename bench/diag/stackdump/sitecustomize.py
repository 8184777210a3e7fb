# Diagnosis only (bench/diag/loader_hang.sh puts this folder on PYTHONPATH): every python
# started under it writes all its threads' stacks to /dev/shm/stacks/<pid>-<time>.txt on SIGUSR2,
# and goes on.
import faulthandler
import os
import signal
import sys
import time


def _dump(signum, frame):
    os.makedirs("/dev/shm/stacks", exist_ok=True)
    with open(f"/dev/shm/stacks/{os.getpid()}-{time.time():.1f}.txt", "w") as f:
        f.write(f"pid {os.getpid()} ppid {os.getppid()} argv {sys.argv}\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)


signal.signal(signal.SIGUSR2, _dump)
