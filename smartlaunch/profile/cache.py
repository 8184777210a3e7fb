"""Profile, all-reduce and trial caches: one JSON file per key under <cache_dir> (store.cache_root).
Profile key: the script's real path, its (and its sibling *.py files') bytes, arguments, working
directory, PYTHONPATH, CPU shim, dry-run settings, torch version and GPU model. Comm key: topology
fingerprint, GPU group, backend, every NCCL_* variable. Entries read back are checked by their
from_dict; a bad one is said once and measured again (store.load)."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from smartlaunch.profile.api import CommCurve, ModelProfile, ProfileStatus, TrialRecord
# read_json, write_json, private_dir: also imported from here.
from smartlaunch.store import (
    UNWRITABLE, BadRecord, cache_folder, cache_root, keep, load, number, obj, private_dir,
    read_json, required, trusted_json, within, write_json, write_public_json,
)
from smartlaunch.wire import RECORD

KEY_ENV = ("PYTHONPATH", "SMARTLAUNCH_DRYRUN_CPU_SHIM")
MAX_SIBLINGS = 200               # *.py files hashed beside the script
MAX_SIBLING_BYTES = 16 << 20
PROFILE_FORMAT = 3               # older entries re-profile


def script_file(request, cwd: str, environ) -> Path | None:
    """The file whose content identifies the entrypoint (for -m: the module's file)."""
    if not request.module:
        return Path(cwd, request.script)
    import importlib.util
    extra = [cwd] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    old = list(sys.path)
    sys.path[:0] = extra
    try:
        spec = importlib.util.find_spec(request.script)
        if spec is not None and spec.submodule_search_locations:
            spec = importlib.util.find_spec(request.script + ".__main__")
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = old
    return Path(spec.origin) if spec is not None and spec.origin else None


def torch_version() -> str:
    # metadata, not `import torch`: a cache hit must stay cheap
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def profile_key(request, policy, *, gpu_model: str, environ, cwd: str | None = None) -> str:
    cwd = cwd or os.getcwd()
    h = hashlib.sha256()
    main = script_file(request, cwd, environ)
    script = request.script
    if main is not None and main.is_file():
        if not request.module:      # train.py, ./train.py and its absolute path: one script
            script = str(main.resolve())
        h.update(main.read_bytes())
        siblings = sorted(p for p in main.parent.glob("*.py") if p != main)[:MAX_SIBLINGS]
        budget = MAX_SIBLING_BYTES
        for p in siblings:
            try:        # a directory named x.py, an unreadable file: not the script's code
                with open(p, "rb") as f:
                    data = f.read(budget)
            except OSError:
                continue
            budget -= len(data)
            h.update(p.name.encode() + b"\0" + hashlib.sha256(data).digest())
    else:
        h.update(b"unresolved:" + request.script.encode())
    key = {
        "script": script, "module": request.module, "args": list(request.script_args),
        "cwd": cwd, "env": {k: environ.get(k, "") for k in KEY_ENV},
        "warmup": policy.dryrun.warmup_steps, "measure": policy.dryrun.measure_steps,
        "precision": policy.dryrun.precision,
        "torch": torch_version(), "gpu": gpu_model, "format": PROFILE_FORMAT,
    }
    h.update(json.dumps(key, sort_keys=True).encode())
    return h.hexdigest()[:32]


def profile_entrypoint(request, policy, *, gpu: str | None, gpu_model: str, environ,
                       announce=None, echo=None, progress=None,
                       real_gpu: bool = False, session=None, gate: bool = False,
                       shared: Callable[[], str | None] | None = None) -> ModelProfile:
    """The cached profile of this entrypoint, or a fresh dry run stored for next time. announce() is
    called just before a dry run (not on a hit); echo, progress, session and gate: as
    runner.run_dry_run. shared(): after a dry run, the processes that came onto its GPU
    (topology.sharing); a dry run that shared its GPU is used this once, said in its note, and
    not kept."""
    from smartlaunch.profile.runner import run_dry_run
    if request.no_python:
        return run_dry_run(request, policy, gpu=gpu, environ=environ, echo=echo)
    root = cache_root(policy, environ)
    path = profile_path(request, policy, gpu_model, environ)
    with _locked(path, policy.dryrun.time_limit_s + 60):
        if not request.reprofile:
            hit = load(path, ModelProfile.from_dict, "profile")
            if hit is not None:
                return dataclasses.replace(hit, cached=True)
        if announce is not None:
            announce()
        profile = run_dry_run(request, policy, gpu=gpu, environ=environ, echo=echo,
                              progress=progress, real_gpu=real_gpu, session=session, gate=gate)
        # UNMEASURABLE too: it is the script's, not the moment's. Not ENDED: a script that
        # found nothing to do (its data not there yet, its training already done) would keep
        # every later launch from being measured.
        kept = (ProfileStatus.OK, ProfileStatus.INCOMPLETE, ProfileStatus.NO_STEP,
                ProfileStatus.UNMEASURABLE)
        others = shared() if shared is not None else None
        if others:
            note = (f"another process came onto the GPU during the dry run ({others}): its "
                    f"figures are used this once, not cached")
            return dataclasses.replace(profile, note=f"{profile.note}; {note}" if profile.note
                                       else note)
        if profile.status in kept and _readable(ModelProfile.from_dict, profile.to_dict()):
            keep(root, path, profile.to_dict())
        return profile


@contextlib.contextmanager
def _locked(path: Path, timeout: float):
    """Hold <path>.lock (one dry run of a job at a time); where it cannot be made (cache read-only
    or full, or its folder absent: filelock would make folders, unchecked) go on without it."""
    from filelock import FileLock
    lock = FileLock(str(path) + ".lock", timeout=timeout) if path.parent.is_dir() else None
    try:
        if lock is not None:
            lock.acquire()
    except OSError as exc:    # filelock's Timeout is an OSError without an errno: raised
        if exc.errno not in UNWRITABLE and not isinstance(exc, FileNotFoundError):
            raise
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _readable(parse, data) -> bool:
    """Would the next launch accept `data` (parsed as it will be read, from JSON)? A record its
    reader would refuse is not kept."""
    try:
        parse(json.loads(json.dumps(data)))
        return True
    except (BadRecord, ValueError):
        return False


def entry_path(policy, environ, folder: str, key: str, *, create: bool = True) -> Path:
    """<cache_dir>/<folder>/<key>.json; the folder made (cache_folder) only when `create`."""
    root = cache_root(policy, environ)
    return (cache_folder(root, folder) if create else root / folder) / f"{key}.json"


def digest(key) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def profile_path(request, policy, gpu_model: str, environ) -> Path:
    return entry_path(policy, environ, "profiles",
                      profile_key(request, policy, gpu_model=gpu_model, environ=environ))


def cached_profile(request, policy, *, gpu_model: str, environ) -> ModelProfile | None:
    """The stored profile of this entrypoint, without running anything (None: none yet, or bad)."""
    return load(profile_path(request, policy, gpu_model, environ), ModelProfile.from_dict,
                "profile")


def nccl_env(environ) -> dict[str, str]:
    """Every NCCL_* variable: what shapes a measurement of the link besides the topology."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}


def node_key(topology, environ, **parts) -> str:
    """The key of a measurement of this node's links: topology fingerprint + every NCCL_* variable +
    what the caller adds."""
    return digest({"topology": topology.fingerprint() if topology is not None else "none",
                   "nccl": nccl_env(environ), **parts})


def comm_key(topology, gpus, backend: str, environ) -> str:
    return node_key(topology, environ, gpus=list(gpus), backend=backend)


def comm_path(policy, key: str, environ) -> Path:
    return entry_path(policy, environ, "comm", key)


def load_comm(policy, key: str, environ, *, need_bytes: int) -> CommCurve | None:
    return _fresh_curve(load(comm_path(policy, key, environ), _stored_curve, "all-reduce curve"),
                        policy, need_bytes)


def _stored_curve(d) -> tuple[float, CommCurve]:
    """{"measured_at", "curve"} as store_comm wrote it, checked."""
    d = obj(d, RECORD)
    when = number(required(d, "measured_at"), "measured_at", 0.0)
    return when, within("curve", CommCurve.from_dict, required(d, "curve"))


def _fresh_curve(stored, policy, need_bytes: int, world_size: int | None = None
                 ) -> CommCurve | None:
    """A stored (measured_at, curve) young enough, reaching need_bytes and (when given) with
    world_size ranks; None otherwise."""
    if stored is None:
        return None
    when, curve = stored
    if time.time() - when > policy.paths.comm_cache_max_age_s \
            or curve.points[-1][0] < need_bytes \
            or (world_size is not None and curve.world_size != world_size):
        return None
    return dataclasses.replace(curve, cached=True)


def store_comm(policy, key: str, curve: CommCurve, environ) -> bool:
    """Keep `curve` for the next launch (False: the cache cannot take it; said once)."""
    data = {"measured_at": time.time(), "curve": curve.to_dict()}
    return _readable(_stored_curve, data) and \
        keep(cache_root(policy, environ), comm_path(policy, key, environ), data)


# --- the node cache: what the Slurm prolog measured as root, read by every user's launch ----

def node_comm_key(topology, gpus, backend: str, environ) -> str | None:
    """The key of a curve in the node cache: the group's GPUs by UUID (a job's CUDA ordinals are not
    the prolog's), their links, driver and NCCL versions, backend and every NCCL_* variable. None
    when a GPU of the group is unknown."""
    try:
        group = [topology.gpu(g) for g in gpus]
        links = [topology.link(a, b).link_class for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    except KeyError:
        return None
    return digest({"uuids": [g.uuid for g in group], "links": links, "backend": backend,
                   "driver": topology.driver_version, "nccl": topology.nccl_version,
                   "env": nccl_env(environ)})


def load_node_comm(policy, topology, gpus, backend: str, environ, *,
                   need_bytes: int) -> CommCurve | None:
    """The curve of this group from <paths.node_cache>/comm/ if only root or this user could have
    written it (store.trusted_json), as fresh as the own cache requires, renumbered to this job's
    GPUs. Never writes."""
    key = node_comm_key(topology, tuple(gpus), backend, environ)
    if key is None:
        return None
    top = Path(os.path.expanduser(policy.paths.node_cache))
    path = top / "comm" / f"{key}.json"
    stored = load(path, _stored_curve, "all-reduce curve",
                  read=lambda p: trusted_json(p, top))
    curve = _fresh_curve(stored, policy, need_bytes, len(gpus))
    return None if curve is None else dataclasses.replace(curve, gpus=tuple(gpus))


def store_node_comm(directory: str, topology, curve: CommCurve, environ) -> Path | None:
    """Write `curve` to <directory>/comm/ readable by every user; the path, or None when its group
    has no key."""
    key = node_comm_key(topology, tuple(curve.gpus), curve.backend, environ)
    if key is None:
        return None
    folder = Path(directory) / "comm"
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    write_public_json(path, {"measured_at": time.time(), "curve": curve.to_dict()})
    return path


def cached_comm(policy, topology, gpus, backend: str, environ, *,
                need_bytes: int) -> CommCurve | None:
    """The own cache's curve for this group, else the node cache's (load_node_comm)."""
    return (load_comm(policy, comm_key(topology, gpus, backend, environ), environ,
                      need_bytes=need_bytes)
            or load_node_comm(policy, topology, gpus, backend, environ, need_bytes=need_bytes))


def cached_trials(runner, request, policy, *, topology, environ, one_gpu: float | None = None):
    """Wrap a trial runner so each (strategy, GPUs)'s samples/s is kept under the profile key and
    the group's comm key; `--reprofile` measures again. one_gpu: the dry run's samples/s
    (api.TrialRecord's range check); run(strategy, gpus, attempt): attempt > 1 is another draw of
    the same trial, kept beside the first."""
    def run(strategy, gpus, attempt: int = 1):
        hit = cached_trial(request, policy, topology=topology, environ=environ,
                           strategy=strategy, gpus=gpus, one_gpu=one_gpu, attempt=attempt)
        if hit is not None:
            return hit
        rate = runner(strategy, gpus)
        data = {"samples_per_s": rate, "measured_at": time.time()}
        if rate is not None and _readable(
                lambda d: TrialRecord.from_dict(d, nproc=len(gpus), one_gpu=one_gpu), data):
            keep(cache_root(policy, environ),
                 trial_path(request, policy, topology, environ, strategy, gpus, attempt), data)
        return rate
    return run


def cached_trial(request, policy, *, topology, environ, strategy, gpus,
                 one_gpu: float | None = None, attempt: int = 1) -> float | None:
    """The kept samples/s of this trial (its attempt-th draw), or None (not measured yet,
    --reprofile, or a bad record: said once)."""
    if request.reprofile:
        return None
    hit = load(trial_path(request, policy, topology, environ, strategy, gpus, attempt),
               lambda d: TrialRecord.from_dict(d, nproc=len(gpus), one_gpu=one_gpu), "trial")
    return hit.samples_per_s if hit is not None else None


def trial_path(request, policy, topology, environ, strategy, gpus, attempt: int = 1) -> Path:
    gpu_model = topology.gpus[0].name if topology.gpus else "cpu"
    base = profile_key(request, policy, gpu_model=gpu_model, environ=environ)
    parts = [base, strategy.value, comm_key(topology, gpus, "trial", environ),
             policy.decision.trial_steps, policy.decision.trial_seconds]
    return entry_path(policy, environ, "trials", digest(parts + ([attempt] if attempt > 1 else [])))
