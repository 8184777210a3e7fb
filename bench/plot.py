"""Predicted versus measured DDP speedup, one marker shape per link condition, with y = x and
the ±15% band of the issue's goal. Filled: what the plan said (a trial's measurement where one
ran); hollow: the cost model's own prediction on those trial rows. Imports matplotlib (headless) only when called.

    python bench/plot.py DIR/regret-<date>-<machine>.json   # redraw from regret.py's report
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

MARKERS = {"nvlink": ("o", "tab:green"), "host": ("s", "tab:blue"), "sockets": ("^", "tab:red")}


def plot_speedups(rows: list[dict], path: Path, title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6.5), dpi=120)
    pts = [r for r in rows if r.get("predicted_speedup") is not None and r.get("measured_speedup")]
    hi = max([2.2] + [max(r["predicted_speedup"], r["measured_speedup"]) * 1.1 for r in pts])
    ax.plot([0, hi], [0, hi], color="0.3", lw=1, label="predicted = measured")
    ax.fill_between([0, hi], [0, 0.85 * hi], [0, 1.15 * hi], color="0.85", alpha=0.5, label="±15%")
    ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
    ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
    for cond, (marker, color) in MARKERS.items():
        mine = [r for r in pts if r["condition"] == cond]
        if not mine:
            continue
        ax.scatter([r["measured_speedup"] for r in mine], [r["predicted_speedup"] for r in mine],
                   marker=marker, color=color, s=42, label=cond, zorder=3)
        # The cost model alone, where a trial replaced it in the plan: hollow, joined.
        alone = [r for r in mine if r.get("predicted_by_trial") and r.get("model_speedup")]
        if alone:
            ax.scatter([r["measured_speedup"] for r in alone], [r["model_speedup"] for r in alone],
                       marker=marker, facecolors="none", edgecolors=color, s=42, zorder=3,
                       label=f"{cond}: cost model where a trial decided")
            for r in alone:
                ax.plot([r["measured_speedup"]] * 2, [r["model_speedup"], r["predicted_speedup"]],
                        color=color, lw=0.6, ls="--")
        for r in mine:
            ax.annotate(r["script"], (r["measured_speedup"], r["predicted_speedup"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points", color=color)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured DDP×2 speedup (samples/s ÷ single GPU)")
    ax.set_ylabel("smartlaunch's predicted speedup")
    ax.set_title(f"Predicted vs measured DDP speedup {title}".strip(), fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    report = Path(sys.argv[1])
    data = json.loads(report.read_text())
    print(plot_speedups(data["rows"], report.with_suffix(".png"),
                        f"{data['meta']['machine']} {data['meta']['date']}"))
