"""DDP×N for several N on one machine (issue 17): `--nproc 2,3,4`, record labels, and regret
against the best of single and every DDP×N measured.

Records before issue 17 hold DDP×2 only and carry no `nproc`; they read as N = 2 and keep
their label "ddp", so old record files still build the same rows. A DDP record of N ranks
otherwise is labelled "ddp<N>" (latest() keys by it, so ×3 never replaces ×2).
"""
from __future__ import annotations

from typing import Any

LEGACY_N = 2          # what a DDP record without `nproc` measured (bench/regret.py before --nproc lists)


def parse_nproc(text: str) -> tuple[int, ...]:
    """"2,3,4" -> (2, 3, 4). Raises ValueError with the fix in its message."""
    try:
        ns = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--nproc {text!r} is not a list of integers; write e.g. --nproc 2,3,4")
    if not ns or ns[0] < 2:
        raise ValueError(f"--nproc {text!r}: every DDP size must be at least 2 (single is always "
                         f"measured); write e.g. --nproc 2,3,4")
    return tuple(ns)


def nproc_of(rec: dict[str, Any]) -> int:
    return int(rec.get("nproc") or LEGACY_N)


def label(rec: dict[str, Any]) -> str:
    """The record's kind, with N for DDP runs other than the legacy two ranks."""
    kind = rec["kind"]
    if kind != "ddp" or nproc_of(rec) == LEGACY_N:
        return kind
    return f"ddp{nproc_of(rec)}"


def ddp_label(n: int) -> str:
    return "ddp" if n == LEGACY_N else f"ddp{n}"


def sizes(records: list[dict[str, Any]]) -> tuple[int, ...]:
    """Every DDP size measured in these records, ascending."""
    return tuple(sorted({nproc_of(r) for r in records if r["kind"] == "ddp"}))


def rates(single: dict | None, ddp: dict[int, dict | None]) -> dict[int, float]:
    """{1: single samples/s, N: DDP×N samples/s} for the measurements that succeeded."""
    out = {}
    if single and single.get("ok") and (single.get("samples_per_s") or 0) > 0:
        out[1] = float(single["samples_per_s"])
    for n, r in ddp.items():
        if r and r.get("ok") and (r.get("samples_per_s") or 0) > 0:
            out[n] = float(r["samples_per_s"])
    return out


def oracle(measured: dict[int, float]) -> int | None:
    """The N with the most samples/s (1 = single); ties go to fewer GPUs. None without single
    or without any DDP run."""
    if 1 not in measured or len(measured) < 2:
        return None
    return max(measured, key=lambda n: (measured[n], -n))


def regret(n: int | None, measured: dict[int, float]) -> float | None:
    """1 - chosen / best over single and every DDP×N measured in the same invocation. None when
    the chosen N or single was not measured, or no DDP run was (a failed run scores nothing, it
    is not a zero)."""
    if n is None or n not in measured or 1 not in measured or len(measured) < 2:
        return None
    return 1.0 - measured[n] / max(measured.values())


def choice_n(choice: str | None, ranks: int | None, largest: int) -> int | None:
    """'single' -> 1, 'ddp' -> its ranks (the largest size when the record does not say)."""
    if choice == "single":
        return 1
    if choice == "ddp":
        return int(ranks) if ranks else largest
    return None


def name(n: int | None) -> str:
    return "–" if n is None else ("single" if n == 1 else f"DDP×{n}")


def predicted(sl: dict | None) -> dict[int, float]:
    """{N: the plan's DDP×N speedup} from a smartlaunch record's candidates."""
    out = {}
    for c in (sl or {}).get("candidates") or ():
        if c.get("strategy") == "ddp" and c.get("speedup") is not None:
            out[len(c.get("gpus") or ())] = float(c["speedup"])
    return out
