"""torchrun's worker environment contract, for processes smartlaunch starts without an agent
(the dry run, the all-reduce measurement, trials, single and independent jobs). Ground floor: the
profile and launch layers both start workers, so neither may own it.

Matches what torch's LocalElasticAgent sets for a one-rank group (checked against a real
`torchrun --nproc-per-node 1` in tests/test_cli_launch.py), except
TORCHELASTIC_USE_AGENT_STORE=False: there is no agent store, so a script's
init_process_group must create its own TCPStore instead of waiting for one that never comes.
"""
from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Mapping


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env(master_port: int | None = None, run_id: str | None = None) -> dict[str, str]:
    return rank_env(0, 1, master_port=master_port, run_id=run_id)


def rank_env(rank: int, nproc: int, *, master_port: int | None = None, run_id: str | None = None,
             environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What torch's LocalElasticAgent gives local rank `rank` of `nproc` on one node (a trial's
    ranks, started without the agent). environ: the variables the agent passes on rather than
    sets (TORCH_NCCL_ASYNC_ERROR_HANDLING; OMP_NUM_THREADS is the caller's, as in run.py)."""
    run_id = run_id or str(uuid.uuid4())
    n, r = str(nproc), str(rank)
    return {
        "RANK": r,
        "LOCAL_RANK": r,
        "GROUP_RANK": "0",
        "ROLE_RANK": r,
        "ROLE_NAME": "default",
        "WORLD_SIZE": n,
        "LOCAL_WORLD_SIZE": n,
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": n,
        "MASTER_ADDR": "localhost",           # what torchrun sets
        "MASTER_PORT": str(master_port or free_port()),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        # Written by @record only when the script fails; the random run id keeps the name
        # unguessable in a shared /tmp, and nothing is created up front (no temp dir leak).
        "TORCHELASTIC_ERROR_FILE": os.path.join(
            tempfile.gettempdir(),
            f"smartlaunch-error-{run_id}" + (f"-{rank}" if nproc > 1 else "") + ".json"),
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": (environ or {}).get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def narrow_visible(gpus, environ: Mapping[str, str], topology) -> str:
    """CUDA_VISIBLE_DEVICES selecting `gpus` (CUDA ordinals as this process sees them).

    With CUDA_VISIBLE_DEVICES already set, keep its own tokens (indices, UUIDs or MIG UUIDs)
    so the child sees exactly the devices we picked; otherwise name them by UUID, which is
    immune to CUDA_DEVICE_ORDER.
    """
    current = environ.get("CUDA_VISIBLE_DEVICES")
    if current is not None and current.strip():
        tokens = [t.strip() for t in current.split(",") if t.strip()]
        return ",".join(tokens[i] for i in gpus)
    return ",".join(topology.gpu(i).uuid or str(topology.gpu(i).nvml_index) for i in gpus)
