"""tiny_ddp.py's training for only STEPS steps (default 8): a script whose own step count ends
before a held trial's second window."""
import os

import torch.distributed as dist

from ddp_loop import train

dist.init_process_group("gloo")
train(int(os.environ.get("STEPS", "8")))
