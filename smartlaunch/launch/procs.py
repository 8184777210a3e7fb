"""Moved to smartlaunch.proc (one process helper for every layer); kept for the watchdog."""
from smartlaunch.proc import (  # noqa: F401
    RUN_ID_VAR, ProcState, kill_run, proc_state, run_processes, signal_group, signal_name,
)
