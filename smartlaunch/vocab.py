"""The words every layer shares: strategy names, link classes and families, NUMA modes, and
the "0-3,8" range notation. Imports nothing of smartlaunch."""
from __future__ import annotations

import enum
import re
from typing import Iterable


class Strategy(str, enum.Enum):
    SINGLE = "single"            # one process, one GPU (or the CPU)
    INDEPENDENT = "independent"  # one single-GPU job per variant, queued onto free GPUs
    DDP = "ddp"                  # torchrun semantics: nproc ranks, one GPU each


STRATEGIES = tuple(s.value for s in Strategy)
AUTO = "auto"
STRATEGY_CHOICES = (AUTO, *STRATEGIES)          # --strategy

# nvidia-smi topo -m vocabulary, best first. NV# is written "NV<n>" (its family is "NV").
LINK_FAMILIES = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
UNKNOWN_LINK = "??"                             # NVML could not say; link_rank() sorts it last
# Families whose P2P path works on any sane machine (NCCL uses P2P there unless told not to).
P2P_FAMILIES = ("NV", "PIX", "PXB")
# NCCL_P2P_LEVEL names, nearest first, and NCCL's legacy integers (4 and above: SYS).
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_P2P_LEGACY = ("LOC", "PIX", "PXB", "PHB", "SYS")
# The P2P level that still covers each family's path.
FAMILY_P2P_LEVEL = {"NV": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "SYS",
                    "SYS": "SYS"}

NUMA_MODES = ("off", "node", "exclusive-cores")
ISOLATION_MODES = ("require", "best-effort", "off")   # dryrun.isolation (smartlaunch.sandbox)


def link_family(link_class: str) -> str:
    """'NV18' -> 'NV'; others unchanged. Policies key NCCL settings by family."""
    return "NV" if link_class.startswith("NV") else link_class


def link_rank(link_class: str) -> int:
    """Lower is faster. Unknown classes sort last."""
    fam = link_family(link_class)
    return LINK_FAMILIES.index(fam) if fam in LINK_FAMILIES else len(LINK_FAMILIES)


def nvlink_count(link_class: str) -> int:
    """'NV18' -> 18; 0 for every other class."""
    if link_class.startswith("NV") and link_class[2:].isdigit():
        return int(link_class[2:])
    return 0


def p2p_level(value: str) -> str | None:
    """An NCCL_P2P_LEVEL value as one of P2P_LEVELS; None if NCCL would not understand it."""
    v = value.strip().upper()
    if v in P2P_LEVELS:
        return v
    if v.isdigit():
        return _P2P_LEGACY[min(int(v), len(_P2P_LEGACY) - 1)]
    return None


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class RangeError(ValueError):
    def __init__(self, message: str, *, descending: bool = False):
        super().__init__(message)
        self.descending = descending


def parse_ranges(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5], order and repeats kept; blanks and spaces ignored.
    RangeError for anything else, or a descending range ('3-1')."""
    out: list[int] = []
    for part in (text or "").replace(" ", "").strip().split(","):
        if not part:
            continue
        m = _RANGE.match(part)
        if not m:
            raise RangeError(f"{part!r} is not a number or a range like 0-3")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise RangeError(f"{part!r} is a descending range", descending=True)
        out.extend(range(lo, hi + 1))
    return out


def format_ranges(ints: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8'; () -> ''."""
    ranges: list[list[int]] = []
    for c in sorted(set(ints)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
