"""What a job_overhead.py session's records say: rows per launcher (paired rounds, --baton
sessions, --toggle-windows jobs) and their markdown reports."""
from __future__ import annotations

import math
import statistics

from bench.pairs import batch_interval, interval, launch_interval, order_effect


def baton_rows(records: list[dict]) -> list[dict]:
    """Per session: kind's throughput ÷ torchrun's, window pair by window pair."""
    rows = []
    for r in records:
        if r.get("mode") != "baton" or not r["pairs"]:
            continue
        same = len(set(r.get("world", {}).values())) == 1
        rows.append({"condition": r["condition"], "script": r["script"], "kind": r["kind"],
                     "pairs": len(r["pairs"]), "same_world": same, "world": r.get("world"),
                     "ratio": launch_interval(r) or batch_interval([a / b for a, b, _ in
                                                                    r["pairs"]]),
                     "launches": r.get("launches", 1),
                     "cpu_ratio": launch_interval(r, cpu=True) or batch_interval(
                         [a / b for a, b in r.get("cpu_pairs", [])]),
                     "order": order_effect(r),
                     "torchrun_step_ms": statistics.median(a for a, _, _ in r["pairs"]),
                     "launcher_cpu": per_launcher(r.get("launcher_cpu") or {}), "ok": r["ok"],
                     "decision": r.get("decision")})
    return rows



def per_launcher(values: dict) -> dict:
    """{job name: x} -> {launcher: mean x} ("sl-ddp#1" counts as sl-ddp)."""
    out: dict = {}
    for name, x in values.items():
        if x is not None:
            out.setdefault(name.split("#")[0], []).append(x)
    return {k: round(statistics.mean(v), 5) for k, v in out.items()}



def rows_of(records: list[dict], kinds: tuple[str, ...]) -> list[dict]:
    """Paired rounds: per condition, script and launcher (in `kinds` order), its samples/s ÷
    torchrun's of the same round, first-step difference and summary agreement."""
    rows = []
    for cond in dict.fromkeys(r["condition"] for r in records):
        for script in dict.fromkeys(r["script"] for r in records if r["condition"] == cond):
            mine = [r for r in records if r["condition"] == cond and r["script"] == script
                    and r.get("round") is not None]
            base = {r["round"]: r for r in mine if r["kind"] == "torchrun" and r["ok"]}
            for kind in [k for k in kinds if k != "torchrun"]:
                pairs = [(base[r["round"]], r) for r in mine
                         if r["kind"] == kind and r["ok"] and r["round"] in base]
                if not pairs:
                    continue
                ratio = interval([b["samples_per_s"] / a["samples_per_s"] for a, b in pairs])
                firsts = [b["first_step_s"] - a["first_step_s"] for a, b in pairs
                          if a.get("first_step_s") is not None and b.get("first_step_s") is not None]
                agree = [b["summary_vs_timer"] for _, b in pairs if b.get("summary_vs_timer")]
                rows.append({"condition": cond, "script": script, "kind": kind,
                             "rounds": len(pairs), "ratio": ratio,
                             "torchrun_step_ms": statistics.median(a["step_ms"] for a, _ in pairs),
                             "first_step_delta_s": statistics.median(firsts) if firsts else None,
                             "summary_vs_timer": (min(agree), max(agree)) if agree else None,
                             "decision": pairs[-1][1].get("decision")})
    return rows



def toggle_rows(records: list[dict]) -> list[dict]:
    """Per job: throughput with the hooks on ÷ off, window pair by window pair."""
    rows = []
    for r in records:
        if not r.get("on_ms"):
            continue
        pairs = list(zip(r["on_ms"], r["off_ms"]))
        cpu = list(zip(r.get("on_cpu_ms") or [], r.get("off_cpu_ms") or []))
        rows.append({"condition": r["condition"], "script": r["script"], "hooks": r["hooks"],
                     "pairs": len(pairs), "ratio": interval([off / on for on, off in pairs]),
                     "cpu_ratio": interval([off / on for on, off in cpu]) if cpu else None,
                     "step_ms": statistics.median(r["off_ms"])})
    return rows



def baton_markdown(rows: list[dict], meta: dict) -> str:
    out = [f"# Job overhead, both jobs alive and taking turns: smartlaunch ÷ torchrun, "
           f"{meta['nproc']} ranks", "",
           f"{meta['when']}, {meta['host']}, {meta['gpus']}; windows of {meta['window_s']} s "
           "alternating between torchrun's job and smartlaunch's (bench/job_overhead.py --baton)",
           "", "Intervals: 95%, across launch pairs where a session has several (×K launches), "
           "else from 10 consecutive batches of window pairs (adjacent windows drift "
           "together). Main-thread CPU: rank 0's CPU time a step, torchrun's ÷ the launcher's "
           "(a per-step hook shows there without the machine's waits). Launcher CPU/s: the CPU "
           "its processes other than ranks used per second of windows.",
           "", "| condition | script | launcher | window pairs | torchrun step ms | throughput ÷ "
           "torchrun | 95% interval | main-thread CPU, torchrun ÷ launcher | launcher CPU/s "
           "(torchrun, smartlaunch) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, lo, hi = r["ratio"]
        cpu = r["launcher_cpu"] or {}
        note = "" if r["same_world"] else f" (worlds {r['world']}: not comparable)"
        if r["launches"] > 1:
            note += f" ×{r['launches']} launches"
        if r.get("order"):
            note += (f" (first started: {r['kind']} {r['order'][0]:.4f}, "
                     f"torchrun {r['order'][1]:.4f})")
        c = r["cpu_ratio"]
        out.append(f"| {r['condition']} | {r['script']} | {r['kind']}{note} | {r['pairs']} | "
                   f"{r['torchrun_step_ms']:.3f} | {g:.4f} | {lo:.4f}–{hi:.4f} | "
                   + (f"{c[0]:.4f} ({c[1]:.4f}–{c[2]:.4f})" if c else "–") + " | "
                   f"{cpu.get('torchrun', '–')}, {cpu.get(r['kind'], '–')} |")
    logs = [math.log(r["ratio"][0]) for r in rows if r["same_world"]]
    if len(logs) > 1:
        g = interval([math.exp(x) for x in logs])
        out += ["", f"Across rows (each row's ratio one value): {g[0]:.4f}, 95% interval "
                f"{g[1]:.4f}–{g[2]:.4f}."]
    decisions = [(r["condition"], r["script"], r["decision"]) for r in rows
                 if r["kind"] == "sl-auto"]
    if decisions:
        out += ["", "Decided launches (sl-auto):", ""]
        out += [f"- {c} {s}: {d}" for c, s, d in decisions]
    return "\n".join(out) + "\n"



def toggle_markdown(rows: list[dict], meta: dict) -> str:
    part = meta.get("toggle_part", "hooks")
    launch = "`smartlaunch --strategy ddp`" if meta["nproc"] > 1 else "the decided launch"
    out = [f"# The worker hook's per-step cost, in one job: {part} on ÷ off, {meta['nproc']} ranks",
           "", f"{meta['when']}, {meta['host']}, {meta['gpus']}; {launch}, windows alternating "
           f"between the {part} on and off (bench/suite/_harness.py --toggle-windows "
           f"--toggle-part {part}). Main-thread CPU: rank 0's CPU time a step, off ÷ on.", "",
           f"| condition | script | {part} found | window pairs | step ms (off) | throughput "
           "on ÷ off | 95% interval | main-thread CPU off ÷ on (95%) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, lo, hi = r["ratio"]
        c = r.get("cpu_ratio")
        out.append(f"| {r['condition']} | {r['script']} | {'yes' if r['hooks'] else 'NO'} | "
                   f"{r['pairs']} | {r['step_ms']:.3f} | {g:.4f} | {lo:.4f}–{hi:.4f} | "
                   + ("–" if c is None else f"{c[0]:.4f} ({c[1]:.4f}–{c[2]:.4f})") + " |")
    return "\n".join(out) + "\n"



def markdown(rows: list[dict], meta: dict) -> str:
    out = [f"# Job overhead: smartlaunch ÷ torchrun, {meta['nproc']} ranks", "",
           f"{meta['when']}, {meta['host']}, {meta['gpus']}; {meta['rounds_done']} rounds "
           f"(ABC/CBA), {meta['elapsed_s']:.0f} s", "",
           "| condition | script | launcher | rounds | torchrun step ms | ratio (geo. mean) | "
           "95% interval | first step Δ s (median) | summary ÷ script timer |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, lo, hi = r["ratio"]
        agree = r["summary_vs_timer"]
        out.append(f"| {r['condition']} | {r['script']} | {r['kind']} | {r['rounds']} | "
                   f"{r['torchrun_step_ms']:.3f} | {g:.4f} | {lo:.4f}–{hi:.4f} | "
                   + ("–" if r["first_step_delta_s"] is None else f"{r['first_step_delta_s']:+.2f}")
                   + " | " + ("–" if not agree else f"{agree[0]:.3f}–{agree[1]:.3f}") + " |")
    decisions = {(r["condition"], r["script"]): r["decision"] for r in rows if r["kind"] == "sl-auto"}
    if decisions:
        out += ["", "Decided launches (sl-auto):", ""]
        out += [f"- {c} {s}: {d}" for (c, s), d in decisions.items()]
    return "\n".join(out) + "\n"

