"""Helpers for the DDP launch tests: a CPU plan, a short-timeout policy, and a launcher process.

Run as a script it is a launcher (so tests can SIGKILL/SIGTERM it):
    python tests/helpers_ddp.py '<json: {"log_dir":..., "launch": {...}, "nproc": 2}>' SCRIPT [ARGS...]
and exits with run_ddp's exit code.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "tests" / "scripts_ddp" / "train_gloo.py")

# Short enough for CI, long enough for two ranks importing torch on 2 busy cores.
FAST = {"rank_failure_timeout_s": 5.0, "hang_timeout_s": 2.0, "hang_step_multiple": 5.0,
        "startup_grace_s": 60.0, "signal_grace_s": 1.0}


def make_policy(log_dir: str, **launch):
    from smartlaunch.policy.api import LaunchPolicy, Policy
    return Policy(launch=LaunchPolicy(log_dir=str(log_dir), **{**FAST, **launch}))


def make_request(nproc: int, script: str = SCRIPT, args: tuple[str, ...] = (), torchrun: tuple[str, ...] = ()):
    from torch.distributed.run import get_args_parser
    from smartlaunch.request import Request
    ns = get_args_parser().parse_args([*torchrun, "--nproc-per-node", str(nproc), script, *args])
    return Request(strategy="ddp", max_gpus=nproc, script=script, script_args=tuple(args),
                   torchrun_args=ns)


def cpu_plan(nproc: int):
    from smartlaunch.decide.plan import Plan, Strategy
    return Plan(strategy=Strategy.DDP, device="cpu", gpus=(), nproc_per_node=nproc, requested_max=nproc)


def launcher_argv(log_dir: str, nproc: int = 2, script: str = SCRIPT, **launch) -> list[str]:
    spec = json.dumps({"log_dir": str(log_dir), "nproc": nproc, "launch": launch})
    return [sys.executable, __file__, spec, script]


def marker_pids(out_dir: str | os.PathLike, kind: str = "") -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in Path(out_dir).glob(f"{kind}*-*")]


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(left)
    return left


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def descendants_of_test(out_dir) -> list[int]:
    """Every process this test started that is still alive (markers + stray tagged ones)."""
    return alive(marker_pids(out_dir))


def main() -> int:
    spec = json.loads(sys.argv[1])
    script, args = sys.argv[2], tuple(sys.argv[3:])
    from helpers_launch import run_ddp
    from smartlaunch.topology.api import cpu_only
    policy = make_policy(spec["log_dir"], **spec.get("launch", {}))
    return run_ddp(cpu_plan(spec["nproc"]), make_request(spec["nproc"], script, args), policy,
                   cpu_only("tests: CPU"))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
