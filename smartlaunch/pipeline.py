"""The pipeline the CLI runs: policy -> topology -> profile -> decide -> (explain | launch)."""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

from smartlaunch.allocation import IDLE_RULE
from smartlaunch.decide.explain import decision_line, render_text
from smartlaunch.decide.plan import Reason
from smartlaunch.driver import Clock, Driver, NullStream
from smartlaunch.errors import PolicyError
from smartlaunch.profile.session import Session
from smartlaunch.request import Request
from smartlaunch.statusline import StatusLine
from smartlaunch.store import (MIN_FREE_BYTES, dir_problem, free_bytes, log_root, missing_home,
                               unsafe_dir_message)
from smartlaunch.strategies import REGISTRY

log = logging.getLogger(__name__)


def run(request: Request, given: set[str], environ: Mapping[str, str] = os.environ) -> int:
    status = StatusLine()
    try:
        plan, topology, policy = make_plan(request, given, environ, status)
    finally:
        status.clear()           # an error line or the plan starts at column 0
    if request.explain == "json":
        print(plan.to_json())
        return 0
    if request.explain:
        print(render_text(plan, REGISTRY))
        return 0
    from smartlaunch.launch import execute
    from smartlaunch.launch.api import context
    from smartlaunch.launch.decision_log import LaunchRecord, exit_code_of

    # The decision log's line for this launch: written once, however the launch ends.
    record = LaunchRecord.open(plan, request, policy, REGISTRY, environ)

    def announce(final_plan) -> None:      # once the GPUs are held, just before the job
        record.began(final_plan)
        if not (request.quiet or policy.launch.quiet):
            status.line(decision_line(final_plan, REGISTRY, policy.decision.min_efficiency))
        for r in final_plan.reasons:        # an idle Slurm allocation: said even with --quiet
            if r.rule == IDLE_RULE:
                status.line(r.text)
    from smartlaunch.scheduler.slurm_fit import release_unused
    released, environ = release_unused(plan, policy, environ)  # slurm.release_unused
    if released:
        status.line(released)
    code = 1
    try:
        ctx = context(request, policy, topology, environ=environ, status=status,
                      announce=announce, log_dir=launch_log_dir(policy, environ, status.line))
        code = execute(plan, ctx, REGISTRY)
        return code
    except BaseException as exc:
        code = exit_code_of(exc)
        raise
    finally:
        status.close()
        record.close(code)


def make_plan(request: Request, given: set[str], environ: Mapping[str, str],
              status: StatusLine | None = None, *, cores: int | None = None):
    """(plan, topology, policy) for this command line. cores: CPUs to count for starting
    measurements early (default: this process's)."""
    from smartlaunch.policy.enforce import apply_request
    from smartlaunch.policy.load import load_policy
    from smartlaunch.scheduler import detect
    from smartlaunch.topology import discover

    clock = Clock()
    status = status if status is not None else StatusLine(tty=False, stream=NullStream())
    policy = apply_request(load_policy(request.policy_path, environ=environ), request,
                           environ)
    notes: list[Reason] = []        # the Slurm allocation's, for the plan's reasons
    slurm = detect(environ)
    if slurm is not None and request.torchrun_args is not None:
        notes += [Reason(n, "slurm allocation")
                  for n in slurm.fill_torchrun_args(request.torchrun_args, given)]
        request = dataclasses.replace(
            request, nnodes=str(request.torchrun_args.nnodes),
            nnodes_from="" if "nnodes" in given else "Slurm")
    _check_paths(request, policy, environ)
    clock.lap("policy")
    log.debug("policy from %s", ", ".join(policy.layers))
    topology = discover(environ)
    clock.lap("topology")
    log.debug("topology (%s): %d GPU(s) %s", topology.source, len(topology.gpus),
              topology.hardware())
    with Session() as session:
        driver = Driver(policy, topology, environ, session, status, REGISTRY, clock, cores)

        def decide_here(req: Request, more: tuple[Reason, ...] = (), nodes: int = 0,
                        between=None) -> tuple:
            return driver.plan(req, (*notes, *more), slurm, nodes, between), topology, policy
        if request.multi_node:      # one node decides for all (pipeline_nodes.py)
            from smartlaunch.pipeline_nodes import one_decision
            return one_decision(request, topology, policy, environ, decide_here, status)
        return decide_here(request)


def _check_paths(request: Request, policy, environ) -> None:
    """Directories this launch will write, checked before anything is written (a cache this
    user cannot write, or under a HOME that does not exist, is no error: the decision measures
    without caching)."""
    from smartlaunch.profile.cache import cache_root
    if request.explain:
        return
    cache = str(cache_root(policy, environ))
    if request.strategy == "auto" and not missing_home(cache, environ):
        _check_dir_usable(cache, "paths.cache_dir", policy, write=False)
    launch_log_dir(policy, environ)


def launch_log_dir(policy, environ, say=None) -> str:
    """Where this launch makes its run directory: launch.log_dir, checked; where the built-in
    one cannot take it, a private temp directory, said in one line (say None: only checked,
    nothing made)."""
    root = str(log_root(policy, environ))
    try:
        _check_dir_usable(root, "launch.log_dir", policy)
        return root
    except PolicyError as exc:
        if policy.launch.log_dir:
            raise
        why = str(exc).split(": ", 1)[-1]
    import tempfile
    _check_dir_usable(tempfile.gettempdir(), "launch.log_dir", policy)
    if say is None:
        return tempfile.gettempdir()
    spare = tempfile.mkdtemp(prefix="smartlaunch-logs-")
    say(f"the built-in launch.log_dir {root} cannot take this launch's run files ({why}); "
        f"they go to {spare}")
    return spare


def _check_dir_usable(path: str, key: str, policy, write: bool = True) -> None:
    """PolicyError naming the setting unless the path (or its nearest existing parent) is a
    safe directory; where `write`, also writable with room on its file system."""
    from smartlaunch.policy.load import ENV_VARS
    full = os.path.abspath(os.path.expanduser(path))
    probe = full
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    where = f"{key}={path} ({policy.source_of(key)})"
    home = missing_home(full, os.environ)     # expanduser read os.environ's HOME too
    var = next((v for v, k in ENV_VARS.items() if k == key), key)
    if home:
        raise PolicyError(f"{where}: HOME={home} does not exist and smartlaunch does not create "
                          f"it; set HOME to your home directory, or {var} ({key}) to a directory "
                          f"you can write")
    if not os.path.isdir(probe):
        raise PolicyError(f"{where}: {probe} is not a directory; set {key} to a directory")
    if probe == full:             # made by someone: whose, and who else may write in it
        why = dir_problem(os.lstat(full))
        if why:
            raise PolicyError(unsafe_dir_message(where, full, why, key))
    if write and not os.access(probe, os.W_OK | os.X_OK):
        raise PolicyError(f"{where}: {probe} is not writable by you; set {key} to a directory "
                          f"you can write")
    room = free_bytes(probe) if write else None
    if room is not None and room < MIN_FREE_BYTES:
        raise PolicyError(f"{where}: the file system of {probe} is full ({room >> 10} KiB "
                          f"free; the ranks' step counters there would fail); free space on it, "
                          f"or set {var} ({key}) to a directory on another file system")
