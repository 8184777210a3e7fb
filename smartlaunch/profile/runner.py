"""Parent side of the dry run: start the hooked child, bound it in time, read its profile.

The child runs `python -m smartlaunch.profile.dryrun ... <script> <args>` in its own session
(so a time-out kills it and its DataLoader workers as one group, and nothing else), with
torchrun's single-rank environment so scripts that call init_process_group unconditionally
work. Its stdout goes to a log file in the cache dir; its stderr is echoed to the user as is,
copied into that log, and its tail kept for the crash message where it was not echoed.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from smartlaunch import proc, sandbox
from smartlaunch.errors import DryRunError
from smartlaunch.worker_env import single_rank_env
from smartlaunch.profile import undo
from smartlaunch.profile.api import ModelProfile, ProfileStatus
from smartlaunch.profile.tick import TickWatch
from smartlaunch.store import cache_root, private_dir, read_json

TERM_GRACE_S = 3.0       # SIGTERM -> SIGKILL; the child writes its partial result on SIGTERM
EXIT_GRACE_S = 5.0       # measured -> unwound by then (torch teardown ~0.5 s), else killed
TAIL_LINES = 20
KEEP_LOGS = 20           # dry-run logs kept in <cache_dir>/logs


DRYRUN_MODULE = "smartlaunch.profile.dryrun"


def result_dir(tmp: str) -> str:
    """The dry run's temp dir's result/: the profile, the step ticks, the isolation status;
    the one directory its sandbox shares (profile/early.py lays out the same)."""
    return os.path.join(tmp, "result")


def isolation_status(tmp: str) -> str:
    return os.path.join(result_dir(tmp), "isolation.json")


def dryrun_env(environ, gpu: str | None) -> dict[str, str]:
    """torchrun's environment for the one worker of a one-process job (the same contract
    the single-GPU launcher gives a real run), plus the dry-run switches."""
    env = dict(environ)
    env.update(single_rank_env(run_id="smartlaunch-dryrun"))
    env.update(sandbox.DRYRUN_ENV)
    env.update({
        "SMARTLAUNCH_DRYRUN": "1",
        # "" hides every GPU: the CPU dry run must not touch a GPU another job holds.
        "CUDA_VISIBLE_DEVICES": "" if gpu is None else str(gpu),
    })
    return env


def _pump(stream, tail: collections.deque, echo, log) -> None:
    for raw in iter(stream.readline, b""):
        tail.append(raw.decode(errors="replace").rstrip("\n"))
        for out in (echo, log):
            if out is not None:
                try:
                    out.write(raw)
                    out.flush()
                except (OSError, ValueError):
                    pass
    stream.close()


def isolation_paths(request, environ) -> list[str]:
    """Where we know the job writes: cwd, the script's directory, $HOME."""
    paths = [os.getcwd(), environ.get("HOME") or os.path.expanduser("~")]
    if request.script and not request.module and not request.no_python:
        paths.append(os.path.dirname(os.path.abspath(request.script)))
    return paths


def isolation_check(request, policy, environ) -> tuple[bool, str]:
    """(run isolated?, note). `require` and no isolation here: the caller does not run it."""
    mode = policy.dryrun.isolation
    if mode == "off":
        return False, "not isolated (dryrun.isolation=off)"
    why = sandbox.unavailable(isolation_paths(request, environ))
    if why is None:
        return True, ""
    if mode == "require":
        return False, (f"the dry run cannot be isolated here ({why}); {policy.rule('dryrun.isolation')}"
                       f": not run, so it cannot change your files")
    return False, f"not isolated ({why}; dryrun.isolation=best-effort): it may have written files"


def undo_roots(request, policy, isolated: bool, own) -> undo.Listing | None:
    """best-effort without a sandbox: what the working and script directories hold now."""
    if isolated or policy.dryrun.isolation != "best-effort":
        return None
    paths = [os.getcwd()]
    if request.script and not request.module and not request.no_python:
        paths.append(os.path.dirname(os.path.abspath(request.script)))
    return undo.take(paths, skip=own)


def undo_note(listing: undo.Listing, own) -> str:
    if not listing.complete:
        return f"more than {undo.MAX_ENTRIES} files in {', '.join(listing.roots)}: its writes were not undone"
    removed, changed = undo.undo(listing, skip=own)
    note = f"removed the {removed} files and directories it created in {', '.join(listing.roots)}"
    if changed:
        note += f"; it changed or deleted {len(changed)} that cannot be restored: " + \
            ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
    return note


def run_dry_run(request, policy, *, gpu: str | None, environ, echo=None,
                progress=None, real_gpu: bool = False, gate: str | None = None,
                early=None) -> ModelProfile:
    """Profile the entrypoint once (no cache). echo: where the child's stderr goes (bytes
    stream; default the user's stderr). progress(k, n): called as the child reaches step k
    of the n it expects (the status line's "dry run step k of n"). real_gpu: `gpu` is a GPU
    NVML found (not a fixture's), so a script that never initialised CUDA is a finding.
    gate: a file the script's first forward waits for (dryrun_args; its directory is shared
    with the sandbox); the wait counts in the time limit.
    early: the dry run's process started before the command line was parsed (early.py),
    used when it was isolated as this dry run must be; closed here either way."""
    if request.no_python:
        return ModelProfile(ProfileStatus.SKIPPED, note="--no-python entrypoints cannot be profiled; "
                            f"using the policy's fallback strategy ({policy.decision.fallback_strategy})")
    isolated, iso_note = isolation_check(request, policy, environ)
    if not isolated and policy.dryrun.isolation == "require":
        print(f"smartlaunch: {iso_note}", file=sys.stderr, flush=True)
        return ModelProfile(ProfileStatus.SKIPPED, note=iso_note)
    if iso_note and policy.dryrun.isolation != "off":
        print(f"smartlaunch: dry run {iso_note}", file=sys.stderr, flush=True)
    limit = float(policy.dryrun.time_limit_s)
    logs = private_dir(private_dir(cache_root(policy, environ)) / "logs")
    _prune(logs)
    stem = Path(request.script).stem or "script"
    log_path = logs / f"dryrun-{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    echo = echo if echo is not None else getattr(sys.stderr, "buffer", None)
    if early is not None and early.isolated != isolated:
        early.close()                # started on a guess this policy does not share
        early = None
    tmp = early.tmp if early is not None else tempfile.mkdtemp(prefix="smartlaunch-dryrun-")
    if early is None:
        proc.remove_on_exit(tmp)
    try:
        out = os.path.join(result_dir(tmp), "profile.json")
        os.makedirs(result_dir(tmp), exist_ok=True)
        ticks = os.path.join(result_dir(tmp), "steps.bin")
        args = ["--out", out, "--progress", ticks,
                "--warmup", str(policy.dryrun.warmup_steps),
                "--measure", str(policy.dryrun.measure_steps),
                "--min-seconds", str(policy.dryrun.measure_seconds)]
        if gate is not None:
            args += ["--gate", gate]
        if request.module:
            args.append("--module")
        args += [request.script, *request.script_args]
        cmd = [sys.executable, "-u", "-m", DRYRUN_MODULE, *args]
        status = isolation_status(tmp)
        if isolated:
            shared = [os.path.dirname(out)] + (
                [os.path.dirname(gate)] if gate and os.path.dirname(gate) != os.path.dirname(out)
                else [])
            cmd = sandbox.wrap(cmd, os.path.join(tmp, "scratch"), shared, status)
        own = (str(cache_root(policy, environ)), tmp)
        listing = undo_roots(request, policy, isolated, own)
        t0 = time.monotonic()
        # append mode: the child's stdout and our copy of its stderr interleave, never
        # overwrite (an early process's stdout is appended after it ends)
        with open(log_path, "ab") as log:
            env = dryrun_env(environ, gpu)
            child = early.take(args, env) if early is not None else None
            if child is None:
                child = proc.spawn(cmd, env=env, stdout=log, stderr=subprocess.PIPE,
                                   stage="the dry run")
            with child:
                tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
                pump = threading.Thread(target=_pump, args=(child.proc.stderr, tail, echo, log),
                                        daemon=True)
                pump.start()
                watch = TickWatch(ticks, progress)
                timed_out = _wait(child, out, limit, watch)
                code = child.stop(signal.SIGTERM, TERM_GRACE_S) if timed_out else child.stop()
                watch.poll()            # the last step's count, had the child ended in between
                pump.join(timeout=5)
            if early is not None:
                early.copy_stdout(log)  # a warm start wrote to its own file
        elapsed = time.monotonic() - t0
        data = read_json(Path(out))
        iso = sandbox.read_status(status) if isolated else {}
        if listing is not None:
            iso_note = f"{iso_note}; {undo_note(listing, own)}"
    finally:
        if early is not None:
            early.close()
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            proc.remove_on_exit(tmp, done=True)
    if isolated and not iso.get("isolated"):
        note = (f"the dry run cannot be isolated here ({iso.get('why') or 'no status'}); "
                f"{policy.rule('dryrun.isolation')}: not run")
        if policy.dryrun.isolation == "require":
            return ModelProfile(ProfileStatus.SKIPPED, note=note)
    prof = _profile(request, data, code, timed_out, limit, list(tail), log_path, elapsed,
                    echoed=echo is not None)
    if real_gpu and gpu and prof.usable and prof.device == "cpu":
        # Given a GPU, the script never initialised CUDA: its times say nothing about a GPU
        # run (an isolation bug once hid the driver library this way: 4.2 s "steps" of a
        # 31 ms GPU step, and DDP predicted 1.87x where it ran at 0.83x). Launched as
        # torchrun would launch it, which is what a script that ignores GPUs gets anyway.
        prof = dataclasses.replace(prof, status=ProfileStatus.UNMEASURABLE, note=(
            f"the dry run was given GPU {gpu} but the script ran on the CPU (it never "
            f"initialised CUDA), so its step times say nothing about a GPU run; check that "
            f"torch.cuda.is_available() is True for it (script output: {log_path})"))
    if iso_note:
        prof = dataclasses.replace(prof, note=f"{prof.note}; {iso_note}")
    return prof


def _prune(logs: Path) -> None:
    old = sorted(logs.glob("dryrun-*.log"), key=lambda p: p.stat().st_mtime)[:-KEEP_LOGS]
    for p in old:
        try:
            p.unlink()
        except OSError:
            pass


def _wait(child: proc.Child, out: str, limit: float, ticks: TickWatch | None = None) -> bool:
    """Wait for the child; True when it ran past the limit. Once the result file exists the
    script gets EXIT_GRACE_S to unwind (a stuck `finally` must not hold the launch)."""
    deadline = time.monotonic() + limit
    while True:
        if child.wait(0.05) is not None:
            return False
        if ticks is not None:
            ticks.poll()
        # Only a result written because the measurement finished bounds the exit: one written
        # at the script's own exit (atexit) must keep the script's real exit code.
        done = read_json(Path(out)) if os.path.exists(out) else None
        if done and done.get("reason") == "measured":
            if child.wait(EXIT_GRACE_S) is None:
                child.stop(signal.SIGTERM, TERM_GRACE_S)
            return False
        if time.monotonic() > deadline:
            return True


def _profile(request, data, code, timed_out, limit, tail, log_path, elapsed, *,
             echoed: bool) -> ModelProfile:
    limit_txt = f"{limit:g} s"
    where = f"(script output: {log_path})"
    complete = bool(data) and int(data.get("steps_measured") or 0) >= _asked(request, data)
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
    if measured and measured >= _asked(request, data):
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
    elif not data.get("optimizers_built") and not data.get("marker"):
        status = ProfileStatus.NO_STEP
        note = ("no torch optimizer was built and smartlaunch.profile_step() was never called; "
                f"cannot time a training step {where}")
    else:
        status = ProfileStatus.NO_STEP
        note = (f"the script ended after {data.get('steps_seen', 0)} steps, too few to measure "
                f"(warm-up included) {where}")
    for k in ("step_time_s", "step_time_p90_s", "forward_s", "backward_s"):
        if status == ProfileStatus.NO_STEP:
            kw.pop(k, None)
    return ModelProfile(status=status, note=note, **kw)


def _asked(request, data) -> int:
    return int(data.get("measure_asked") or 1)
