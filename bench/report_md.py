"""The regret report as markdown (bench/regret.py writes it next to the JSON), and the way
every small bench script hands over its report (emit)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import multi_n


def emit(lines: list[str], out: str | None = None) -> int:
    """Print the report and write it to --out when given; the script's exit code (0)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


def _f(x, fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def _pct(x) -> str:
    return _f(None if x is None else 100 * x, "{:.1f}%")


def _import_floor(summary: dict[str, Any]) -> str:
    lo_hi = summary.get("python_torch_import_range_s")
    if lo_hi and lo_hi[1] - lo_hi[0] >= 0.01:
        return f"{lo_hi[0]:.2f}–{lo_hi[1]:.2f} s across invocations"
    return _f(summary.get("python_torch_import_s")) + " s"


def _by_n(r: dict[str, Any]) -> str:
    """"×2 1,900; ×3 2,600" (or just the number when one N was run)."""
    by = r.get("ddp_sps_by_n") or {}
    if len(by) <= 1:
        return _f(r["ddp_sps"], "{:,.0f}")
    return "; ".join(f"×{n} {_f(v, '{:,.0f}')}" for n, v in sorted(by.items()))


def _choice(r: dict[str, Any], pol: str) -> str:
    n = (r.get("choice_n") or {}).get(pol)
    return multi_n.name(n) if n is not None else (r["choice"][pol] or "–")


def render_markdown(rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"# Regret benchmark — {meta.get('machine', '?')}, {meta.get('date', '?')}", "",
             "Speedup = DDP×N samples/s ÷ single-GPU samples/s, same per-GPU batch, all measured "
             "in the same invocation on the same machine (single once per script: it never "
             "touches NCCL). Regret = 1 − chosen ÷ best of single and every DDP×N measured "
             "(the oracle); always-DDP is torchrun on the largest N; `speedup meas.`, `pred.` "
             "and `err` are DDP×2's, the model fitted there.", "",
             "`pred.` is what smartlaunch's plan said (a measured trial where marked); `model` "
             "is the cost model's prediction replayed from the row's own profile and all-reduce "
             "curve, trial or not.", "",
             "| script | params | batch | link | single s/s | DDP s/s | speedup meas. | pred. | "
             "err | model | model err | oracle | smartlaunch | regret SL | always-DDP | seeds | "
             "decide 1st s | warm s |",
             "|" + "---|" * 18]
    for r in rows:
        reg, ch = r["regret"], r["choice"]
        pred = _f(r["predicted_speedup"]) + (" (trial)" if r.get("predicted_by_trial") else "")
        lines.append("| " + " | ".join([
            r["script"], _f(r["params"], "{:,}"), _f(r["batch"], "{}"), r["condition"],
            _f(r["single_sps"], "{:,.0f}"), _by_n(r),
            _f(r["measured_speedup"]), pred, _pct(r["pred_error"]),
            _f(r.get("model_speedup")), _pct(r.get("model_error")), multi_n.name(r.get("oracle_n")),
            _choice(r, "smartlaunch"), _pct(reg["smartlaunch"]), _pct(reg["always_ddp"]),
            f"{_pct(reg['seeds'])} ({_choice(r, 'seeds') if ch['seeds'] else '?'})",
            _f(r["decision_s"], "{:.1f}") + (" (cold)" if r.get("profile_cached") is False else ""),
            _f(r["decision_warm_s"])]) + " |")
    lines += ["", "## Summary", "", "| policy | rows | mean regret | max regret | no data |",
              "|---|---|---|---|---|"]
    for pol, name in (("smartlaunch", "smartlaunch"), ("always_ddp", "always-DDP (torchrun)"),
                      ("seeds", "seeds' rule (>10M params, batch ≥ 64)")):
        s = summary["regret"][pol]
        lines.append(f"| {name} | {s['n']} | {_pct(s['mean'])} | {_pct(s['max'])} | {s['missing']} |")
    pe = summary["pred_error_abs"]
    lines += ["",
              f"- Predicted vs measured DDP speedup: max |pred − meas| / meas = {_pct(pe['max'])}, "
              f"mean {_pct(pe['mean'])}; {summary['pred_within_15pct']} of {pe['n']} within ±15%.",
              f"- The cost model alone (replayed on every row, trial rows included): max "
              f"{_pct(summary['model_error_abs']['max'])}, mean {_pct(summary['model_error_abs']['mean'])}; "
              f"{summary['model_within_15pct']} of {summary['model_error_abs']['n']} within ±15%.",
              f"- Decision wall time (whole `smartlaunch --explain=json` command): first call per row "
              f"median {_f(summary['decision_first_s']['median'], '{:.1f}')} s, "
              f"max {_f(summary['decision_first_s']['max'], '{:.1f}')} s; cold profile cache "
              f"median {_f(summary['decision_cold_s']['median'], '{:.1f}')} s; warm caches median "
              f"{_f(summary['decision_warm_s']['median'])} s, max {_f(summary['decision_warm_s']['max'])} s "
              f"(Python start-up + `import torch, torch.distributed.run` alone: "
              f"{_import_floor(summary)}; warm minus the floor its own invocation measured: "
              f"{_f(summary.get('decision_warm_over_import_s'))} s)"
              + (f"; the warm plan's own clock (policy to prepare, in-process): median "
                 f"{_f(summary['decision_warm_inproc_s']['median'], '{:.3f}')} s, max "
                 f"{_f(summary['decision_warm_inproc_s']['max'], '{:.3f}')} s"
                 if (summary.get('decision_warm_inproc_s') or {}).get('n') else "") + ".",
              "", "Goals: " + "; ".join(f"{k}: {'–' if v is None else ('met' if v else 'NOT met')}"
                                        for k, v in summary["goals"].items()) + "."]
    errors = [(r["script"], r["condition"], k, v) for r in rows for k, v in r["errors"].items()]
    if errors:
        lines += ["", "## Failed runs", ""] + [f"- {s} / {c} / {k}: {v}" for s, c, k, v in errors]
    return "\n".join(lines) + "\n"
