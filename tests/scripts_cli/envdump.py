"""Writes the launcher-set environment to argv[1] and proves init_process_group works."""
import json
import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
        "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES")
env = {k: v for k, v in os.environ.items() if k in keys or k.startswith("TORCHELASTIC_")
       or k.startswith("TORCH_NCCL")}
env["_world"] = dist.get_world_size()
dist.destroy_process_group()
with open(sys.argv[1], "w") as f:
    json.dump(env, f)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
