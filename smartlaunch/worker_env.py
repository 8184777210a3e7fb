"""torchrun's worker environment, for processes smartlaunch starts without an agent: what
torch's LocalElasticAgent sets, except TORCHELASTIC_USE_AGENT_STORE=False (there is no agent
store, so the script's init_process_group creates its own)."""
from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env(error_file: str, run_id: str | None = None) -> dict[str, str]:
    return rank_env(0, 1, error_file=error_file, run_id=run_id)


def rank_env(rank: int, nproc: int, *, error_file: str, master_port: int | None = None,
             run_id: str | None = None,
             environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What torch's LocalElasticAgent gives local rank `rank` of `nproc` on one node.
    error_file: where torch's @record writes the rank's error (it opens it "w", following
    links): a path in a directory of ours that no one else can write, never a shared one.
    environ: where the variables the agent passes on rather than sets come from."""
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
        "TORCHELASTIC_ERROR_FILE": error_file,     # written by @record, on failure only
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING":
            (environ or {}).get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def narrow_visible(gpus, environ: Mapping[str, str], topology) -> str:
    """CUDA_VISIBLE_DEVICES selecting `gpus` (CUDA ordinals as this process sees them): the
    current variable's own tokens, else UUIDs (immune to CUDA_DEVICE_ORDER)."""
    current = environ.get("CUDA_VISIBLE_DEVICES")
    if current is not None and current.strip():
        tokens = [t.strip() for t in current.split(",") if t.strip()]
        return ",".join(tokens[i] for i in gpus)
    return ",".join(topology.gpu(i).uuid or str(topology.gpu(i).nvml_index) for i in gpus)
