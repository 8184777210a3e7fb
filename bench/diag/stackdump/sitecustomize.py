# Diagnosis only (bench/diag/loader_hang.sh puts this folder on PYTHONPATH): every python
# started under it dumps all its threads' stacks to its stderr on SIGUSR2, and goes on.
import faulthandler
import signal

faulthandler.register(signal.SIGUSR2, all_threads=True, chain=False)
