"""Slurm as the launcher sees it (the `scheduler.api.Scheduler` implementation): `detect`
reads the job's environment into a `SlurmContext` (one smartlaunch per node; the rendezvous at
the first host, on a port derived from the job and step ids); `apply_to_torchrun_args` fills
the torchrun options the user did not give."""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, field
from typing import Mapping

from smartlaunch.errors import SlurmError
from smartlaunch.allocation import DeviceProbe, _in_step, _int, _visible
from smartlaunch.allocation import slurm_gpu_allocation as gpu_allocation  # noqa: F401
from smartlaunch.scheduler import slurm_parse as parse
from smartlaunch.scheduler.slurm_run import Runner, available, run_slurm, unparsable

NAME = "slurm"
RDZV_PORT_BASE = 20000      # below Linux's ephemeral range (32768+), above well-known ports


@dataclass(frozen=True)
class SlurmContext:
    job_id: str
    step_id: str | None            # None in a batch script / salloc shell (no srun step)
    nnodes: int                    # nodes taking part in this launch
    node_rank: int
    hosts: tuple[str, ...]         # nodes of this launch, in Slurm's order
    rdzv_endpoint: str             # "host:port"
    rdzv_id: str
    gpus: tuple[int, ...] = ()     # physical (gres/NVML outside cgroups) GPU indices on this node
    visible: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES entries as Slurm set them
    constrained: bool = False      # cgroup device constraint: CUDA ordinals count 0..n-1
    cpus: tuple[int, ...] = ()     # this process's cpuset (sched_getaffinity)
    ntasks_per_node: int | None = None   # the job's --ntasks-per-node, when given
    local_tasks: int = 1           # processes of this step on this node (smartlaunch agents)
    signal: str | None = None      # --signal request as written ("USR1@90"), when visible
    hostname: str = ""
    job_nnodes: int = 1            # nodes in the whole allocation
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)

    def fill_torchrun_args(self, args: argparse.Namespace, given: set[str]) -> list[str]:
        return apply_to_torchrun_args(self, args, given)


def detect(environ: Mapping[str, str] | None = None, *, runner: Runner | None = None,
           device_probe: DeviceProbe | None = None) -> SlurmContext | None:
    """The Slurm context of this process, None outside Slurm; SlurmError if inconsistent."""
    env = dict(os.environ if environ is None else environ)
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    if not job_id.isdigit():
        raise SlurmError(f"SLURM_JOB_ID={job_id!r} is not a job number; unset it if this is "
                         f"not a Slurm job")
    notes: list[str] = []
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    in_step = _in_step(env)
    job_nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job_nodelist:
        raise SlurmError(f"SLURM_JOB_ID={job_id} is set but SLURM_JOB_NODELIST is not: run "
                         f"inside an allocation (sbatch/srun/salloc) or unset SLURM_JOB_ID")
    job_nnodes = _int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES")
    hostname = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]

    if in_step:
        nodelist = env.get("SLURM_STEP_NODELIST") or job_nodelist
        hosts = expand_nodelist(nodelist, runner=runner)
        want = _int(env, "SLURM_STEP_NUM_NODES")
        if want is None and nodelist is job_nodelist:
            want = job_nnodes
        _check_count(hosts, want, nodelist, "SLURM_STEP_NUM_NODES")
        node_rank = _node_rank(env, hosts)
        local_tasks = _local_tasks(env, node_rank)
    else:
        hosts_all = expand_nodelist(job_nodelist, runner=runner)
        _check_count(hosts_all, job_nnodes, job_nodelist, "SLURM_NNODES")
        # The batch script runs on the first node only; other nodes need an srun step.
        hosts, node_rank, local_tasks = (hosts_all[0],), 0, 1
        if len(hosts_all) > 1:
            notes.append(f"batch script on a {len(hosts_all)}-node allocation: only "
                         f"{hosts_all[0]} runs; use `srun --ntasks-per-node=1 smartlaunch ...` "
                         f"to use all nodes")
    if local_tasks > 1:
        raise SlurmError(f"srun started {local_tasks} smartlaunch processes on this node; "
                         f"start one per node: srun --ntasks-per-node=1 smartlaunch ...")

    step_n = int(step) if in_step and step.isdigit() else 0
    port = RDZV_PORT_BASE + (int(job_id) % 1000) * 10 + step_n % 10
    rdzv_host = hosts[0] if len(hosts) > 1 else "localhost"
    alloc = gpu_allocation(env, device_probe=device_probe)
    gpus, gpu_var = (alloc.gpus, alloc.source) if alloc else ((), "")
    constrained = bool(alloc and alloc.renumbered)
    visible = _visible(env)
    if gpus and constrained:
        notes.append(f"{gpu_var}={','.join(map(str, gpus))} shown to CUDA as "
                     f"{','.join(visible)} (cgroup device constraint renumbers)")
    try:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = ()
    return SlurmContext(
        job_id=job_id, step_id=step if in_step else None, nnodes=len(hosts),
        node_rank=node_rank, hosts=hosts, rdzv_endpoint=f"{rdzv_host}:{port}",
        rdzv_id=job_id if not in_step else f"{job_id}.{step}",
        gpus=gpus, visible=visible, constrained=constrained, cpus=cpus,
        ntasks_per_node=_int(env, "SLURM_NTASKS_PER_NODE"), local_tasks=local_tasks,
        signal=env.get("SBATCH_SIGNAL") or env.get("SLURM_SIGNAL") or None,
        hostname=hostname, job_nnodes=job_nnodes or len(hosts), notes=tuple(notes))


def expand_nodelist(nodelist: str, *, runner: Runner | None = None) -> tuple[str, ...]:
    """Hosts of a Slurm hostlist: `scontrol show hostnames` when it works, else expanded here."""
    if runner is None and not available("scontrol"):
        return parse.expand_hostlist(nodelist)
    argv = ["scontrol", "show", "hostnames", nodelist]
    try:
        done = run_slurm(argv, timeout_s=10, runner=runner)
    except SlurmError as exc:
        try:
            return parse.expand_hostlist(nodelist)
        except SlurmError:
            raise exc from None
    hosts = parse.parse_hostnames(done.stdout)
    if not hosts:
        raise unparsable(argv, done.stdout, "host names")
    return hosts


def physical_gpus(ctx: SlurmContext, environ: Mapping[str, str]) -> list[int]:
    """Physical GPU index of each CUDA ordinal the process sees now (a UUID entry ends the
    list: the topology layer resolves those)."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(ctx.gpus)
    out: list[int] = []
    for e in (s.strip() for s in raw.split(",") if s.strip()):
        if not e.isdigit():
            break
        i = int(e)
        if ctx.constrained:
            if i >= len(ctx.gpus):
                raise SlurmError(f"CUDA_VISIBLE_DEVICES={raw}: {i} is past the {len(ctx.gpus)} "
                                 f"GPU(s) of this job; use indices 0..{len(ctx.gpus) - 1}")
            out.append(ctx.gpus[i])
        else:
            if ctx.gpus and i not in ctx.gpus:
                raise SlurmError(f"CUDA_VISIBLE_DEVICES={raw}: GPU {i} is not allocated to this "
                                 f"job (allocated: {','.join(map(str, ctx.gpus))}); unset it "
                                 f"or pick among the allocated GPUs")
            out.append(i)
    return out


def apply_to_torchrun_args(ctx: SlurmContext, args: argparse.Namespace,
                           given: set[str]) -> list[str]:
    """Set nnodes/node_rank/rdzv_* on torchrun's namespace where the user gave none (`given`:
    dests or flags). Returns notes for --explain."""
    given = {g.lstrip("-").replace("-", "_") for g in given}
    if "standalone" in given or getattr(args, "standalone", False):
        return [f"Slurm job {ctx.job_id}: --standalone given, Slurm rendezvous not used"]
    values = {"nnodes": str(ctx.nnodes), "node_rank": ctx.node_rank, "rdzv_backend": "c10d",
              "rdzv_endpoint": ctx.rdzv_endpoint, "rdzv_id": ctx.rdzv_id}
    notes = []
    for dest, value in values.items():
        if dest in given:
            notes.append(f"{dest}={getattr(args, dest, None)} from the command line (Slurm "
                         f"would give {value})")
            continue
        setattr(args, dest, value)
    filled = [f"{d}={v}" for d, v in values.items() if d not in given]
    if filled:
        step = f" step {ctx.step_id}" if ctx.step_id else " batch script"
        notes.insert(0, f"Slurm job {ctx.job_id}{step} on {ctx.hostname} (node {ctx.node_rank} "
                        f"of {ctx.nnodes}: {','.join(ctx.hosts)}): {', '.join(filled)}")
    if ctx.gpus:
        notes.append(f"Slurm allocated GPU(s) {','.join(map(str, ctx.gpus))} on this node"
                     + (" (renumbered 0..n-1 by device constraint)" if ctx.constrained else ""))
    notes.extend(ctx.notes)
    return notes


def _node_rank(env, hosts) -> int:
    nodeid = _int(env, "SLURM_NODEID")
    name = env.get("SLURMD_NODENAME")
    if nodeid is None:
        if len(hosts) == 1:
            return 0
        if name in hosts:
            return hosts.index(name)
        raise SlurmError(f"SLURM_NODEID is missing in a {len(hosts)}-node step; start "
                         f"smartlaunch with `srun --ntasks-per-node=1` or pass --node-rank")
    if nodeid >= len(hosts):
        raise SlurmError(f"SLURM_NODEID={nodeid} but the step has {len(hosts)} node(s) "
                         f"({','.join(hosts)}); start from a clean srun environment or pass "
                         f"--node-rank")
    if name and name in hosts and hosts.index(name) != nodeid:
        raise SlurmError(f"SLURM_NODEID={nodeid} but {name} is node {hosts.index(name)} of "
                         f"{','.join(hosts)}; start from a clean srun environment")
    return nodeid


def _local_tasks(env, node_rank: int) -> int:
    raw = env.get("SLURM_STEP_TASKS_PER_NODE")
    if not raw:
        return 1
    per = parse.parse_tasks_per_node(raw)
    return per[node_rank] if node_rank < len(per) else 1


def _check_count(hosts, want, nodelist, var) -> None:
    if want is not None and want != len(hosts):
        raise SlurmError(f"{var}={want} but the nodelist {nodelist!r} has {len(hosts)} host(s); "
                         f"the Slurm environment is inconsistent — start from a clean "
                         f"srun/sbatch environment")


def main(argv: list[str] | None = None) -> int:
    """`python -m smartlaunch.scheduler`: the detected context as JSON (for tests/debugging)."""
    try:
        ctx = detect()
    except SlurmError as exc:
        print(f"smartlaunch: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    out = ctx.to_dict() if ctx else None
    if ctx:
        out["physical_gpus"] = physical_gpus(ctx, os.environ)
    print(json.dumps(out, indent=2))
    return 0

