"""`smartlaunch-node report` (launch/fleet.py) on a generated decision log whose totals are worked
out by hand below, and its Prometheus textfile parsed back."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from helpers_common import REPO, own_lines
from smartlaunch.errors import UsageError
from smartlaunch.launch.decision_log import append_line, encode
from smartlaunch.launch.fleet import parse_since

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)


def rec(strategy, gpus, run_s, *, torchrun_s, user="alice", host="n1", exit_code=0,
        checked=(), band=0.25, days_ago=1):
    return {"format": 1, "time": (NOW - timedelta(days=days_ago)).isoformat(), "host": host,
            "user": user, "uid": 1000, "job": "7", "command": f"train.py --{strategy}",
            "decided": {"strategy": strategy, "gpus": list(range(gpus)), "world_size": gpus},
            "exit_code": exit_code, "run_s": run_s, "wall_s": run_s + 5,
            "gpu_s": gpus * run_s, "band": band, "checked": [list(c) for c in checked],
            "torchrun": {"gpus": 2, "gpu_s": torchrun_s, "basis": "test"}}


def fleet_log(path, host="n1"):
    """22 launches. By hand:
    10 single, 1 GPU × 360 s = 3,600 GPU-s = 1.000 GPU-h; torchrun measured each at DDP×2
       0.8× one GPU: 2 × 360 / 0.8 = 900 GPU-s, so 540 saved each = 5,400 s = 1.500 GPU-h.
       Two of them mispredicted (DDP×2 predicted 1.8×, measured 0.8×: |ln(0.8/1.8)| = 0.81 >
       ln 1.25), one within the band (1.0× vs 0.9×).
    6 ddp, 2 GPUs × 1,800 s = 21,600 GPU-s = 6.000 GPU-h; torchrun's own plan: 0 saved; one
       failed; one mispredicted (1.9× vs 1.2×: 0.46 > 0.22).
    4 independent, 4 GPUs × 900 s = 14,400 GPU-s = 4.000 GPU-h; no torchrun figure.
    2 single on the CPU (bob, host n2): 0 GPU-s, no torchrun figure; 30 days old.
    Total: 22 launches, 1 failed, 11.000 GPU-h used, 1.500 saved over 16, 6 without, 3
    mispredicted."""
    rows = []
    for i in range(10):
        checked = [("DDP×2", 1.8, 0.8)] if i < 2 else [("DDP×2", 1.0, 0.9)] if i == 2 else []
        rows.append(rec("single", 1, 360.0, torchrun_s=900.0, checked=checked, host=host))
    for i in range(6):
        rows.append(rec("ddp", 2, 1800.0, torchrun_s=3600.0, exit_code=1 if i == 0 else 0,
                        checked=[("DDP×2", 1.9, 1.2)] if i == 1 else [], host=host))
    for _ in range(4):
        rows.append(rec("independent", 4, 900.0, torchrun_s=None, host=host))
    for _ in range(2):
        rows.append(rec("single", 0, 50.0, torchrun_s=None, user="bob", host="n2", days_ago=30))
    for r in rows:
        append_line(path, encode(r))
    return path


def node(args, **kw):
    return subprocess.run([sys.executable, "-m", "smartlaunch.node_cli", *args],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120, **kw)


def table(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 8 and re.fullmatch(r"-?\d+", parts[1]):
            rows[parts[0]] = parts[1:]
    return rows


def test_report_totals_match_the_hand_count(clean_env):
    log = fleet_log(clean_env / "decisions.jsonl")
    r = node(["report", "--log", str(log)])
    assert r.returncode == 0, r.stderr
    rows = table(r.stdout)
    #                   launches failed used      saved     measured no-baseline mispredicted
    assert rows["total"] == ["22", "1", "11.000", "1.500", "16", "6", "3"]
    assert rows["single"] == ["12", "0", "1.000", "1.500", "10", "2", "2"]
    assert rows["ddp"] == ["6", "1", "6.000", "0.000", "6", "0", "1"]
    assert rows["independent"] == ["4", "0", "4.000", "-", "0", "4", "0"]
    assert "GPU-hours saved against torchrun: 1.500, over the 16 launch(es)" in r.stdout
    assert "6 launch(es) had no measured baseline" in r.stdout
    worst = [x for x in r.stdout.splitlines() if "predicted" in x and "measured" in x
             and x.startswith("  ")]
    assert len(worst) == 3 and "predicted 1.80×, measured 0.80×" in worst[0]
    assert "predicted 1.90×, measured 1.20×" in worst[2]


def test_report_by_user_and_since(clean_env):
    log = fleet_log(clean_env / "decisions.jsonl")
    rows = table(node(["report", "--log", str(log), "--by", "user"]).stdout)
    assert rows["alice"][:3] == ["20", "1", "11.000"] and rows["bob"][:3] == ["2", "0", "0.000"]
    rows = table(node(["report", "--log", str(log), "--by", "host",
                       "--since", (NOW - timedelta(days=7)).date().isoformat()]).stdout)
    assert set(rows) == {"n1", "total"} and rows["total"][0] == "20"


def test_since_forms():
    assert parse_since("7d", NOW) == NOW - timedelta(days=7)
    assert parse_since("24h", NOW) == NOW - timedelta(hours=24)
    assert parse_since("2026-11-01T08:00+00:00") == datetime(2026, 11, 1, 8, tzinfo=timezone.utc)
    with pytest.raises(UsageError, match="--since 'last week' is not a date or an age"):
        parse_since("last week")


@pytest.mark.parametrize("args, expected", [
    (["--log", "{tmp}/missing.jsonl"], "no decision log at {tmp}/missing.jsonl (--log)"),
    (["--log", "{tmp}/decisions.jsonl", "--since", "yesterday"], "--since 'yesterday' is not"),
    (["--log", "{tmp}", ], "is a directory"),
    (["--log", "{tmp}/decisions.jsonl", "--by", "gpu"], "argument --by: invalid choice"),
    # node_exporter's textfile collector reads *.prom only: a .txt would never be exported
    (["--log", "{tmp}/decisions.jsonl", "--prometheus", "{tmp}/x.txt"],
     "--prometheus {tmp}/x.txt: node_exporter's textfile collector reads only *.prom files; "
     "name it e.g. {tmp}/smartlaunch.prom"),
])
def test_bad_input_is_one_line_and_exit_2(clean_env, args, expected):
    fleet_log(clean_env / "decisions.jsonl")
    r = node(["report", *(a.format(tmp=clean_env) for a in args)])
    lines = own_lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert expected.format(tmp=clean_env) in lines[0]


SAMPLE = re.compile(r'^([a-z_]+)\{host="([^"]+)"(?:,strategy="([a-z]+)")?\} (-?[0-9.e+]+)$')


def parse_textfile(text: str) -> tuple[dict, dict]:
    """({(name, host, strategy): value}, {name: type}), every sample after its HELP and TYPE."""
    helped, typed, values = set(), {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, line
            name, host, label, value = m.groups()
            assert name in helped and name in typed, f"{name} before its HELP/TYPE"
            values[(name, host, label)] = float(value)
    return values, typed


def test_prometheus_textfile_has_this_nodes_counters(clean_env):
    # The log is shared with node n2 (bob's two CPU launches): each node exports its own
    # lines, so the sum over every node's exporter counts each launch once.
    me = socket.gethostname()
    log = fleet_log(clean_env / "decisions.jsonl", host=me)
    append_line(log, encode(rec("single", 1, 100.0, torchrun_s=50.0, host=me)))  # 50 lost
    out_dir = clean_env / "textfile"
    out_dir.mkdir()
    prom = out_dir / "smartlaunch.prom"
    prom.write_text("old\n")
    r = node(["report", "--log", str(log), "--prometheus", str(prom)])
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert os.listdir(out_dir) == ["smartlaunch.prom"]      # the temp file was renamed
    assert oct(prom.stat().st_mode & 0o777) == oct(0o644)
    values, typed = parse_textfile(prom.read_text())
    assert {h for _, h, _ in values} == {me}
    assert values[("smartlaunch_launches_total", me, "single")] == 11     # n2's 2 not here
    assert values[("smartlaunch_launches_total", me, "ddp")] == 6
    assert values[("smartlaunch_launches_total", me, "independent")] == 4
    assert values[("smartlaunch_failed_launches_total", me, "ddp")] == 1
    assert values[("smartlaunch_gpu_seconds_total", me, None)] == 39700
    assert values[("smartlaunch_gpu_seconds_saved_total", me, None)] == 5400
    assert values[("smartlaunch_gpu_seconds_lost_total", me, None)] == 50
    assert values[("smartlaunch_launches_without_baseline_total", me, None)] == 4
    assert values[("smartlaunch_mispredictions_total", me, None)] == 3
    # Counters only: every figure grows with the log (saved and lost are two, not a net).
    assert {k for n, k in typed.items() if n.endswith("_total")} == {"counter"}
    assert {n for n, k in typed.items() if k == "gauge"} == {"smartlaunch_report_timestamp_seconds"}


def test_prometheus_with_since_writes_gauges_without_total(clean_env):
    # A window's figures go down as launches leave it: gauges, not counters.
    me = socket.gethostname()
    log = fleet_log(clean_env / "decisions.jsonl", host=me)
    prom = clean_env / "smartlaunch.prom"
    since = (NOW - timedelta(days=7)).date().isoformat()
    r = node(["report", "--log", str(log), "--since", since, "--prometheus", str(prom)])
    assert r.returncode == 0, r.stderr
    values, typed = parse_textfile(prom.read_text())
    assert set(typed.values()) == {"gauge"} and not any(n.endswith("_total") for n in typed)
    assert values[("smartlaunch_launches", me, "single")] == 10
    assert values[("smartlaunch_gpu_seconds_saved", me, None)] == 5400
    assert values[("smartlaunch_report_window_seconds", me, None)] > 7 * 86400


def test_a_log_written_by_launches_reads_back(clean_env):
    # read_log's skip of bad lines is counted in the head line
    log = fleet_log(clean_env / "decisions.jsonl")
    with open(log, "a") as f:
        f.write("torn{\n")
    r = node(["report", "--log", str(log)])
    assert r.returncode == 0 and "(1 line not readable, skipped)" in r.stdout
    assert json.loads(log.read_text().splitlines()[0])["format"] == 1


def test_nan_huge_and_overlong_lines_do_not_poison_the_totals(clean_env):
    # Anyone who may append may write any line: each bad one is skipped, counted, said once.
    log = fleet_log(clean_env / "decisions.jsonl")
    clean = node(["report", "--log", str(log)])
    assert clean.returncode == 0, clean.stderr
    good = json.dumps(rec("ddp", 2, 100.0, torchrun_s=100.0))
    bad = [good.replace('"gpu_s": 200.0', '"gpu_s": NaN'),
           good.replace('"run_s": 100.0', '"run_s": 1e300'),
           good.replace('"gpu_s": 100.0', '"gpu_s": -5'),                   # torchrun's
           good.replace('"exit_code": 0', '"exit_code": "x"'),
           json.dumps(rec("ddp", 2, 100.0, torchrun_s=100.0, checked=[("DDP×2", 1e-300, 1e300)])),
           good[:-1] + ', "pad": "' + "x" * 9000 + '"}']                    # > MAX_LINE
    assert good not in bad
    with open(log, "a") as f:
        f.write("\n".join(bad) + "\n\n")                                   # a blank line: not bad
    r = node(["report", "--log", str(log)])
    assert r.returncode == 0, r.stderr
    assert table(r.stdout) == table(clean.stdout)
    assert r.stdout.count("skipped") == 1 and "(6 lines not readable, skipped)" in r.stdout
    # One good line more is counted: what is skipped is the bad lines, not what follows them.
    with open(log, "a") as f:
        f.write(good + "\n")
    assert table(node(["report", "--log", str(log)]).stdout)["ddp"][0] == "7"


def test_the_report_says_what_measuring_cost(clean_env):
    # gpu_s counts the measurements before the job (measure_gpu_s); the report says how much.
    log = clean_env / "decisions.jsonl"
    for measure in (360.0, 1440.0):
        r = rec("single", 1, 3600.0, torchrun_s=7200.0)
        append_line(log, encode(dict(r, gpu_s=r["gpu_s"] + measure, measure_gpu_s=measure)))
    out = node(["report", "--log", str(log)])
    assert out.returncode == 0, out.stderr
    #                 launches failed used (2 h + 0.5 h) saved (4 h - 2.5 h)
    assert table(out.stdout)["total"][:4] == ["2", "0", "2.500", "1.500"]
    assert "GPU-hours used include 0.500 spent measuring before the jobs started" in out.stdout
