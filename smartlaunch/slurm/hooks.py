"""`smartlaunch-node prolog | epilog | baseline`: node hooks run by slurmd as root.

Inputs are only the admin's hooks.env (KEY=VALUE data, never sourced, root-owned) and the few
SLURM_* variables the hook scripts pass by name. Nothing of the user's is imported, run or
written to: state lives in a root-owned directory (default /run/smartlaunch).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from smartlaunch.errors import HealthError, SlurmError, TopologyError
from smartlaunch.proc import signal_process
from smartlaunch.scheduler import slurm
from smartlaunch.slurm import health
from smartlaunch.topology.api import Finding, Severity, Topology

DEFAULT_CONFIG = "/etc/smartlaunch/hooks.env"
DEFAULT_STATE_DIR = "/run/smartlaunch"
KEYS = {
    "SMARTLAUNCH_PYTHON": "interpreter the shell hooks exec (read by the hook scripts)",
    "SMARTLAUNCH_STATE_DIR": "root-owned directory for baseline, snapshots, comm cache",
    "SMARTLAUNCH_FAKE_TOPOLOGY": "TESTS ONLY: a JSON node fixture (its GPU processes included) instead of NVML",
    "SMARTLAUNCH_COMM_MAX_AGE_S": "re-measure all-reduce when the cache is older (0: never)",
    "SMARTLAUNCH_COMM_TIMEOUT_S": "time limit of that measurement",
    "SMARTLAUNCH_LEASE_DIR": "lease directory whose job leases the epilog releases",
    "SMARTLAUNCH_POLICY": "admin policy file given to bench-comm (its paths.cache_dir)",
    "SMARTLAUNCH_KILL_GRACE_S": "seconds between SIGTERM and SIGKILL for leftovers",
}


@dataclass(frozen=True)
class HookConfig:
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    fake_topology: str | None = None
    comm_max_age_s: float = 7 * 86400
    comm_timeout_s: float = 5.0
    lease_dir: str | None = None
    policy: str | None = None
    kill_grace_s: float = 3.0
    source: str = "(defaults)"

    @classmethod
    def load(cls, path: str | None) -> "HookConfig":
        p = Path(path or DEFAULT_CONFIG)
        if p.is_dir():    # before the owner check, whose advice would harm a directory
            raise HealthError(f"hooks config {p} is a directory; name the hooks.env file "
                              f"(e.g. --config {DEFAULT_CONFIG})")
        if not p.exists():
            if path and path != DEFAULT_CONFIG:
                raise HealthError(f"hooks config {p} does not exist; create it or drop --config")
            return cls()
        _check_owner(p)
        values: dict[str, str] = {}
        for n, line in enumerate(p.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or key not in KEYS:
                raise HealthError(f"{p}:{n}: {line[:60]!r} is not KEY=VALUE with a known key "
                                  f"({', '.join(KEYS)})")
            values[key] = value
        num = lambda k, d: float(values[k]) if values.get(k) else d  # noqa: E731
        return cls(state_dir=Path(values.get("SMARTLAUNCH_STATE_DIR") or DEFAULT_STATE_DIR),
                   fake_topology=values.get("SMARTLAUNCH_FAKE_TOPOLOGY") or None,
                   comm_max_age_s=num("SMARTLAUNCH_COMM_MAX_AGE_S", cls.comm_max_age_s),
                   comm_timeout_s=num("SMARTLAUNCH_COMM_TIMEOUT_S", cls.comm_timeout_s),
                   lease_dir=values.get("SMARTLAUNCH_LEASE_DIR") or None,
                   policy=values.get("SMARTLAUNCH_POLICY") or None,
                   kill_grace_s=num("SMARTLAUNCH_KILL_GRACE_S", cls.kill_grace_s),
                   source=str(p))


def _check_owner(p: Path) -> None:
    if os.geteuid() != 0:
        return
    st = p.stat()
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise HealthError(f"{p} must be owned by root and not group/world-writable "
                          f"(chown root {p}; chmod 644 {p})")


def read_node(cfg: HookConfig) -> Topology:
    """Every GPU of the node by physical index (no CUDA_VISIBLE_DEVICES, no Slurm filter)."""
    if cfg.fake_topology:
        from smartlaunch.topology.fake import load_node
        from smartlaunch.topology.health import assess
        node = load_node(cfg.fake_topology)
        return replace(node, findings=assess(node.gpus, node.links, node.findings))
    from smartlaunch.topology import discover
    return discover({})


def state_dir(cfg: HookConfig) -> Path:
    d = cfg.state_dir
    d.mkdir(mode=0o755, parents=True, exist_ok=True)
    if os.geteuid() == 0 and (d.stat().st_uid != 0 or d.stat().st_mode & 0o022):
        raise HealthError(f"state directory {d} must be root-owned and not group/world-"
                          f"writable; fix its owner or set SMARTLAUNCH_STATE_DIR in hooks.env")
    return d


def load_baseline(d: Path) -> Topology | None:
    p = d / "baseline.json"
    if not p.exists():
        return None
    return Topology.from_dict(json.loads(p.read_text()))


def job_gpus(env: Mapping[str, str]) -> list[int] | None:
    alloc = slurm.gpu_allocation(env)
    return list(alloc.gpus) if alloc else None


def check_node(cfg: HookConfig, env: Mapping[str, str]) -> tuple[Topology, list[Finding]]:
    node = read_node(cfg)
    gpus = job_gpus(env)
    findings = health.check(node, load_baseline(state_dir(cfg)), gpus)
    seen = {(f.code, f.gpu) for f in findings}
    for f in node.findings:       # the topology layer's own verdicts (indices are physical here)
        if (f.code, f.gpu) not in seen and (gpus is None or f.gpu is None or f.gpu in gpus):
            findings.append(f)
    return node, findings


def prolog(cfg: HookConfig, env: Mapping[str, str]) -> int:
    t0 = time.monotonic()
    node, findings = check_node(cfg, env)
    d = state_dir(cfg)
    _write_json(d / "topology.json", node.to_dict())
    _record(d, "prolog", env, findings)
    _maybe_measure_comm(cfg, d, node, job_gpus(env))
    _log(d, f"prolog job {env.get('SLURM_JOB_ID', '?')}: {len(findings)} finding(s) in "
            f"{time.monotonic() - t0:.2f} s")
    return _verdict("prolog", findings)


def epilog(cfg: HookConfig, env: Mapping[str, str]) -> int:
    d = state_dir(cfg)
    node = read_node(cfg)
    gpus = job_gpus(env)
    survivors = stop_leftovers(cfg, node, env, gpus)
    _release_leases(cfg, env, d)
    _, findings = check_node(cfg, env)
    findings += [Finding(Severity.CRITICAL, "leftover_unkillable",
                         f"pid {pid} of the job's user survived SIGKILL on GPU {gpu}", gpu)
                 for pid, gpu in survivors]
    _record(d, "epilog", env, findings)
    return _verdict("epilog", findings)


def baseline(cfg: HookConfig) -> int:
    node = read_node(cfg)
    if not node.gpus:
        raise TopologyError(f"no GPU to record: {node.note or 'NVML found none'}; run "
                            f"`smartlaunch-node baseline` on the GPU node, with its driver loaded")
    crit = health.critical(node.findings)
    if crit:
        raise HealthError(f"not recording a baseline with critical findings: {crit[0].message};"
                          f" repair the node first")
    d = state_dir(cfg)
    _write_json(d / "baseline.json", node.to_dict())
    print(f"baseline recorded in {d / 'baseline.json'}: {len(node.gpus)} GPU(s), "
          f"fingerprint {node.fingerprint()}")
    return 0


def stop_leftovers(cfg: HookConfig, node: Topology, env: Mapping[str, str],
                   gpus: list[int] | None) -> list[tuple[int, int]]:
    """SIGTERM, then SIGKILL, the job user's processes on the job's GPUs; never anyone else's
    (the uid is checked on the live process, not taken from NVML). Returns survivors."""
    uid = env.get("SLURM_JOB_UID", "")
    if not uid.isdigit() or int(uid) == 0:
        return []          # root's processes are never ours to kill
    targets = [(p.pid, g.nvml_index) for g in node.gpus for p in g.processes
               if gpus is None or g.nvml_index in gpus]
    mine = [(pid, gpu) for pid, gpu in dict(targets).items() if _owner(pid) == int(uid)]
    for pid, gpu in mine:
        _log(state_dir(cfg), f"epilog job {env.get('SLURM_JOB_ID', '?')}: SIGTERM leftover pid "
                             f"{pid} on GPU {gpu}")
        signal_process(pid, signal.SIGTERM)
    deadline = time.monotonic() + cfg.kill_grace_s
    while time.monotonic() < deadline and any(_owner(pid) is not None for pid, _ in mine):
        time.sleep(0.05)
    for pid, _ in mine:
        signal_process(pid, signal.SIGKILL)
    time.sleep(0.2 if mine else 0)
    return [(pid, gpu) for pid, gpu in mine if _owner(pid) is not None]


def _owner(pid: int) -> int | None:
    """Real uid of a live (non-zombie) process, None if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    if fields.get("State", "").strip().startswith("Z"):
        return None
    return int(fields["Uid"].split()[0])


def _release_leases(cfg: HookConfig, env, d: Path) -> None:
    job = env.get("SLURM_JOB_ID", "")
    if not cfg.lease_dir or not job:
        return
    from smartlaunch.launch.leases import release_job
    try:
        released = release_job(cfg.lease_dir, job,
                               say=lambda line: _log(d, f"epilog job {job}: {line}"))
        _log(d, f"epilog job {job}: released {len(released)} lease(s) in {cfg.lease_dir}")
    except Exception as exc:   # best-effort: a lease problem is not a node fault
        _log(d, f"epilog job {job}: lease release failed: {exc}")


def _maybe_measure_comm(cfg: HookConfig, d: Path, node: Topology, gpus) -> None:
    """Refresh the node's all-reduce cache when older than policy; best-effort, bounded."""
    if cfg.comm_max_age_s <= 0 or cfg.fake_topology or len(gpus or node.gpus) < 2:
        return
    stamp = d / "comm" / "measured"
    if stamp.exists() and time.time() - stamp.stat().st_mtime < cfg.comm_max_age_s:
        return
    (d / "comm").mkdir(mode=0o755, exist_ok=True)
    # The curve also lands in <state>/comm/, readable by all: users' launches read it there.
    argv = [sys.executable, "-I", "-m", "smartlaunch.node_cli", "bench-comm", "--no-pairs",
            "--max-mb", "64", "--node-cache", str(d)]
    if cfg.policy:
        argv += ["--policy", cfg.policy]
    if gpus:
        argv += ["--gpus", ",".join(map(str, gpus))]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/",
                              timeout=cfg.comm_timeout_s, stdin=subprocess.DEVNULL)
        ok = done.returncode == 0
        _log(d, f"bench-comm exit {done.returncode}" + ("" if ok else f": {done.stderr[-300:]!r}"))
        if ok:
            stamp.touch()
    except (OSError, subprocess.TimeoutExpired) as exc:
        _log(d, f"bench-comm skipped: {exc}")


def _verdict(hook: str, findings: list[Finding]) -> int:
    for f in findings:
        if f.severity != Severity.INFO:
            print(f"smartlaunch {hook}: {f.severity.value}: {f.message}", file=sys.stderr)
    crit = health.critical(findings)
    if crit:
        more = f" (+{len(crit) - 1} more)" if len(crit) > 1 else ""
        raise HealthError(f"{crit[0].message}{more}; the node should be drained: repair it, "
                          f"then `scontrol update nodename=<node> state=resume`")
    return 0


def _record(d: Path, hook: str, env, findings: list[Finding]) -> None:
    _write_json(d / f"{hook}-last.json", {
        "time": time.time(), "job_id": env.get("SLURM_JOB_ID"),
        "findings": [{"severity": f.severity.value, "code": f.code, "message": f.message,
                      "gpu": f.gpu} for f in findings]})


def _write_json(p: Path, data) -> None:
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, p)


def _log(d: Path, line: str) -> None:
    with open(d / "hooks.log", "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


# slurmd gives every prolog and epilog these; the wrapper scripts pass them by name.
JOB_IDENTITY = ("SLURM_JOB_ID", "SLURM_JOB_UID", "SLURM_JOB_USER")


def check_job_env(mode: str, env: Mapping[str, str]) -> None:
    """With SLURM_JOB_ID (else: a manual health check), all of the job's identity must be
    there, or the call did not come from slurmd (SlurmError, nothing written)."""
    if not env.get("SLURM_JOB_ID"):
        return
    missing = [k for k in JOB_IDENTITY if not env.get(k)]
    uid = env.get("SLURM_JOB_UID", "")
    if missing or not uid.isdigit():
        what = ", ".join(missing) + " not set" if missing else f"SLURM_JOB_UID={uid!r} is not a uid"
        raise SlurmError(f"{mode} for job {env['SLURM_JOB_ID']}: {what}; slurmd sets "
                         f"{', '.join(JOB_IDENTITY)} for every {mode} (slurm.conf "
                         f"{mode.capitalize()}= naming the installed {mode} script); for a manual "
                         f"health check run it without SLURM_JOB_ID")


def run(mode: str, config: str | None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    if mode != "baseline":
        check_job_env(mode, env)
    cfg = HookConfig.load(config)
    if mode == "baseline":
        return baseline(cfg)
    return prolog(cfg, env) if mode == "prolog" else epilog(cfg, env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="smartlaunch.slurm.hooks")
    p.add_argument("mode", choices=("prolog", "epilog", "baseline"))
    p.add_argument("--config", default=None)
    args = p.parse_args(argv)
    try:
        return run(args.mode, args.config)
    except (HealthError, SlurmError, TopologyError) as exc:
        print(f"smartlaunch {args.mode}: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except Exception as exc:      # one line in the Slurm log, not a traceback
        print(f"smartlaunch {args.mode}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
