"""Ratios of paired measurements and their intervals (bench/job_overhead.py): a 95% t-interval
on logs, one over batches of windows that drift together, Welch's between two sets, and launch
pairs (each pair's geometric mean one value), pooled over stored sessions."""
from __future__ import annotations

import math
import statistics

_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def interval(values: list[float]) -> tuple[float, float, float] | None:
    """(geometric mean, low, high) of ratios with a 95% t-interval on their logs."""
    logs = [math.log(v) for v in values if v and v > 0]
    if len(logs) < 2:
        return (math.exp(logs[0]),) * 3 if logs else None
    m, sd = statistics.mean(logs), statistics.stdev(logs)
    h = _T95[min(len(logs) - 1, len(_T95)) - 1] * sd / math.sqrt(len(logs))
    return math.exp(m), math.exp(m - h), math.exp(m + h)



def batch_interval(values: list[float], batches: int = 10) -> tuple[float, float, float] | None:
    """(geometric mean, low, high) of ratios taken in time order, the 95% interval from the
    means of `batches` consecutive runs of them: adjacent windows drift together (lag-1
    correlation 0.35-0.45 on lent H100/H200 VMs), so a t-interval over the windows themselves
    is too narrow."""
    logs = [math.log(v) for v in values if v and v > 0]
    if len(logs) < 2 * batches:
        return interval(values) if logs else None
    n = len(logs) // batches
    means = [statistics.mean(logs[i * n:(i + 1) * n]) for i in range(batches)]
    h = _T95[batches - 2] * statistics.stdev(means) / math.sqrt(batches)
    g = statistics.mean(logs)
    return math.exp(g), math.exp(g - h), math.exp(g + h)



def welch(x: list[float], y: list[float]) -> tuple[float, float, float] | None:
    """(ratio of geometric means x ÷ y, 95% low, high): Welch's t on the logs, df rounded
    down (None with fewer than 2 values on a side)."""
    if len(x) < 2 or len(y) < 2:
        return None
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    vx, vy = statistics.variance(lx) / len(lx), statistics.variance(ly) / len(ly)
    d, se = statistics.mean(lx) - statistics.mean(ly), math.sqrt(vx + vy)
    if se == 0:
        return (math.exp(d),) * 3
    df = (vx + vy) ** 2 / (vx ** 2 / (len(lx) - 1) + vy ** 2 / (len(ly) - 1))
    h = _T95[min(max(int(df), 1), len(_T95)) - 1] * se
    return math.exp(d), math.exp(d - h), math.exp(d + h)



def per_launch_ratios(rec: dict, cpu: bool = False) -> list[float]:
    """Each launch pair's geometric-mean ratio over its windows: throughput (torchrun's step
    time ÷ the other's), or main-thread CPU a step, torchrun's ÷ the other's (cpu_pairs hold
    window p of launch pair j at p * K + j)."""
    per = rec.get("launch_pairs") or []
    if not cpu:
        return [math.exp(statistics.mean(math.log(a / b) for a, b, _ in one))
                for one in per if one]
    flat, k = rec.get("cpu_pairs") or [], len(per)
    out = []
    for j, one in enumerate(per):
        mine = [flat[p * k + j] for p in range(len(one)) if p * k + j < len(flat)]
        if mine:
            out.append(math.exp(statistics.mean(math.log(a / b) for a, b in mine)))
    return out



def launch_interval(rec: dict, cpu: bool = False) -> tuple[float, float, float] | None:
    """With several launch pairs in a session: each pair's geometric-mean ratio one value, the
    t-interval across pairs (None with fewer than 2). cpu: of main-thread CPU a step."""
    per = per_launch_ratios(rec, cpu)
    return interval(per) if len(per) >= 2 else None



def order_effect(rec: dict) -> tuple[float, float] | None:
    """--alternate-first: the geometric-mean throughput ratio of the launch pairs whose other
    job (smartlaunch's, or the control's) started first, and of those whose torchrun job did."""
    firsts = rec.get("first_by_launch")
    per = per_launch_ratios(rec)
    if not firsts or len(per) != len(firsts):
        return None
    groups = [[x for x, f in zip(per, firsts) if (f == "torchrun") == tr] for tr in (False, True)]
    if not all(groups):
        return None
    return tuple(math.exp(statistics.mean(math.log(x) for x in g)) for g in groups)



def pooled_rows(records: list[dict], control: str | None = None,
                by_machine: bool = True) -> list[dict]:
    """Stored --baton records (bench/_record.py form) with launch pairs: one row per machine
    (by_machine False: all as one), condition, script, ranks and launcher, its launch pairs'
    throughput and main-thread CPU ratios pooled over sessions, and, with a control launcher,
    the row's ratios over the control's of the same machine and row (None where that has fewer
    than 2 pairs)."""
    from bench import _record
    groups: dict[tuple, dict] = {}
    for r in records:
        c, d = r.get("conditions") or {}, r.get("detail") or {}
        if c.get("mode") != "baton" or len(d.get("launch_pairs") or []) < 1:
            continue
        machine = _record.label(r["machine"]) if by_machine else "all"
        key = (machine, c.get("condition"), c.get("script"), c.get("nproc"), c.get("kind"))
        g = groups.setdefault(key, {"tp": [], "cpu": [], "runs": []})
        g["tp"] += per_launch_ratios(d)
        g["cpu"] += per_launch_ratios(d, cpu=True)
        if r["run"] not in g["runs"]:
            g["runs"].append(r["run"])
    rows = []
    for key, g in groups.items():
        ctrl = groups.get((*key[:4], control)) if control and key[4] != control else None
        rows.append({"machine": key[0], "condition": key[1], "script": key[2], "nproc": key[3],
                     "kind": key[4], "runs": g["runs"], "pairs": len(g["tp"]),
                     "ratio": interval(g["tp"]), "cpu_ratio": interval(g["cpu"]),
                     "vs_control": welch(g["tp"], ctrl["tp"]) if ctrl else None,
                     "cpu_vs_control": welch(g["cpu"], ctrl["cpu"]) if ctrl else None})
    return rows



def pooled_markdown(rows: list[dict], runs: list[str], control: str | None) -> str:
    f = lambda t: "–" if t is None else f"{t[0]:.4f} ({t[1]:.4f}–{t[2]:.4f})"  # noqa: E731
    out = [f"# Launch pairs pooled over runs: {', '.join(runs)}", "",
           "Each launch pair's geometric-mean ratio one value; 95% t-intervals across pairs"
           + (f"; against {control}: Welch on the logs." if control else "."), "",
           "| machine | condition | script | ranks | launcher | sessions | launch pairs | "
           "throughput ÷ torchrun | main-thread CPU, torchrun ÷ other"
           + (f" | throughput ÷ {control}'s | CPU ÷ {control}'s |" if control else " |"),
           "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if control else "")]
    for r in rows:
        out.append(f"| {r['machine']} | {r['condition']} | {r['script']} | {r['nproc']} | "
                   f"{r['kind']} | {len(r['runs'])} | {r['pairs']} | {f(r['ratio'])} | "
                   f"{f(r['cpu_ratio'])} |"
                   + (f" {f(r['vs_control'])} | {f(r['cpu_vs_control'])} |" if control else ""))
    return "\n".join(out) + "\n"

