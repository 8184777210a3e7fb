"""`smartlaunch-node topo`: the machine as smartlaunch sees it, laid out like `nvidia-smi topo -m`;
`--json` prints what SMARTLAUNCH_FAKE_TOPOLOGY loads back."""
from __future__ import annotations

import argparse
import os
import sys

from smartlaunch.errors import ExitCode

VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
LEGEND = """\
Legend:
  X    = self
  SYS  = through PCIe and the SMP interconnect between NUMA nodes (e.g. QPI/UPI)
  NODE = through PCIe and the interconnect between PCIe host bridges within a NUMA node
  PHB  = through PCIe and a PCIe host bridge (typically the CPU)
  PXB  = through multiple PCIe bridges (without the host bridge)
  PIX  = through at most a single PCIe bridge
  NV#  = through a bonded set of # NVLinks
  P2P: OK = supported, NS = not supported, ?? = NVML could not tell"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "topo", help="show GPU topology, P2P, NUMA affinity and health",
        description="Show the GPUs this job may use: link matrix, P2P, CPU/NUMA affinity, "
                    "free memory, foreign processes and health findings.")
    p.add_argument("--json", action="store_true",
                   help="print the topology as JSON (loadable with SMARTLAUNCH_FAKE_TOPOLOGY)")
    p.add_argument("--all", action="store_true",
                   help="the whole node: ignore CUDA_VISIBLE_DEVICES and Slurm's GPU allocation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from smartlaunch.topology import discover
    from smartlaunch.topology.fake import to_json
    env = dict(os.environ)
    if args.all:
        for var in VISIBILITY_VARS:
            env.pop(var, None)
    topo = discover(env)
    if topo.source == "none":
        print(f"smartlaunch-node: {topo.note}; the launcher will run on the CPU", file=sys.stderr)
        return int(ExitCode.NO_GPU)
    sys.stdout.write((to_json(topo) if args.json else render(topo)) + "\n")
    sys.stdout.flush()          # `topo | head`: BrokenPipeError here, said by node_cli
    return int(ExitCode.OK)


def render(topo) -> str:
    """The text report: header, link matrix with affinities, P2P matrices, GPUs, findings."""
    from smartlaunch.topology.cpus import format_cpulist
    versions = "  ".join(f"{k} {v or '??'}" for k, v in (
        ("driver", topo.driver_version), ("CUDA", topo.cuda_driver_version), ("NCCL", topo.nccl_version)))
    lines = [f"{topo.hostname or 'this node'}: {len(topo.gpus)} GPU(s)  {versions}  "
             f"[{topo.source}]"]
    if not topo.gpus:
        lines.append(topo.note or "no GPU visible to this job")
        return "\n".join(lines)
    names = [f"GPU{g.index}" for g in topo.gpus]
    rows = []
    for g in topo.gpus:
        cells = ["X" if h.index == g.index else topo.link(g.index, h.index).link_class for h in topo.gpus]
        rows.append(cells + [format_cpulist(g.cpus) or "N/A",
                             "N/A" if g.numa_node < 0 else str(g.numa_node)])
    lines += ["", *_matrix(names, names + ["CPU Affinity", "NUMA Affinity"], rows)]
    lines += ["", "P2P read/write", *_matrix(names, names, _p2p_rows(topo, "p2p"))]
    if any(link.family == "NV" for link in topo.links):
        lines += ["", "P2P NVLink", *_matrix(names, names, _p2p_rows(topo, "p2p_nvlink"))]
    lines.append("")
    for g in topo.gpus:
        lines += _gpu_lines(topo, g)
    node_wide = [f for f in topo.findings if f.gpu is None]
    if node_wide:
        lines += ["", "Node:"] + [f"  {f.severity.value}: {f.message}" for f in node_wide]
    lines += ["", LEGEND, f"fingerprint {topo.fingerprint()}"]
    return "\n".join(lines)


def _p2p_rows(topo, attr: str) -> list[list[str]]:
    def cell(a: int, b: int) -> str:
        if a == b:
            return "X"
        v = getattr(topo.link(a, b), attr)
        return "??" if v is None else ("OK" if v else "NS")
    return [[cell(g.index, h.index) for h in topo.gpus] for g in topo.gpus]


def _matrix(row_names: list[str], headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[k]) for r in rows)) + 2 for k, h in enumerate(headers)]
    first = max(len(n) for n in row_names) + 2
    out = [" " * first + "".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for name, r in zip(row_names, rows):
        out.append(name.ljust(first) + "".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return out


def _gpu_lines(topo, g) -> list[str]:
    if g.lost:
        state = "LOST"
    else:
        bad = [f for f in topo.findings_for(g.index) if f.severity.value != "info"]
        state = "healthy" if not bad else (
            "UNHEALTHY" if not topo.healthy(g.index) else f"{len(bad)} warning(s)")
        state = ("busy, " if g.busy else "free, ") + state
    head = f"GPU{g.index}  {g.name}  {g.pci_bus_id}  {g.uuid}"
    if g.nvml_index != g.index:
        head += f"  (nvml {g.nvml_index})"
    detail = [f"{g.memory_free_mib}/{g.memory_total_mib} MiB free",
              f"util {_q(g.utilization_pct)}%",
              f"PCIe Gen{_q(g.pcie_gen)} x{_q(g.pcie_width)} (max Gen{_q(g.pcie_gen_max)} x{_q(g.pcie_width_max)})",
              f"{_q(g.temperature_c)} C",
              f"{_q(g.power_w, '.0f')}/{_q(g.power_limit_w, '.0f')} W",
              f"SM {_q(g.sm_clock_mhz)}/{_q(g.sm_clock_max_mhz)} MHz"]
    if g.nvlinks_active:
        detail.append(f"{g.nvlinks_active} NVLinks")
    lines = [f"{head}  [{state}]", "      " + "  ".join(detail) if not g.lost else "      no readings"]
    for p in g.processes:
        lines.append(f"      pid {p.pid} {p.user or '??'} {_q(p.used_mib)} MiB"
                     + ("  (this job)" if p.ours else ""))
    lines += [f"      {f.severity.value}: {f.message}" for f in topo.findings_for(g.index)]
    return lines


def _q(v, fmt: str = "") -> str:
    """NVML values it could not read show as ??."""
    return "??" if v is None else format(v, fmt)
