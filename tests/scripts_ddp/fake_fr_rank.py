"""A rank for the hang test without NCCL (tests only): it counts steps through
smartlaunch.profile_step(), answers Flight Recorder dump requests the way torch's heartbeat
thread does (FIFO `<stem><rank>.pipe`, pickle to `<prefix><rank>`), then hangs. Rank 1 stops
one collective short of rank 0, as if it skipped an all-reduce."""
import os
import pickle
import threading
import time

import smartlaunch

rank = int(os.environ["RANK"])
stem, prefix = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"], os.environ["TORCH_FR_DUMP_TEMP_FILE"]
last = 600 if rank == 0 else 599
entries = [{"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": "nccl:all_reduce", "state": "completed" if seq < 600 else "scheduled",
            "input_sizes": [[1]]} for seq in range(last - 3, last + 1)]
pipe = f"{stem}{rank}.pipe"
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)


def heartbeat():
    while True:
        try:
            if os.read(fd, 64):
                with open(f"{prefix}{rank}", "wb") as f:
                    pickle.dump({"version": "2.10", "entries": entries}, f)
        except BlockingIOError:
            pass
        time.sleep(0.2)


threading.Thread(target=heartbeat, daemon=True).start()
for _ in range(5):
    smartlaunch.profile_step()
    time.sleep(0.05)
time.sleep(3600)
