"""Warm processes: a python that has already imported torch, waiting to run one module.

    python -m smartlaunch.warm        then, on its stdin, one JSON line (the "go"):
    {"module": "smartlaunch.profile.trial", "argv": [...], "env": {the whole environment}}

`import torch` is ~3 s of every rank's start on a GPU node (2x H200, 2026-11-23: the floor
3.0 s; a trial's ranks and the all-reduce benchmark's each paid it after the dry run). The
pipeline starts these while the dry run's script sets itself up (pipeline_pools.py). The worker
imports torch and torch.distributed, then blocks on stdin. At the go it takes `env` as its
environment, sets sys.argv, puts /dev/null on its stdin (what a spawned rank gets) and runs the
module as `python -m` would (runpy, as `__main__`), exiting with its code. EOF or a bad message:
it exits at once, having run nothing.

Only PER_RUN variables may differ between the spawn and the go: what torch reads at import
(OMP_NUM_THREADS, the user's variables, the dry-run switches) is fixed by then. CUDA_VISIBLE_DEVICES
is per run while the CUDA driver is not loaded (`import torch` loads it not; checked at the go).
Any other difference and the worker execs a fresh `python -m module` with the go's environment:
slower, never different.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

from smartlaunch import proc

PER_RUN = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
    "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", proc.GUARD_VAR})
CUDA_VAR = "CUDA_VISIBLE_DEVICES"


class WarmPool:
    """k warm workers spawned with `env` (guarded, each in its own session); `take` hands one
    a module to run; `close` kills the rest. log_files: each writes to its own file in a temp
    dir of the pool's (a benchmark rank's log tail); else they share our stdout/stderr (a
    trial's ranks, as torchrun's agent leaves them)."""

    def __init__(self, k: int, env: dict[str, str], *, log_files: bool = True,
                 python: str = sys.executable):
        self.env = dict(env)
        self.log_dir = tempfile.mkdtemp(prefix="smartlaunch-warm-") if log_files else None
        if self.log_dir:
            proc.remove_on_exit(self.log_dir)
        self.free: list[tuple[proc.Child, str | None]] = []
        try:
            for i in range(k):
                path = os.path.join(self.log_dir, f"warm{i}.log") if self.log_dir else None
                out = open(path, "wb") if path else None
                try:
                    child = spawn([python, "-m", "smartlaunch.warm"], self.env, stdout=out,
                                  stderr=subprocess.STDOUT if out else None)
                finally:
                    if out is not None:
                        out.close()
                self.free.append((child, path))
        except BaseException:
            self.close()
            raise

    def take(self, module: str, argv: list[str], env: dict[str, str]
             ) -> tuple[proc.Child, str | None] | None:
        """A worker running `python -m module argv` with exactly `env`; None when none is
        left (or it died: the caller starts that rank cold)."""
        while self.free:
            child, path = self.free.pop(0)
            if send_go(child, module, argv, env):
                return child, path
            child.stop()
        return None

    def close(self) -> None:
        """Workers never given a go are killed (an idle one holds no state worth a grace)."""
        while self.free:
            child, _ = self.free.pop()
            child.stop(signal.SIGKILL, 0)
        if self.log_dir:
            import shutil
            shutil.rmtree(self.log_dir, ignore_errors=True)
            proc.remove_on_exit(self.log_dir, done=True)
            self.log_dir = None


def spawn(cmd: list[str], env: dict[str, str], **popen) -> proc.Child:
    """A warm worker (cmd ends in `-m smartlaunch.warm`; a wrapper such as the sandbox may
    come first), its stdin a pipe for the go."""
    return proc.spawn(cmd, env=env, stdin=subprocess.PIPE, **popen)


def send_go(child: proc.Child, module: str, argv: list[str], env: dict[str, str]) -> bool:
    """Hand a live worker its module; False when it has died (the caller starts one cold)."""
    if child.returncode is not None:
        return False
    go = json.dumps({"module": module, "argv": list(argv), "env": dict(env)})
    try:
        child.proc.stdin.write(go.encode() + b"\n")
        child.proc.stdin.close()
    except OSError:
        return False
    return True


def cuda_loaded() -> bool:
    """Has the CUDA driver been initialised here (it reads CUDA_VISIBLE_DEVICES once, at
    cuInit)? With torch 2.11+cu130 libcuda is already mapped after `import torch,
    torch.distributed` (2x H200, 2026-11-23) while torch.cuda.is_initialized() is False; a
    driver call before cuInit answers CUDA_ERROR_NOT_INITIALIZED (3) and initialises nothing."""
    import torch
    if torch.cuda.is_initialized():
        return True
    try:
        with open("/proc/self/maps") as f:
            if "libcuda.so" not in f.read():
                return False
        import ctypes
        count = ctypes.c_int(0)
        return ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(count)) != 3
    except (OSError, AttributeError):
        return True


def needs_fresh(now: dict[str, str], go: dict[str, str], cuda: bool) -> list[str]:
    """Variables that differ between the spawn and the go and are not per run."""
    per_run = PER_RUN if cuda else PER_RUN | {CUDA_VAR}
    keys = (set(now) | set(go)) - per_run
    return sorted(k for k in keys if now.get(k) != go.get(k))


def read_go(line: bytes) -> tuple[str, list[str], dict[str, str]]:
    msg = json.loads(line)
    module, argv, env = msg["module"], msg.get("argv", []), msg["env"]
    if not (isinstance(module, str) and module and isinstance(argv, list)
            and isinstance(env, dict)):
        raise ValueError("module must be a name, argv a list, env an object")
    return module, [str(a) for a in argv], {str(k): str(v) for k, v in env.items()}


def main() -> None:
    import torch.distributed as _dist                  # noqa: F401  (the point of it all)
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)                                    # EOF: not needed after all
    try:
        module, argv, env = read_go(line)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"smartlaunch warm: bad go message ({exc}); nothing was run", file=sys.stderr,
              flush=True)
        os._exit(2)
    if proc.GUARD_VAR in os.environ:
        env[proc.GUARD_VAR] = os.environ[proc.GUARD_VAR]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    differ = needs_fresh(dict(os.environ), env, cuda_loaded())
    if differ:
        print(f"smartlaunch warm: {', '.join(differ[:5])} changed since the import: a fresh "
              f"python runs {module}", file=sys.stderr, flush=True)
        flags = ["-u"] if getattr(sys.stdout, "write_through", False) else []    # runner's -u
        os.execve(sys.executable, [sys.executable, *flags, "-m", module, *argv], env)
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = open(0, closefd=False)
    sys.argv = [module, *argv]
    import runpy
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
