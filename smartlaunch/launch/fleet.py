"""`smartlaunch-node report`: the admins' fleet view of the decision log (launch/decision_log.py).

Reads the log (one node's, or a shared one every node appends to) and prints one table:
launches and failures per strategy (or user, or host), GPU-hours used, GPU-hours saved (or
lost, negative) against torchrun, summed only over launches whose torchrun figure was
measured, with how many had none, and mispredictions (a measured speedup outside the plan's
uncertainty band around its prediction), the worst few listed. `--prometheus PATH` writes the
same totals as a node_exporter textfile instead (written to a temp file in PATH's directory,
then renamed over PATH, so the collector never reads half a file).
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from smartlaunch.errors import UsageError
from smartlaunch.launch.decision_log import iter_since, mispredicted, read_log

GROUPS = ("strategy", "user", "host")
WORST_SHOWN = 5
_AGO = re.compile(r"^(\d+)([dhm])$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="what smartlaunch decided (from the decision log): launches, GPU-hours "
                       "used, saved against torchrun, mispredictions")
    p.add_argument("--log", metavar="PATH", default=None,
                   help="the decision log (default: policy paths.decision_log as a launch here "
                        "would write it)")
    p.add_argument("--since", metavar="WHEN", default=None,
                   help="only launches since a date (2026-11-01, 2026-11-01T08:00) or for the "
                        "last 7d, 24h or 90m")
    p.add_argument("--by", choices=GROUPS, default="strategy",
                   help="one row per strategy (default), user or host")
    p.add_argument("--prometheus", metavar="PATH", default=None,
                   help="write the totals as a node_exporter textfile-collector file (*.prom) "
                        "instead of printing the table")
    p.add_argument("--policy", metavar="PATH", default=None,
                   help="policy file whose paths.decision_log is read (default: as a launch)")
    p.set_defaults(func=report)


def report(args) -> int:
    since = parse_since(args.since) if args.since else None
    path = Path(args.log) if args.log else _default_log(args.policy)
    if not path.exists():
        where = "--log" if args.log else "paths.decision_log"
        raise UsageError(f"no decision log at {path} ({where}): no launch has written one yet, "
                         f"or it is elsewhere; give --log PATH")
    if path.is_dir():
        raise UsageError(f"decision log {path} is a directory; give --log the .jsonl file")
    try:
        records, bad = read_log(path)
    except OSError as exc:
        raise UsageError(f"cannot read decision log {path} ({exc.strerror}); run as a user "
                         f"who may read it, or give --log PATH") from None
    kept = list(iter_since(records, since))
    summary = summarize(kept, args.by)
    if args.prometheus:
        write_textfile(Path(args.prometheus), prometheus(summarize(kept, "strategy")))
        return 0
    print(render(summary, kept, path=str(path), since=args.since, bad=bad, by=args.by))
    return 0


def _default_log(policy_path: str | None) -> Path:
    from smartlaunch.launch.decision_log import log_path
    from smartlaunch.policy.load import load_policy
    return log_path(load_policy(policy_path, environ=os.environ), os.environ)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """'7d' / '24h' / '90m' before now, or an ISO date or date-time (local time unless it
    says otherwise); UsageError naming the forms otherwise."""
    now = now or datetime.now().astimezone()
    m = _AGO.match(text.strip())
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return now - timedelta(**{_UNITS[unit]: n})
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since {text!r} is not a date or an age; give 2026-11-01, "
                         f"2026-11-01T08:00, 7d, 24h or 90m") from None
    return t if t.tzinfo is not None else t.astimezone()


@dataclass
class Row:
    launches: int = 0
    failed: int = 0
    gpu_s: float = 0.0
    saved_s: float = 0.0          # torchrun's GPU-seconds - ours, where torchrun's was measured
    baseline: int = 0             # launches with a measured torchrun figure
    no_baseline: int = 0
    mispredicted: int = 0

    def add(self, rec: dict) -> None:
        self.launches += 1
        self.failed += rec.get("exit_code") not in (0, None)
        used = _num(rec.get("gpu_s")) or 0.0
        self.gpu_s += used
        theirs = _num((rec.get("torchrun") or {}).get("gpu_s"))
        if theirs is None:
            self.no_baseline += 1
        else:
            self.baseline += 1
            self.saved_s += theirs - used
        self.mispredicted += mispredicted(rec) is not None


def summarize(records: list[dict], by: str) -> dict[str, Row]:
    """Row per group (sorted by name), plus "total"."""
    rows: dict[str, Row] = {}
    total = Row()
    for rec in records:
        rows.setdefault(_group(rec, by), Row()).add(rec)
        total.add(rec)
    return {**dict(sorted(rows.items())), "total": total}


def _group(rec: dict, by: str) -> str:
    if by == "strategy":
        return str((rec.get("decided") or {}).get("strategy") or "?")
    return str(rec.get(by) or "?")


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3f}"


def render(summary: dict[str, Row], records: list[dict], *, path: str, since: str | None,
           bad: int, by: str) -> str:
    total = summary["total"]
    span = f" since {since}" if since else ""
    head = f"smartlaunch decisions in {path}{span}: {total.launches} launch" + \
        ("es" if total.launches != 1 else "")
    if bad:
        head += f" ({bad} line{'s' if bad != 1 else ''} not readable, skipped)"
    cols = (by, "launches", "failed", "GPU-h used", "GPU-h saved", "measured", "no baseline",
            "mispredicted")
    width = max([len(cols[0]), *(len(k) for k in summary)]) + 2
    lines = [head, "", f"{cols[0]:<{width}}" + "".join(f"{c:>13}" for c in cols[1:])]
    for name, r in summary.items():
        saved = _hours(r.saved_s) if r.baseline else "-"
        lines.append(f"{name:<{width}}{r.launches:>13}{r.failed:>13}{_hours(r.gpu_s):>13}"
                     f"{saved:>13}{r.baseline:>13}{r.no_baseline:>13}{r.mispredicted:>13}")
    lines.append("")
    if total.baseline:
        verb = "saved" if total.saved_s >= 0 else "lost"
        lines.append(f"GPU-hours {verb} against torchrun: {abs(total.saved_s) / 3600:.3f}, over "
                     f"the {total.baseline} launch(es) whose torchrun rate was measured; "
                     f"{total.no_baseline} launch(es) had no measured baseline and are not "
                     f"counted.")
    else:
        lines.append(f"GPU-hours saved against torchrun: unknown; none of the "
                     f"{total.no_baseline} launch(es) had a measured torchrun rate.")
    worst = sorted(((m, rec) for rec in records if (m := mispredicted(rec)) is not None),
                   key=lambda x: -x[0][0])[:WORST_SHOWN]
    if worst:
        lines.append(f"Mispredictions (measured speedup outside the prediction's band), worst "
                     f"{len(worst)} of {total.mispredicted}:")
        for (_, (name, p, m)), rec in worst:
            job = f" job {rec['job']}" if rec.get("job") else ""
            lines.append(f"  {rec.get('time', '?')} {rec.get('user', '?')}@{rec.get('host', '?')}"
                         f"{job}: {name} predicted {p:.2f}×, measured {m:.2f}× (band "
                         f"±{rec['band']:.0%}): {rec.get('command', '')}")
    else:
        lines.append("Mispredictions: none (no measured speedup outside its prediction's band).")
    return "\n".join(lines)


# --- Prometheus textfile ---------------------------------------------------------------------

def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def prometheus(summary: dict[str, Row]) -> str:
    """The totals in the text exposition format node_exporter's textfile collector reads."""
    total = summary["total"]
    per = {k: r for k, r in summary.items() if k != "total"}
    out: list[str] = []

    def metric(name: str, kind: str, text: str, values: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {value}" if isinstance(value, int) else
                   f"{name}{labels} {value:.3f}" for labels, value in values)

    metric("smartlaunch_launches_total", "counter",
           "Launches in the decision log, by the strategy decided.",
           [(f'{{strategy="{_label(k)}"}}', r.launches) for k, r in per.items()])
    metric("smartlaunch_failed_launches_total", "counter",
           "Launches that ended with a non-zero exit code, by the strategy decided.",
           [(f'{{strategy="{_label(k)}"}}', r.failed) for k, r in per.items()])
    metric("smartlaunch_gpu_seconds_total", "counter",
           "GPU-seconds held by launches (GPUs x run time).", [("", total.gpu_s)])
    metric("smartlaunch_gpu_seconds_saved_total", "gauge",
           "GPU-seconds saved against torchrun's launch of the same work (negative: lost), "
           "over launches whose torchrun rate was measured.", [("", total.saved_s)])
    metric("smartlaunch_launches_without_baseline_total", "counter",
           "Launches with no measured torchrun rate (not in the saved GPU-seconds).",
           [("", total.no_baseline)])
    metric("smartlaunch_mispredictions_total", "counter",
           "Launches whose measured speedup lay outside the prediction's uncertainty band.",
           [("", total.mispredicted)])
    metric("smartlaunch_report_timestamp_seconds", "gauge",
           "When this file was written (Unix time).", [("", round(time.time(), 3))])
    return "\n".join(out) + "\n"


def write_textfile(path: Path, text: str) -> None:
    """Replace `path` whole: a temp file in its directory (not *.prom, which the collector
    would read), then rename; UsageError naming the path when it cannot be written."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror}); give --prometheus a file in "
                         f"the collector's directory you may write") from None
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UsageError(f"cannot write {path} ({exc.strerror}); give --prometheus a file in "
                         f"the collector's directory you may write") from None
