"""Node health against the admin-approved baseline: pure functions of two Topologies.
Critical (drain the node): hardware faults that make every later job wrong or slow; warning:
what may be benign at idle (a lower PCIe generation saves power) or needs no drain."""
from __future__ import annotations

from typing import Iterable

from smartlaunch.topology.api import Finding, Severity, Topology

# NVML throttle reasons that mean trouble when the GPU is idle; idle/app-clock reasons don't.
_BAD_THROTTLE = ("hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake", "thermal",
                 "power_brake")
IDLE_HOT_C = 85


def check(now: Topology, baseline: Topology | None,
          job_gpus: Iterable[int] | None = None) -> list[Finding]:
    """Findings for the node now. `job_gpus`: physical (nvml) indices to check; None: all."""
    wanted = None if job_gpus is None else set(job_gpus)
    by_uuid = {g.uuid: g for g in now.gpus}
    out: list[Finding] = []
    crit, warn = Severity.CRITICAL, Severity.WARNING

    if baseline is None:
        out.append(Finding(warn, "no_baseline", "no approved baseline on this node: run "
                           "`smartlaunch-node baseline` once the node is known good"))
    else:
        for b in baseline.gpus:
            if b.uuid not in by_uuid:
                out.append(Finding(crit, "gpu_missing",
                                   f"GPU {b.nvml_index} ({b.uuid}) of the baseline is missing "
                                   f"({len(now.gpus)} of {len(baseline.gpus)} GPUs visible)",
                                   b.nvml_index))
    for g in now.gpus:
        if wanted is not None and g.nvml_index not in wanted:
            continue
        i = g.nvml_index
        b = _match(baseline, g.uuid)
        if g.lost:
            out.append(Finding(crit, "gpu_lost", f"GPU {i} ({g.uuid}) does not answer NVML "
                               f"({g.nvml_error or 'fallen off the bus'})", i))
            continue
        if g.ecc_volatile_uncorrected:
            out.append(Finding(crit, "ecc_uncorrected", f"GPU {i} has {g.ecc_volatile_uncorrected}"
                               f" uncorrectable ECC error(s) since the last reset", i))
        elif b and g.ecc_aggregate_uncorrected and \
                g.ecc_aggregate_uncorrected > (b.ecc_aggregate_uncorrected or 0):
            out.append(Finding(crit, "ecc_uncorrected", f"GPU {i} aggregate uncorrectable ECC "
                               f"errors rose from {b.ecc_aggregate_uncorrected or 0} to "
                               f"{g.ecc_aggregate_uncorrected}", i))
        if g.row_remap_failed:
            out.append(Finding(crit, "row_remap_failed", f"GPU {i} row remapping failed", i))
        elif g.row_remap_pending:
            out.append(Finding(warn, "row_remap_pending", f"GPU {i} has row remaps pending a "
                               f"GPU reset", i))
        if b and g.retired_pages is not None and g.retired_pages > (b.retired_pages or 0):
            out.append(Finding(warn, "pages_retired", f"GPU {i} retired pages rose from "
                               f"{b.retired_pages or 0} to {g.retired_pages}", i))
        if b and g.pcie_width and b.pcie_width and g.pcie_width < b.pcie_width:
            out.append(Finding(crit, "pcie_width_degraded", f"GPU {i} PCIe link is x{g.pcie_width},"
                               f" baseline x{b.pcie_width}", i))
        if b and g.pcie_gen_max and b.pcie_gen_max and g.pcie_gen_max < b.pcie_gen_max:
            out.append(Finding(warn, "pcie_gen_degraded", f"GPU {i} PCIe link reaches Gen"
                               f"{g.pcie_gen_max} at most, baseline Gen{b.pcie_gen_max}", i))
        bad = [r for r in g.throttle_reasons if any(k in r.lower() for k in _BAD_THROTTLE)]
        if bad:
            out.append(Finding(warn, "throttled_idle", f"GPU {i} throttled at idle: "
                               f"{', '.join(bad)}", i))
        if g.temperature_c is not None and g.temperature_c >= IDLE_HOT_C:
            out.append(Finding(warn, "hot_idle", f"GPU {i} at {g.temperature_c} C while idle "
                               f"(>= {IDLE_HOT_C} C)", i))
    out.extend(_p2p_lost(now, baseline, wanted))
    return out


def _match(baseline: Topology | None, uuid: str):
    if baseline is None:
        return None
    return next((g for g in baseline.gpus if g.uuid == uuid), None)


def _p2p_lost(now, baseline, wanted) -> list[Finding]:
    if baseline is None:
        return []
    out = []
    b_uuid = {g.index: g.uuid for g in baseline.gpus}
    n_index = {g.uuid: g.index for g in now.gpus}
    for bl in baseline.links:
        if not bl.p2p:
            continue
        ua, ub = b_uuid.get(bl.a), b_uuid.get(bl.b)
        if ua not in n_index or ub not in n_index:
            continue           # reported as gpu_missing
        a, b = n_index[ua], n_index[ub]
        try:
            link = now.link(a, b)
        except KeyError:
            continue
        ga, gb = now.gpu(a), now.gpu(b)
        if wanted is not None and not ({ga.nvml_index, gb.nvml_index} & wanted):
            continue
        if link.p2p is False:
            out.append(Finding(Severity.CRITICAL, "p2p_lost",
                               f"P2P between GPU {ga.nvml_index} and {gb.nvml_index} is "
                               f"unavailable; the baseline had it ({bl.link_class})",
                               ga.nvml_index))
    return out


def critical(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == Severity.CRITICAL]
