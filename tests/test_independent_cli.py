"""`--each` / `--each-file`: the parsing helpers, and the whole CLI on a fake 2-GPU node."""
from __future__ import annotations

import json
import os
import random
import shlex
import subprocess

import pytest

import helpers_jobs as H
from helpers_common import fixture_path
from smartlaunch.errors import UsageError
from smartlaunch.launch.variants import parse_each, parse_each_file, split_words


def test_each_file_one_variant_per_line_with_comments(tmp_path):
    f = tmp_path / "sweep.txt"
    f.write_text("# learning-rate sweep\n--lr 0.1\n\n  --lr 0.01 --tag 'two words'  # inline\n   # indented comment\n")
    assert parse_each_file(str(f)) == [("--lr", "0.1"), ("--lr", "0.01", "--tag", "two words")]


@pytest.mark.parametrize("text, match", [
    ("# nothing\n\n", "has no variants"),
    ("--lr 0.1\n--tag 'open\n", r"line 2:.*No closing quotation"),
])
def test_each_file_errors_say_what_and_where(tmp_path, text, match):
    f = tmp_path / "sweep.txt"
    f.write_text(text)
    with pytest.raises(UsageError, match=match):
        parse_each_file(str(f))


def test_each_file_missing(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        parse_each_file(str(tmp_path / "nope.txt"))


def test_parse_each_bad_quote():
    assert parse_each("--a 1 --b 'x y'") == ("--a", "1", "--b", "x y")
    with pytest.raises(UsageError, match="No closing quotation"):
        parse_each("--a 'x")


def _shlex(line: str):
    try:
        return shlex.split(line, comments=True)
    except ValueError as exc:
        return f"ValueError: {exc}"


def _ours(line: str):
    try:
        return split_words(line)
    except ValueError as exc:
        return f"ValueError: {exc}"


@pytest.mark.parametrize("line", [
    "", "  ", "a", "a b", "--lr 0.1", "a#b c", "a #b", "#x", "'' b", '""', "a''", "'a'b\"c\"",
    "'a\\b'", '"a\\b"', '"a\\"b"', '"a\\x"', "a\\ b", "a\\", '"a\\', '"a', "'a",
    "x\\#y", "'#' \"#\"", "a\tb\nc", "a\\\nb", '"\\\n"', "--name 'two words' --x=\"y z\"",
])
def test_split_words_is_shlex_split_with_comments(line):
    assert _ours(line) == _shlex(line)


def test_split_words_agrees_with_shlex_on_generated_lines():
    # shlex is the specification; split_words is only there because shlex is quadratic
    rng = random.Random(20261123)
    alphabet = "ab ''\"\"\\\\##\t\n=-x"
    for _ in range(20_000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert _ours(line) == _shlex(line), repr(line)


def test_cli_each_runs_five_jobs_on_two_gpus_and_reports_exit_codes(clean_env):
    out = clean_env / "out"
    out.mkdir()
    script = H.write_script(clean_env, "job.py", H.JOB_SCRIPT)
    sweep = clean_env / "sweep.txt"
    sweep.write_text("# two more from a file\n--exit 0\n--exit 0 --sleep 0.1\n")
    env = H.python_env(SMARTLAUNCH_FAKE_TOPOLOGY=fixture_path("h200-nv18-pair"))
    topo = json.load(open(fixture_path("h200-nv18-pair")))
    r = subprocess.run(["smartlaunch", "--strategy", "independent", "--each", "--exit 0", "--each", "--exit 4",
                        "--each", "--exit 0 --rate 3", "--each-file", str(sweep), script, "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "4 of 5 succeeded" in r.stderr and "exit code 4" in r.stderr
    recs = [json.loads((out / f"job-{i}.json").read_text()) for i in range(5)]
    assert [x["argv"][2:] for x in recs] == [["--exit", "0"], ["--exit", "4"], ["--exit", "0", "--rate", "3"],
                                              ["--exit", "0"], ["--exit", "0", "--sleep", "0.1"]]
    uuids = {g["uuid"] for g in topo["gpus"]}
    assert {x["CUDA_VISIBLE_DEVICES"] for x in recs} == uuids
    for t in (x["start"] for x in recs):
        running = [x["CUDA_VISIBLE_DEVICES"] for x in recs if x["start"] <= t < x["end"]]
        assert len(running) <= 2 and len(set(running)) == len(running)
    # The CLI made the test's lease dir (a lease is its holder's record, gone once released).
    assert os.path.isdir(os.environ["SMARTLAUNCH_LEASE_DIR"])


def test_bench_reads_the_job_logs_smartlaunch_names(clean_env, capsys):
    """bench/independent_bench.py finds each job's log from the launcher's own stderr lines."""
    import sys
    sys.path.insert(0, str(H.REPO / "bench"))
    try:
        import independent_bench as ib
    finally:
        sys.path.remove(str(H.REPO / "bench"))
    from helpers_launch import run_independent
    out = clean_env / "out dir"
    out.mkdir()
    script = H.write_script(clean_env, "job.py", H.JOB_SCRIPT)
    assert run_independent(H.plan([["--rate", "5"], ["--rate", "6"]]), H.request(script, "--out", str(out)),
                           H.policy(clean_env / "with space"), H.fake_topology(2)) == 0
    logs = ib.job_logs(capsys.readouterr().err)
    assert sorted(logs) == [0, 1] and {w for w, _ in logs.values()} == {"GPU 0", "GPU 1"}
    rates = [ib.common.parse_throughput(open(logs[i][1]).read())["samples_per_s"] for i in (0, 1)]
    assert rates == [5.0, 6.0]
