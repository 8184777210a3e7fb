"""Health findings computed from raw readings; both backends call `assess`. CRITICAL = do not use
this GPU; WARNING = usable but slower or suspicious; INFO = changes nothing."""
from __future__ import annotations

from typing import Iterable, Sequence

from smartlaunch.topology.api import GPU, Finding, Link, Severity
from smartlaunch.vocab import P2P_FAMILIES

TEMPERATURE_WARN_C = 85            # most datacenter parts start slowing down at 87-90 C
POWER_AT_LIMIT_FRACTION = 0.97
# Reasons that lower clocks by design, not because something is wrong.
BENIGN_THROTTLE = frozenset({"gpu_idle", "applications_clocks_setting", "sync_boost",
                             "display_clock_setting", "sw_power_cap"})


def assess(gpus: Sequence[GPU], links: Iterable[Link], extra: Iterable[Finding] = ()) -> tuple[Finding, ...]:
    """Findings for `gpus` and their links, plus `extra`, without duplicates, worst first."""
    out: list[Finding] = []
    for g in gpus:
        out.extend(gpu_findings(g))
    for link in links:
        out.extend(link_findings(link))
    off = [g.index for g in gpus if g.persistence_mode is False and not g.lost]
    if off:
        out.append(Finding(Severity.INFO, "persistence_off",
                           f"persistence mode is off on {', '.join(f'GPU{i}' for i in off)}: each "
                           f"process that opens an idle GPU (NVML, CUDA) waits for the driver to "
                           f"initialise it again; admins: run nvidia-persistenced or "
                           f"`nvidia-smi -pm 1`"))
    out.extend(extra)
    first: dict = {}
    for f in out:
        first.setdefault((f.code, f.gpu, f.message), f)
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return tuple(sorted(first.values(),
                        key=lambda f: (order[f.severity], -1 if f.gpu is None else f.gpu)))


def gpu_findings(g: GPU) -> list[Finding]:
    i = g.index
    if g.lost:
        why = f" ({g.nvml_error})" if g.nvml_error else ""
        return [Finding(Severity.CRITICAL, "gpu_lost",
                        f"GPU{i} ({g.pci_bus_id or 'bus id unknown'}) does not answer NVML{why}; "
                        f"it has likely fallen off the bus — drain the node and reset or reboot", i)]
    f: list[Finding] = []
    if g.ecc_volatile_uncorrected:
        f.append(Finding(Severity.CRITICAL, "ecc_uncorrected",
                         f"GPU{i} has {g.ecc_volatile_uncorrected} uncorrectable ECC error(s) since "
                         f"the last driver load; reset the GPU before using it", i))
    elif g.ecc_aggregate_uncorrected:
        f.append(Finding(Severity.WARNING, "ecc_uncorrected_history",
                         f"GPU{i} has had {g.ecc_aggregate_uncorrected} uncorrectable ECC error(s) "
                         f"in its lifetime (none since the last reset)", i))
    if g.row_remap_failed:
        f.append(Finding(Severity.CRITICAL, "row_remap_failed",
                         f"GPU{i} could not remap a failing memory row; it needs service", i))
    elif g.row_remap_pending:
        f.append(Finding(Severity.WARNING, "row_remap_pending",
                         f"GPU{i} has a memory row remap pending; reset the GPU to apply it", i))
    if g.retired_pages:
        f.append(Finding(Severity.WARNING, "retired_pages",
                         f"GPU{i} has {g.retired_pages} retired memory page(s)", i))
    f.extend(_pcie(g))
    if g.temperature_c is not None and g.temperature_c >= TEMPERATURE_WARN_C:
        f.append(Finding(Severity.WARNING, "temperature_high",
                         f"GPU{i} is at {g.temperature_c} C (warning from {TEMPERATURE_WARN_C} C)", i))
    if g.power_w is not None and g.power_limit_w and g.power_w >= POWER_AT_LIMIT_FRACTION * g.power_limit_w:
        f.append(Finding(Severity.INFO, "power_at_limit",
                         f"GPU{i} draws {g.power_w:.0f} W of its {g.power_limit_w:.0f} W limit", i))
    bad = [r for r in g.throttle_reasons if r not in BENIGN_THROTTLE]
    if bad:
        clocks = ""
        if g.sm_clock_mhz is not None and g.sm_clock_max_mhz:
            clocks = f" at {g.sm_clock_mhz} of {g.sm_clock_max_mhz} MHz"
        f.append(Finding(Severity.WARNING, "clocks_throttled",
                         f"GPU{i} clocks are held down{clocks} by {', '.join(bad)}", i))
    if g.mig_mode:
        f.append(Finding(Severity.WARNING, "mig_enabled",
                         f"GPU{i} is in MIG mode: a process sees one MIG instance, not the whole GPU; "
                         f"name the instance in CUDA_VISIBLE_DEVICES (MIG-...) or disable MIG", i))
    foreign = g.foreign
    if foreign:
        who = ", ".join(f"pid {p.pid} ({p.user or 'unknown user'}"
                        + (f", {p.used_mib} MiB)" if p.used_mib is not None else ")") for p in foreign)
        f.append(Finding(Severity.INFO, "gpu_busy", f"GPU{i} is in use by {who}", i))
    return f


def _pcie(g: GPU) -> list[Finding]:
    i, f = g.index, []
    if g.pcie_width is not None and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        f.append(Finding(Severity.WARNING, "pcie_width_degraded",
                         f"GPU{i} PCIe link runs at x{g.pcie_width} of x{g.pcie_width_max}: "
                         f"host transfers are {g.pcie_width_max // max(g.pcie_width, 1)}x slower; "
                         f"reseat the card or check the slot/riser", i))
    # An idle GPU drops its PCIe generation to save power.
    idle = "gpu_idle" in g.throttle_reasons or not g.utilization_pct
    if g.pcie_gen is not None and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max and not idle:
        f.append(Finding(Severity.WARNING, "pcie_gen_degraded",
                         f"GPU{i} PCIe link runs at Gen{g.pcie_gen} of Gen{g.pcie_gen_max} while busy", i))
    return f


def link_findings(link: Link) -> list[Finding]:
    pair = f"GPU{link.a}-GPU{link.b}"
    if link.family not in P2P_FAMILIES:
        return []
    if link.p2p is False:
        return [Finding(Severity.WARNING, "p2p_unavailable",
                        f"{pair} are linked by {link.link_class} but P2P is not available "
                        f"(read={_yn(link.p2p_read)}, write={_yn(link.p2p_write)}); NCCL will copy "
                        f"through host memory — check IOMMU/ACS settings and the driver")]
    if link.family == "NV" and link.p2p_nvlink is False:
        return [Finding(Severity.WARNING, "p2p_nvlink_unavailable",
                        f"{pair} show {link.link_class} but P2P over NVLink is not available; "
                        f"check `nvidia-smi nvlink --status` and the fabric manager")]
    return []


def _yn(v: bool | None) -> str:
    return "??" if v is None else ("ok" if v else "no")
