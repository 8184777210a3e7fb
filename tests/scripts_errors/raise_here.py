"""Fails as a user's script does: an exception two frames deep, on the ranks FAIL_RANKS names
(all when unset). SLOW_HOOK=1 installs a sys.excepthook that takes 0.15 s before printing, as a
logging or crash-reporting hook does; ATEXIT_FILE=path makes a failing rank write that file from
an atexit handler after 0.5 s (its teardown). Healthy ranks wait in a barrier for the failure."""
import atexit
import os
import sys
import time


def slow_hook(kind, value, tb):
    time.sleep(0.15)
    sys.__excepthook__(kind, value, tb)


def teardown(path):
    time.sleep(0.5)
    with open(path, "w") as f:
        f.write("teardown done\n")


def inner(rank):
    raise ValueError(f"deliberate failure of rank {rank}")


def outer(rank):
    inner(rank)


rank = int(os.environ.get("RANK", "0"))
failing = os.environ.get("FAIL_RANKS")
if failing is None or str(rank) in failing.split(","):
    if os.environ.get("SLOW_HOOK"):
        sys.excepthook = slow_hook
    if os.environ.get("ATEXIT_FILE"):
        atexit.register(teardown, os.environ["ATEXIT_FILE"])
    outer(rank)
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
