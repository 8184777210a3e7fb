"""Parent side of the dry run: start the hooked child in its own session (a time-out kills it and
its workers as one group) with torchrun's single-rank environment, bound it in time, read its
profile. Its stdout goes to a log in the cache dir (none where that cannot be written: said once);
its stderr is echoed as is, copied into the log, its tail kept for the crash message."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from smartlaunch import proc, sandbox
from smartlaunch.errors import DryRunError
from smartlaunch.worker_env import single_rank_env
from smartlaunch.profile import undo
from smartlaunch.profile.api import ModelProfile, ProfileStatus
from smartlaunch.profile.early import DRY_RUN
from smartlaunch.profile.session import Session, State, owned
from smartlaunch.store import (
    MIN_FREE_BYTES, UNWRITABLE, cache_folder, cache_root, free_bytes, read_json, say_unwritable,
)

TERM_GRACE_S = 3.0       # SIGTERM -> SIGKILL; the child writes its partial result on SIGTERM
EXIT_GRACE_S = 5.0       # measured -> unwound by then, else killed
TAIL_LINES = 20
KEEP_LOGS = 20           # dry-run logs kept in <cache_dir>/logs
NO_LOG = "not kept: the cache directory is not writable"
DRYRUN_MODULE = "smartlaunch.profile.dryrun"


def dryrun_env(environ, gpu: str | None, results: str) -> dict[str, str]:
    """torchrun's environment for the one worker of a one-process job, plus the dry-run switches;
    results: the private directory its sandbox shares (its error file goes there)."""
    env = dict(environ)
    env.update(single_rank_env(os.path.join(results, "error.json"), run_id="smartlaunch-dryrun"))
    env.update(sandbox.DRYRUN_ENV)
    # "" hides every GPU: the CPU dry run must not touch a GPU another job holds.
    env.update(SMARTLAUNCH_DRYRUN="1", CUDA_VISIBLE_DEVICES="" if gpu is None else str(gpu))
    return env


class _Echo:
    """The dry run's stderr as it comes: to the user (echo), into its log, its last lines kept."""

    def __init__(self, tail: collections.deque, echo, log):
        self.tail, self.echo, self.log, self.partial = tail, echo, log, b""
        self.ended = False

    def __call__(self, data: bytes) -> None:
        for out in (self.echo, self.log):
            if out is not None and data:
                try:
                    out.write(data)
                    out.flush()
                except (OSError, ValueError):
                    pass
        *lines, self.partial = (self.partial + data).split(b"\n")
        if not data:
            self.ended = True
            lines, self.partial = [*lines, self.partial] if self.partial else lines, b""
        self.tail.extend(line.decode(errors="replace") for line in lines)


def _script_dir(request) -> list[str]:
    if request.script and not request.module and not request.no_python:
        return [os.path.dirname(os.path.abspath(request.script))]
    return []


def isolation_check(request, policy, environ) -> tuple[bool, str]:
    """(run isolated?, note). `require` and no isolation here: the caller does not run it."""
    mode = policy.dryrun.isolation
    if mode == "off":
        return False, "not isolated (dryrun.isolation=off)"
    # where we know the job writes: cwd, $HOME, the script's directory
    why = sandbox.unavailable([os.getcwd(), environ.get("HOME") or os.path.expanduser("~"),
                               *_script_dir(request)])
    if why is None:
        return True, ""
    if mode == "require":
        return False, (f"the dry run cannot be isolated here ({why}); "
                       f"{policy.rule('dryrun.isolation')}: not run, so it cannot change your "
                       f"files")
    return False, f"not isolated ({why}; dryrun.isolation=best-effort): it may have written files"


def undo_roots(request, policy, isolated: bool, own) -> undo.Listing | None:
    """best-effort without a sandbox: what the working and script directories hold now."""
    if isolated or policy.dryrun.isolation != "best-effort":
        return None
    return undo.take([os.getcwd(), *_script_dir(request)], skip=own)


def undo_note(listing: undo.Listing, own) -> str:
    if not listing.complete:
        return (f"more than {undo.MAX_ENTRIES} files in {', '.join(listing.roots)}: its writes "
                f"were not undone")
    removed, changed = undo.undo(listing, skip=own)
    note = f"removed the {removed} files and directories it created in {', '.join(listing.roots)}"
    if changed:
        note += f"; it changed or deleted {len(changed)} that cannot be restored: " + \
            ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
    return note


def run_dry_run(request, policy, *, gpu: str | None, environ, echo=None,
                progress=None, real_gpu: bool = False, session: Session | None = None,
                gate: bool = False) -> ModelProfile:
    """Profile the entrypoint once (no cache). echo: where the child's stderr goes (bytes; default
    the user's stderr). progress(k, n): as the child reaches step k of n. real_gpu: `gpu` is a GPU
    NVML found, so a script that never initialised CUDA is a finding. session: the decision's, else
    one of our own. gate: the first forward waits for its go (within the time limit)."""
    if request.no_python:
        return ModelProfile(ProfileStatus.SKIPPED, note=(
            "--no-python entrypoints cannot be profiled; using the policy's fallback strategy "
            f"({policy.decision.fallback_strategy})"))
    d = policy.dryrun
    isolated, iso_note = isolation_check(request, policy, environ)
    if not isolated and d.isolation == "require":
        print(f"smartlaunch: {iso_note}", file=sys.stderr, flush=True)
        return ModelProfile(ProfileStatus.SKIPPED, note=iso_note)
    if iso_note and d.isolation != "off":
        print(f"smartlaunch: dry run {iso_note}", file=sys.stderr, flush=True)
    limit = float(d.time_limit_s)
    root = cache_root(policy, environ)
    logs = cache_folder(root, "logs")
    if logs.is_dir():
        _prune(logs)
    stem = Path(request.script).stem or "script"
    log_path = logs / f"dryrun-{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    echo = echo if echo is not None else getattr(sys.stderr, "buffer", None)
    with owned(session) as s, proc.stage("the dry run"):
        tmp = s.tempdir("smartlaunch-dryrun-")
        results = os.path.join(tmp, "result")      # the one directory its sandbox shares
        out = os.path.join(results, "profile.json")
        os.makedirs(results)
        cmd = [*proc.python_m(DRYRUN_MODULE, flags=("-u",)), "--out", out,
               "--warmup", str(d.warmup_steps), "--measure", str(d.measure_steps),
               "--min-seconds", str(d.measure_seconds), "--precision", str(d.precision),
               *(["--gate"] if gate else []), *(["--module"] if request.module else []),
               request.script, *request.script_args]
        status = os.path.join(results, "isolation.json")
        if isolated:
            cmd = sandbox.wrap(cmd, os.path.join(tmp, "scratch"),
                               [results, *sandbox.compile_caches(environ, s.made_cache)], status)
        own = (str(root), tmp)
        listing = undo_roots(request, policy, isolated, own)
        t0 = time.monotonic()
        log = _open_log(log_path, root)
        if log is None:
            log_path = NO_LOG
        with log if log is not None else contextlib.nullcontext():
            stage = s.start(DRY_RUN, [(cmd, dryrun_env(environ, gpu, results),
                                       {"stdout": log if log is not None else subprocess.DEVNULL,
                                        "stderr": subprocess.PIPE})], gate=gate)
            stage.on_step = progress
            tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
            err = _Echo(tail, echo, log)
            s.pipe(stage.children[0].proc.stderr, err)
            timed_out = not s.wait(lambda: stage.over or stage.state == State.DONE, limit)
            if timed_out:
                s.kill(stage, f"the time limit ({limit:g} s)", signal.SIGTERM, TERM_GRACE_S)
            elif not stage.over and not s.wait(lambda: stage.over, EXIT_GRACE_S):
                # measured: a stuck `finally` must not hold the launch
                s.kill(stage, "it did not end after its result", signal.SIGTERM, TERM_GRACE_S)
            s.wait(lambda: err.ended, 1.0)        # the last of its stderr, for the tail
            code = stage.children[0].returncode
        elapsed = time.monotonic() - t0
        data = read_json(Path(out))
        iso = (read_json(Path(status)) or {}) if isolated else {}
        if listing is not None:
            iso_note = f"{iso_note}; {undo_note(listing, own)}"
    if isolated and not iso.get("isolated") and d.isolation == "require":
        return ModelProfile(ProfileStatus.SKIPPED, note=(
            f"the dry run cannot be isolated here ({iso.get('why') or 'no status'}); "
            f"{policy.rule('dryrun.isolation')}: not run"))
    prof = _profile(request, data, code, timed_out, limit, list(tail), log_path, elapsed,
                    echoed=echo is not None)
    if real_gpu and gpu and prof.usable and prof.device == "cpu":
        # Given a GPU, the script never initialised CUDA: launched as torchrun would.
        prof = dataclasses.replace(prof, status=ProfileStatus.UNMEASURABLE, note=(
            f"the dry run was given GPU {gpu} but the script ran on the CPU (it never "
            f"initialised CUDA), so its step times say nothing about a GPU run; check that "
            f"torch.cuda.is_available() is True for it (script output: {log_path})"))
    if iso_note:
        prof = dataclasses.replace(prof, note=f"{prof.note}; {iso_note}")
    return prof


def _open_log(path: Path, root: Path):
    """The dry run's log opened to append; None where the cache cannot hold it (said once when read-
    only or with less than store.MIN_FREE_BYTES free)."""
    try:
        room = free_bytes(path.parent)
        if room is not None and room < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return open(path, "ab")
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            say_unwritable(root, exc)
        return None


def _prune(logs: Path) -> None:
    old = sorted(logs.glob("dryrun-*.log"), key=lambda p: p.stat().st_mtime)[:-KEEP_LOGS]
    for p in old:
        try:
            p.unlink()
        except OSError:
            pass


def _profile(request, data, code, timed_out, limit, tail, log_path, elapsed, *,
             echoed: bool) -> ModelProfile:
    limit_txt = f"{limit:g} s"
    where = f"(script output: {log_path})"
    complete = bool(data) and _complete(data)
    if not timed_out and code not in (0, None) and not complete:
        last = "\n".join(tail[-10:])
        how = f"exit code {code}" if code > 0 else f"signal {-code}"
        read = (data or {}).get("reads_world_size")
        if read and not int((data or {}).get("steps_seen") or 0):
            # Lightning's Trainer(devices=2) refuses WORLD_SIZE=1; torchrun would run it.
            cause = next((line for line in reversed(tail) if line.strip()), how)
            return ModelProfile(ProfileStatus.UNMEASURABLE, reads_world_size=read, note=(
                f"the dry run (WORLD_SIZE=1) failed before its first step ({how}) after the "
                f"script read the world size ({read}), so it may fix it: {cause.strip()[:200]} "
                f"(script output: {log_path})"), dry_run_s=elapsed)
        # Echoed, its traceback is on the user's screen already: once is enough.
        output = (f"its error output is above; all of its output: {log_path})." if echoed
                  else f"its output: {log_path}).\n{last}")
        err = DryRunError(f"the dry run of {request.script} failed with {how}; it was not "
                          f"launched. Fix the script and run again ({output}")
        err.out_of_memory = any("out of memory" in line.lower() for line in tail)
        raise err
    data = data or {}
    fields = {f.name for f in dataclasses.fields(ModelProfile)}
    kw = {k: v for k, v in data.items() if k in fields}
    kw["dry_run_s"] = elapsed
    measured = int(data.get("steps_measured") or 0)
    if complete:
        status, note = ProfileStatus.OK, f"{measured} steps measured {where}"
        if data.get("window_cut_short"):
            note = (f"{measured} steps measured, but the script ended before the window's "
                    f"minimum length; times are less certain {where}")
    elif measured:
        status = ProfileStatus.INCOMPLETE
        why = f"the time limit ({limit_txt}) ended it" if timed_out else "the script ended"
        note = f"only {measured} steps measured before {why}; times are noisy {where}"
    elif timed_out:
        status, note = ProfileStatus.NO_STEP, f"no training step seen within {limit_txt} {where}"
    else:
        # Ended on its own: its trials would end the same, unless it read the world size
        # first (a script that needs two ranks may exit at one): then trials may see more.
        status = ProfileStatus.NO_STEP if data.get("reads_world_size") else ProfileStatus.ENDED
        if not data.get("optimizers_built") and not data.get("marker"):
            note = ("the script ended without building a torch optimizer or calling "
                    f"smartlaunch.profile_step(); cannot time a training step {where}")
        else:
            note = (f"the script ended after {data.get('steps_seen', 0)} steps, too few to "
                    f"measure (warm-up included) {where}")
        if status == ProfileStatus.NO_STEP:
            note += f"; it read the world size first ({data['reads_world_size']})"
    if status in (ProfileStatus.NO_STEP, ProfileStatus.ENDED):
        for k in ("step_time_s", "step_time_p90_s", "forward_s", "backward_s"):
            kw.pop(k, None)
    return ModelProfile(status=status, note=note, **kw)


def _complete(data) -> bool:
    """The window holds the steps asked, or closed early with the mean known to the precision
    asked."""
    measured = int(data.get("steps_measured") or 0)
    return measured >= int(data.get("measure_asked") or 1) or (
        data.get("reason") == "measured" and bool(data.get("precise")) and measured > 0)
