"""The worker hook with one of its run-directory features left out, for bench/job_overhead.py's
torchrun-hook-<variant> kinds (issue 35: which part of the hook costs a launch-bound rank):

    python bench/diag/hook_variant.py notimer|nodump|nosteps TARGET ARGS...

notimer: no work timer (smartlaunch/launch/worktime.py); nodump: no stack-dump file or
faulthandler registration; nosteps: no step counter (the progress record's optimizer hook)."""
import sys

from smartlaunch.launch import worker

VARIANTS = {
    "notimer": lambda: setattr(worker, "_local_world_size", lambda: 1),   # the timer's condition
    "nodump": lambda: setattr(worker, "_register_stack_dump", lambda path: None),
    "nosteps": lambda: setattr(worker, "_install_step_hooks", lambda writer: None),
}

if __name__ == "__main__":
    VARIANTS[sys.argv[1]]()
    worker.main(sys.argv[2:])
