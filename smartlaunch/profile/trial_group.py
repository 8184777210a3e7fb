"""A trial's ranks started without torchrun's agent (no torch import here):

    python -m smartlaunch.profile.trial_group --nproc N -- SHIM_ARGS...

runs N ranks of `python -m smartlaunch.profile.trial SHIM_ARGS` with torchrun's environment
contract, each in its own session; one failing ends the others; SIGTERM/SIGINT/SIGHUP are passed
on. Exits 0, or with the first failed rank's code. Rank r gets the r-th SMARTLAUNCH_CONTROL_FD."""
from __future__ import annotations

import os
import signal
import sys
import uuid

from smartlaunch import proc
from smartlaunch.profile.control import ENV_VAR
from smartlaunch.profile.session import Session
from smartlaunch.worker_env import free_port, rank_env

SHIM = "smartlaunch.profile.trial"
GRACE_S = 4.0      # below session.STOP_GRACE_S: our ranks are gone before the caller's SIGKILL


def rank_envs(environ, nproc: int, out_dir: str) -> tuple[list[dict[str, str]], list[int] | None]:
    """Each rank's environment (torchrun's contract; its error file in out_dir, the trial's
    private directory), and its own control descriptor when the spawner was given one per
    rank."""
    port, run_id = free_port(), str(uuid.uuid4())
    base = dict(environ)
    if "OMP_NUM_THREADS" not in environ and nproc > 1:   # torchrun's one change to it
        base["OMP_NUM_THREADS"] = "1"
    given = base.pop(ENV_VAR, "").split(",")
    envs = [{**base, **rank_env(r, nproc, error_file=os.path.join(out_dir, f"error-{r}.json"),
                                master_port=port, run_id=run_id, environ=environ)}
            for r in range(nproc)]
    if len(given) != nproc or not all(f.isdigit() for f in given):
        return envs, None
    for env, fd in zip(envs, given):
        env[ENV_VAR] = fd
    return envs, [int(f) for f in given]


def run_group(nproc: int, shim_args: list[str]) -> int:
    """Start the ranks, wait for all; one failing (or a signal to us) ends the rest."""
    envs, fds = rank_envs(os.environ, nproc, shim_args[shim_args.index("--out-dir") + 1])
    argv = [*proc.python_m(SHIM), *shim_args]
    with Session() as session:
        stage = session.start("a trial's ranks", [
            (argv, env, {"pass_fds": (fds[r],) if fds else ()}) for r, env in enumerate(envs)],
            ranks=0)            # their control sockets are the ones we were given

        def failed() -> int | None:
            return next((r for r, c in enumerate(stage.children)
                         if c.returncode not in (None, 0)), None)
        try:
            session.wait(lambda: stage.over or failed() is not None)
        except proc.Signalled as sig:
            session.kill(stage, proc.signal_name(sig.signum), sig.signum, GRACE_S)
            raise
        rank = failed()
        if rank is None:
            return 0
        code = stage.children[rank].returncode
        print(f"smartlaunch trial: rank {rank} {proc.describe_exit(code)}; ending the other "
              f"ranks", file=sys.stderr, flush=True)
        session.kill(stage, f"rank {rank} failed", signal.SIGTERM, GRACE_S)
        return code if code > 0 else 128 - code


def _signalled(signum, _frame):
    raise proc.Signalled(signum)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--nproc" or argv[2] != "--" or not argv[1].isdigit():
        print("usage: python -m smartlaunch.profile.trial_group --nproc N -- SHIM_ARGS...",
              file=sys.stderr)
        return 2
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(s) != signal.SIG_IGN:        # ignored by the launcher's caller
            signal.signal(s, _signalled)
    return run_group(int(argv[1]), argv[3:])


if __name__ == "__main__":
    sys.exit(main())
