"""Numbers in sentences: the few formats every reason and the explain text share."""
from __future__ import annotations


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "?? ms"
    v = seconds * 1e3
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 1:
        return f"{v:.1f} ms"
    return f"{v:.2f} ms"


def pct(x: float | None) -> str:
    return "??%" if x is None else f"{x * 100:.0f}%"


def pct_of(x: float, floor: float) -> str:
    """pct(x), with the decimals it takes not to read as a floor it is not (69.98%, not 70%)."""
    if round(x, 9) != round(floor, 9):
        for digits in range(3):
            if f"{x * 100:.{digits}f}" != f"{floor * 100:.{digits}f}":
                return f"{x * 100:.{digits}f}%"
    return pct(x)


def times(x: float | None) -> str:
    return "??×" if x is None else f"{x:.2f}×"


def rate(x: float | None) -> str:
    return "?? samples/s" if x is None else f"{x:,.0f} samples/s"


def gpu_list(gpus) -> str:
    gpus = tuple(gpus)
    if not gpus:
        return "none"
    if len(gpus) == 1:
        return f"GPU{gpus[0]}"
    return "GPUs " + ",".join(str(g) for g in gpus)


def mb(nbytes: float | None) -> str:
    return "??" if nbytes is None else f"{nbytes / 1e6:,.1f} MB"


def gbps(bps: float | None) -> str:
    if bps is None:
        return "??"
    v = bps / 1e9
    return f"{v:.1f} GB/s" if v >= 0.1 or v == 0 else f"{v:.2g} GB/s"


def size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"
