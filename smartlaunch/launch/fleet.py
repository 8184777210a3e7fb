"""`smartlaunch-node report`: the admins' fleet view of the decision log (launch/decision_log.py):
launches, failures, GPU-hours used and saved against torchrun (only where torchrun's figure was
measured) and mispredictions, per strategy, user or host; or, with `--prometheus PATH`, this
node's figures as a node_exporter textfile (docs/fleet.md)."""
from __future__ import annotations

import contextlib
import os
import re
import socket
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
                   help="only launches since a date (YYYY-MM-DD or YYYY-MM-DDTHH:MM) or for "
                        "the last 7d, 24h or 90m")
    p.add_argument("--by", choices=GROUPS, default="strategy",
                   help="one row per strategy (default), user or host")
    p.add_argument("--prometheus", metavar="PATH", default=None,
                   help="write this node's figures as a node_exporter textfile-collector file "
                        "(PATH must end in .prom) instead of printing the table")
    p.add_argument("--policy", metavar="PATH", default=None,
                   help="policy file whose paths.decision_log is read (default: as a launch)")
    p.set_defaults(func=report)


def report(args) -> int:
    since = parse_since(args.since) if args.since else None
    if args.prometheus and not args.prometheus.endswith(".prom"):
        raise UsageError(f"--prometheus {args.prometheus}: node_exporter's textfile collector "
                         f"reads only *.prom files; name it e.g. "
                         f"{os.path.join(os.path.dirname(args.prometheus), 'smartlaunch.prom')}")
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
        host = socket.gethostname()
        mine = [r for r in kept if r.get("host") == host]
        write_textfile(Path(args.prometheus),
                       prometheus(summarize(mine, "strategy"), host, window=args.since,
                                  window_s=(datetime.now().astimezone() - since).total_seconds()
                                  if since is not None else None))
        return 0
    print(render(summary, kept, path=str(path), since=args.since, bad=bad, by=args.by))
    return 0


def _default_log(policy_path: str | None) -> Path:
    from smartlaunch.launch.decision_log import log_path
    from smartlaunch.policy.load import load_policy
    return log_path(load_policy(policy_path, environ=os.environ), os.environ)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """'7d' / '24h' / '90m' before now, or an ISO date or date-time (local time unless it
    says otherwise); UsageError otherwise."""
    now = now or datetime.now().astimezone()
    m = _AGO.match(text.strip())
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return now - timedelta(**{_UNITS[unit]: n})
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since {text!r} is not a date or an age; give YYYY-MM-DD, "
                         f"YYYY-MM-DDTHH:MM, 7d, 24h or 90m") from None
    return t if t.tzinfo is not None else t.astimezone()


@dataclass
class Row:
    launches: int = 0
    failed: int = 0
    gpu_s: float = 0.0            # measuring included
    measure_s: float = 0.0        # of gpu_s: the measurements before the jobs
    saved_s: float = 0.0          # torchrun's GPU-seconds - ours, where torchrun's was measured
    gained_s: float = 0.0         # saved_s split by sign, each only growing with the log
    lost_s: float = 0.0
    baseline: int = 0             # launches with a measured torchrun figure
    no_baseline: int = 0
    mispredicted: int = 0

    def add(self, rec: dict) -> None:
        self.launches += 1
        self.failed += rec.get("exit_code") not in (0, None)
        used = _num(rec.get("gpu_s")) or 0.0
        self.gpu_s += used
        self.measure_s += _num(rec.get("measure_gpu_s")) or 0.0
        theirs = _num((rec.get("torchrun") or {}).get("gpu_s"))
        if theirs is None:
            self.no_baseline += 1
        else:
            self.baseline += 1
            self.saved_s += theirs - used
            self.gained_s += max(0.0, theirs - used)
            self.lost_s += max(0.0, used - theirs)
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
    if total.measure_s:
        lines.append(f"GPU-hours used include {total.measure_s / 3600:.3f} spent measuring before "
                     f"the jobs started (dry runs, all-reduce sweeps, trials).")
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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def prometheus(summary: dict[str, Row], host: str, *, window: str | None = None,
               window_s: float | None = None) -> str:
    """One node's figures in the textfile collector's format, each with a `host` label.
    window None: counters over the whole log (`*_total`); else gauges of the window."""
    total = summary["total"]
    per = {k: r for k, r in summary.items() if k != "total"}
    kind, suffix = ("counter", "_total") if window is None else ("gauge", "")
    over = "in the decision log" if window is None else f"since {window}"
    where = f'host="{_label(host)}"'
    out: list[str] = []

    def metric(name: str, text: str, values: list[tuple[str, float]], typed: str = "") -> None:
        full = name + ("" if typed else suffix)
        out.append(f"# HELP {full} {text}")
        out.append(f"# TYPE {full} {typed or kind}")
        out.extend(f"{full}{{{labels}}} {value}" if isinstance(value, int) else
                   f"{full}{{{labels}}} {value:.3f}" for labels, value in values)

    metric("smartlaunch_launches", f"Launches on this node {over}, by the strategy decided.",
           [(f'{where},strategy="{_label(k)}"', r.launches) for k, r in per.items()])
    metric("smartlaunch_failed_launches", f"Launches on this node {over} that ended with a "
           "non-zero exit code, by the strategy decided.",
           [(f'{where},strategy="{_label(k)}"', r.failed) for k, r in per.items()])
    metric("smartlaunch_gpu_seconds", f"GPU-seconds used by launches on this node {over}: "
           "the measurements before each job, then the GPUs held while it ran.",
           [(where, total.gpu_s)])
    metric("smartlaunch_measure_gpu_seconds", f"Of those, GPU-seconds spent measuring before "
           f"the jobs {over} (dry runs, all-reduce sweeps, trials).", [(where, total.measure_s)])
    metric("smartlaunch_gpu_seconds_saved", f"GPU-seconds saved against torchrun's launch of "
           f"the same work {over}, summed over the launches that saved (torchrun's rate "
           "measured).", [(where, total.gained_s)])
    metric("smartlaunch_gpu_seconds_lost", f"GPU-seconds lost against torchrun's launch of "
           f"the same work {over}, summed over the launches that lost (torchrun's rate "
           "measured; measuring counts as lost).", [(where, total.lost_s)])
    metric("smartlaunch_launches_without_baseline", f"Launches on this node {over} with no "
           "measured torchrun rate (in neither saved nor lost).", [(where, total.no_baseline)])
    metric("smartlaunch_mispredictions", f"Launches on this node {over} whose measured speedup "
           "lay outside the prediction's uncertainty band.", [(where, total.mispredicted)])
    if window_s is not None:
        metric("smartlaunch_report_window_seconds", f"The length of the window (--since "
               f"{window}), seconds.", [(where, round(window_s, 3))], typed="gauge")
    metric("smartlaunch_report_timestamp_seconds", "When this file was written (Unix time).",
           [(where, round(time.time(), 3))], typed="gauge")
    return "\n".join(out) + "\n"


def write_textfile(path: Path, text: str) -> None:
    """Replace `path` whole: a temp file in its directory (not *.prom, which the collector
    would read), then rename; UsageError naming the path when it cannot be written."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise UsageError(f"cannot write {path} ({exc.strerror}); give --prometheus a file in "
                         f"the collector's directory you may write") from None
