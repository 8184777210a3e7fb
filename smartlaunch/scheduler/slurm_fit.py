"""`release_unused`: with `slurm.release_unused`, shrink the job to the nodes the plan uses
(`scontrol update JobId=<job> NumNodes=<used>`, from the batch script only; GPUs of a running
job cannot be released). Every refusal is one line and the launch goes on unshrunk."""
from __future__ import annotations

import functools
import re
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path

from smartlaunch.allocation import nodes_used, plural as _plural
from smartlaunch.errors import SlurmError
from smartlaunch.scheduler.slurm import detect
from smartlaunch.scheduler.slurm_parse import parse_key_values
from smartlaunch.scheduler.slurm_run import Runner, _one_line, run_slurm, subprocess_runner

_ENV_NAME = re.compile(r"SLURM_[A-Z0-9_]+\Z")


def release_unused(plan, policy, environ: Mapping[str, str], *,
                   runner: Runner | None = None) -> tuple[str, Mapping[str, str]]:
    """(the line to say, the environment to launch with: with the Slurm variables scontrol
    resets, where the job shrank). Never raises for Slurm's refusals."""
    if not policy.slurm.release_unused:
        return "", environ
    try:
        ctx = detect(environ, runner=runner)
    except SlurmError:
        return "", environ      # already said when the plan was made
    if ctx is None:
        return "", environ
    key = f"slurm.release_unused ({policy.source_of('slurm.release_unused')})"
    job = ctx.job_id
    used = nodes_used(ctx, plan)
    idle = ctx.job_nnodes - used
    gpus_kept = len(ctx.gpus) - len(plan.gpus) if ctx.gpus else 0
    kept = (f"the {_plural(gpus_kept, 'idle GPU')} on this node "
            f"{'stays' if gpus_kept == 1 else 'stay'} allocated (Slurm changes a running job's "
            f"GPUs only by releasing whole nodes)") if gpus_kept > 0 else ""
    if idle <= 0:
        return (f"{key}: Slurm job {job} keeps all its nodes: {kept}; ask for the GPUs the plan "
                f"uses next time" if kept else ""), environ
    unshrunk = f"the launch goes on with the job's {ctx.job_nnodes} nodes"
    if ctx.step_id is not None:
        return (f"{key}: Slurm job {job} not shrunk: this launch runs in srun step "
                f"{job}.{ctx.step_id}, not in the job's batch script (a step's nodes stay "
                f"allocated while it runs, and the job's other nodes may run other steps); "
                f"start smartlaunch from the batch script to release idle nodes; {unshrunk}"
                ), environ
    held = _nodes_held(job, runner)
    if held is not None and held <= used:
        return "", environ      # an earlier launch of this batch script shrank it already
    argv = ["scontrol", "update", f"JobId={job}", f"NumNodes={used}"]
    shown = " ".join(argv)
    try:
        # scontrol writes slurm_job_<id>_resize.sh in its working directory: a private one.
        with tempfile.TemporaryDirectory(prefix="smartlaunch-resize-") as d:
            done = run_slurm(argv, timeout_s=30, check=False,
                             runner=runner or functools.partial(subprocess_runner, cwd=d))
            script = Path(d) / f"slurm_job_{job}_resize.sh"
            reset = resize_env(script.read_text()) if script.exists() else {}
    except SlurmError as exc:               # scontrol missing, or no answer
        return f"{key}: Slurm job {job} not shrunk: {exc}; {unshrunk}", environ
    except OSError as exc:
        return (f"{key}: Slurm job {job} not shrunk: no private directory for scontrol "
                f"({exc.strerror}); set TMPDIR to a writable directory; {unshrunk}"), environ
    if done.returncode != 0:
        said = _one_line(done.stderr or done.stdout) or "no message"
        return (f"{key}: Slurm job {job} not shrunk: `{shown}` failed with exit code "
                f"{done.returncode}: {said!r}; {unshrunk} (the cluster does not let this job "
                f"shrink: ask the admins, or set slurm.release_unused: false)"), environ
    out = dict(environ)
    for name, value in reset.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    line = (f"{key}: Slurm job {job} shrunk from {ctx.job_nnodes} to {_plural(used, 'node')} "
            f"(`{shown}`): {_plural(idle, 'idle node')} released"
            + (f"; {kept}" if kept else ""))
    return line, out


def _nodes_held(job: str, runner: Runner | None) -> int | None:
    """The job's node count now (not the environment's), or None when scontrol cannot say."""
    try:
        done = run_slurm(["scontrol", "-o", "show", "job", job], timeout_s=15, check=False,
                         runner=runner)
    except SlurmError:
        return None
    n = parse_key_values(done.stdout).get("NumNodes", "") if done.returncode == 0 else ""
    return int(n) if n.isdigit() else None


def resize_env(text: str) -> dict[str, str | None]:
    """The SLURM_* variables of scontrol's slurm_job_<id>_resize.sh: value, or None to unset."""
    out: dict[str, str | None] = {}
    for raw in text.splitlines():
        try:
            words = shlex.split(raw, comments=True)
        except ValueError:
            continue
        if len(words) == 2 and words[0] == "unset" and _ENV_NAME.match(words[1]):
            out[words[1]] = None
        elif len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            if _ENV_NAME.match(name):
                out[name] = value
    return out
