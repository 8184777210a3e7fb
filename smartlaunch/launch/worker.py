"""The worker hook: `python -m smartlaunch.launch.worker [--module|--no-python] TARGET ARGS...`.

Every rank and job runs its script through it, unchanged. Before the script: NUMA binding,
PR_SET_PDEATHSIG plus a thread that kills the rank's group when the launcher goes, faulthandler
on DUMP_SIGNAL (real-time: SIGUSR1/2 are the script's) to <run_dir>/stacks/local<N>.txt, the
progress counter (optimizer step hook, smartlaunch.profile_step()) and, where LOCAL_WORLD_SIZE
is 2 or more, the work timer (its only reader compares the node's ranks).
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import MutableMapping, Sequence

from smartlaunch import logconf
from smartlaunch.entry import after_import, report_uncaught, run_entrypoint
from smartlaunch.launch import numa, worktime
from smartlaunch.launch.progress import ProgressWriter, progress_path
from smartlaunch.proc import naming_output_copiers, prctl, python_m
from smartlaunch.store import open_private

RUN_DIR_VAR = "SMARTLAUNCH_RUN_DIR"
RUN_ID_VAR = "SMARTLAUNCH_RUN_ID"          # also the tag kill_run finds stray processes by
LAUNCHER_PID_VAR = "SMARTLAUNCH_LAUNCHER_PID"
TEE_DIR_VAR = "SMARTLAUNCH_TEE_DIR"        # copy stdout/stderr to <dir>/<local_rank>/std*.log
STATUS_LINE_VAR = "SMARTLAUNCH_STATUS_LINE"  # "1": the launcher draws a status line on the tty
DUMP_SIGNAL = signal.SIGRTMIN + 2
log = logging.getLogger("smartlaunch.launch.worker")     # run as __main__
_PR_SET_PDEATHSIG = 1
_PARENT_POLL_S = 1.0
OPTIMIZER_MODULE = "torch.optim.optimizer"   # its register_optimizer_step_post_hook counts steps
NOT_COUNTED = "steps of this rank not counted"
_keep: list = []                           # objects that must outlive main() (stack file)


def worker_command(command, python: str) -> list[str]:
    """argv of one wrapped worker: the hook in front of Plan.command."""
    return [*python_m("smartlaunch.launch.worker", python, flags=("-u",)), *command]


def forget_outer_launch(environ: MutableMapping[str, str]) -> None:
    """Drop the hook's variables a launch inside a worker inherits (a script that runs
    smartlaunch): its own workers would copy their output into the outer rank's logs and take
    the outer rank's NUMA binding."""
    for name in (RUN_DIR_VAR, RUN_ID_VAR, LAUNCHER_PID_VAR, TEE_DIR_VAR, STATUS_LINE_VAR,
                 numa.ENV_VAR, numa.APPLIED_VAR):
        environ.pop(name, None)


def worker_env(run_dir: str, run_id: str, bindings: Sequence = ()) -> dict[str, str]:
    """Variables a launcher adds to each worker's environment for the hook."""
    env = {RUN_DIR_VAR: str(run_dir), RUN_ID_VAR: run_id, LAUNCHER_PID_VAR: str(os.getpid())}
    encoded = numa.encode(bindings)
    if encoded != "[]":
        env[numa.ENV_VAR] = encoded
    return env


def stack_path(run_dir: str, local_rank: int) -> str:
    return os.path.join(run_dir, "stacks", f"local{local_rank}.txt")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    logconf.from_environ(os.environ)
    log.debug("worker hook starts (rank %s)", os.environ.get("RANK", "?"))
    mode, target, args = _parse(list(argv))
    _bind_numa(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if os.environ.get(TEE_DIR_VAR):
        _tee_output(os.path.join(os.environ[TEE_DIR_VAR], str(local_rank)))
    _die_with_parent()
    run_dir = os.environ.get(RUN_DIR_VAR)
    if mode == "no-python":
        os.execvp(target, [target, *args])
    writer = None
    if run_dir:
        try:
            _register_stack_dump(stack_path(run_dir, local_rank))
        except OSError as exc:          # the job is worth more than its stack dumps
            print(f"smartlaunch: no stack dumps for this rank: cannot open "
                  f"{stack_path(run_dir, local_rank)} ({exc.strerror}); the job goes on",
                  file=sys.stderr, flush=True)
        try:
            writer = ProgressWriter(progress_path(run_dir, local_rank), local_rank,
                                    int(os.environ.get("RANK", "0")))
        except OSError as exc:          # nor its step count (the summary has no rate then)
            print(f"smartlaunch: steps of this rank not counted: cannot make "
                  f"{progress_path(run_dir, local_rank)} ({exc.strerror}); the job goes on",
                  file=sys.stderr, flush=True)
        if writer is not None:
            _install_step_hooks(writer)
        if writer is not None and _local_world_size() > 1:   # the straggler warning compares
            with contextlib.suppress(OSError):                # this node's ranks
                timer = worktime.install(run_dir, local_rank)
                _keep.append(timer)
                after_import(OPTIMIZER_MODULE,
                             lambda m: m.register_optimizer_step_post_hook(timer._after_step),
                             "work timing off for this rank")
    log.debug("the script starts: %s", target)
    # The exit status goes into the record after the script's last words: the launcher stops
    # the other ranks on seeing it.
    try:
        run_entrypoint(target, args, module=mode == "module")
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr, flush=True)     # what python prints for it
            e = SystemExit(1)
        if writer is not None:
            writer.exited(e.code or 0)
        raise e from None
    except BaseException as exc:            # uncaught: printed as python would, our frames cut
        code = report_uncaught(exc)
        if writer is not None:
            writer.exited(code)
        del exc
        sys.exit(code)
    if writer is not None:
        writer.exited(0)


def _parse(argv: list[str]) -> tuple[str, str, list[str]]:
    mode = "path"
    while argv and argv[0] in ("--module", "--no-python", "-m"):
        mode = "no-python" if argv.pop(0) == "--no-python" else "module"
    if not argv:
        sys.exit("usage: python -m smartlaunch.launch.worker [--module|--no-python] TARGET [ARGS...]")
    return mode, argv[0], argv[1:]


def _local_world_size() -> int:
    """LOCAL_WORLD_SIZE as torch's agent sets it; 1 where it is missing or not a number."""
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    except ValueError:
        return 1


def _bind_numa(argv: list[str]) -> None:
    entry = numa.binding_for(os.environ)
    if not entry:
        return
    if entry.get("mechanism") == "numactl":
        if os.environ.get(numa.APPLIED_VAR):
            return                        # this process already runs under numactl
        os.environ[numa.APPLIED_VAR] = "1"
        cmd = numa.numactl_argv(entry, worker_command(argv, sys.executable))
        try:
            os.execv(cmd[0], cmd)         # same pid: the agent still tracks this rank
        except OSError:
            del os.environ[numa.APPLIED_VAR]   # numactl vanished since the plan: affinity only
    try:
        numa.apply_affinity(entry)
    except OSError:
        pass


def _tee_output(log_dir: str) -> None:
    """Copy fds 1 and 2 to log files through a forked copier each, the terminal's output left
    unchanged (torch's tee prefixes lines); the copier ignores the job's signals and drains
    until the last writer is gone."""
    status_line = os.environ.get(STATUS_LINE_VAR) == "1"
    for fd, name in ((1, "stdout"), (2, "stderr")):
        path = os.path.join(log_dir, f"{name}.log")
        try:        # before the fork: a log that cannot be opened leaves the stream as it is
            os.makedirs(log_dir, mode=0o700, exist_ok=True)
            log = open_private(path, "ab", buffering=0)
        except OSError as exc:
            print(f"smartlaunch: {name} of this rank not kept in {path} ({exc.strerror}); "
                  f"the job goes on", file=sys.stderr, flush=True)
            continue
        r, w = os.pipe()
        # Its own group and name before the rank runs on: kill_run spares it until drained.
        with naming_output_copiers():
            pid = os.fork()
        if pid == 0:
            try:                          # nothing of this copy may run on as the rank
                os.close(w)
                os.setpgid(0, 0)
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                          signal.SIGUSR2):
                    signal.signal(s, signal.SIG_IGN)
                # a new output line erases the launcher's steps/s line first (not mid-line)
                erase = b"\r\x1b[K" if status_line and os.isatty(fd) else b""
                _copy_output(r, fd, log, erase, f"{name} of this rank", path)
            finally:
                os._exit(0)
        with contextlib.suppress(OSError):   # the child may have done it already
            os.setpgid(pid, pid)
        log.close()
        os.close(r)
        os.dup2(w, fd)
        os.close(w)


def _copy_output(r: int, fd: int, log, erase: bytes, what: str, path: str) -> None:
    """Copy the pipe r to the stream fd and the log until the last writer is gone. Neither can
    stop the job: a log that fails (its disk full, a quota) is left, said once on stderr; a
    stream that fails (the terminal gone) is skipped, the log kept complete."""
    at_line_start = True
    with log:
        while data := os.read(r, 65536):
            if not log.closed:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[log.write(view):]
                except OSError as exc:
                    log.close()
                    with contextlib.suppress(OSError):
                        os.write(2, f"smartlaunch: {what} no longer kept in {path} "
                                    f"({exc.strerror}); the job goes on\n".encode())
            with contextlib.suppress(OSError):
                os.write(fd, erase + data if at_line_start else data)
            at_line_start = data.endswith(b"\n")


def _die_with_parent() -> None:
    expected = int(os.environ.get(LAUNCHER_PID_VAR, "0") or 0)
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)   # not Linux: the watcher thread below still works
    parent = os.getppid()
    if expected and parent != expected:
        os._exit(128 + signal.SIGKILL)    # the launcher died before PDEATHSIG was armed

    def watch() -> None:
        while True:
            threading.Event().wait(_PARENT_POLL_S)
            if os.getppid() != parent:
                if os.getpgrp() == os.getpid():
                    from smartlaunch.proc import signal_group
                    signal_group(os.getpid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="smartlaunch-parent-watch", daemon=True).start()


def _register_stack_dump(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    f = open_private(path, "a")           # faulthandler needs it open for life
    _keep.append(f)
    faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)
    faulthandler.enable(file=f, all_threads=True)    # fatal signals: stacks for the root cause


def _install_step_hooks(writer: ProgressWriter) -> None:
    import smartlaunch
    explicit = [False]

    def profile_step() -> None:
        explicit[0] = True                # explicit marks win over optimizer counting
        writer.step()

    def on_optimizer_step(optimizer, args, kwargs) -> None:
        if not explicit[0]:
            writer.step()

    smartlaunch._step_hook = profile_step
    after_import(OPTIMIZER_MODULE, lambda m: m.register_optimizer_step_post_hook(on_optimizer_step),
                 NOT_COUNTED)


if __name__ == "__main__":
    main()
