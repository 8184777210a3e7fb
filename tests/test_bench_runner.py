"""The benchmark suite's record format (bench/_record.py) and its one entry point (bench/run.py,
`python -m bench`): records checked key by key, data files read by run, the committed data files
valid and explained, the runner appending what a benchmark measured with the machine, commit
and command line, and failures reported as exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import _record  # noqa: E402
import common  # noqa: E402
import regret  # noqa: E402
import run as runner  # noqa: E402

MACHINE = {"gpu": "NVIDIA H200", "gpus": 2, "cpus": 32}


def record(**over) -> dict:
    m = {"conditions": {"script": "mlp", "condition": "nvlink"},
         "figures": {"samples_per_s": 123.456789123, "choice": "ddp"},
         "detail": {"points": [[1024, 1.23456789e-05]]}}
    rec = _record.make("regret", "r1", m, date="2026-11-22", machine=MACHINE, commit="abc",
                       command="python -m bench run regret")
    return {**rec, **over}


# ---- the format -----------------------------------------------------------------------------
def test_a_record_keeps_six_digits_and_reads_back_as_one_level(tmp_path):
    rec = record()
    assert rec["figures"]["samples_per_s"] == 123.457
    assert rec["detail"]["points"] == [[1024, 1.23457e-05]]
    path = tmp_path / "d" / "regret.jsonl"
    assert _record.append(path, [rec, record(run="r2")]) == 2
    assert [r["run"] for r in _record.read(path)] == ["r1", "r2"]
    flat = common.read_jsonl(path, ["r2"])
    assert len(flat) == 1 and flat[0]["ok"] is True and flat[0]["machine"] == "2xH200"
    assert flat[0]["script"] == "mlp" and flat[0]["points"] == [[1024, 1.23457e-05]]


@pytest.mark.parametrize("change,word", [
    (lambda r: r.pop("commit"), "missing commit"),
    (lambda r: r.update(date="22/11/2026"), "date"),
    (lambda r: r.update(machine={"gpu": None, "gpus": 2, "cpus": 4}), "machine"),
    (lambda r: r["figures"].update(curve=[1, 2]), "figures.curve"),
    (lambda r: r.update(speedup=1.5), "unknown key(s) speedup"),
    (lambda r: r.update(run="a run; rm -rf"), "run 'a run; rm -rf'"),
    (lambda r: r.update(error=3), "error must be a string"),
])
def test_a_bad_record_is_refused_naming_the_key(change, word):
    rec = record()
    change(rec)
    with pytest.raises(_record.RecordError, match=word.replace("(", r"\(").replace(")", r"\)")):
        _record.check(rec, "x")


def test_read_names_the_line_that_is_not_a_record_and_selects_runs_by_prefix(tmp_path):
    path = tmp_path / "d.jsonl"
    _record.append(path, [record(run="heldout-1"), record(run="heldout-2"), record(run="held")])
    assert [r["run"] for r in _record.read(path, runs=["heldout"])] == ["heldout-1", "heldout-2"]
    assert _record.read(path, bench="wait") == []
    with open(path, "a") as f:
        f.write('{"bench": "regret"}\n')
    with pytest.raises(_record.RecordError, match=r"d.jsonl:4: missing run"):
        _record.read(path)


def test_split_and_flatten_are_inverse_for_a_failed_measurement():
    flat = {"kind": "ddp", "script": "m", "condition": "host", "ok": False, "error": "timed out",
            "wall_s": 14.0, "cmd": ["a", "b"], "date": "2026-11-22", "machine": "2xH200"}
    m = _record.split(flat, ("kind", "script", "condition"))
    assert m["conditions"] == {"kind": "ddp", "script": "m", "condition": "host"}
    assert m["figures"] == {"wall_s": 14.0} and m["detail"] == {"cmd": ["a", "b"]}
    rec = _record.make("regret", "r", m, date="2026-11-23", machine=MACHINE, commit=None,
                       command="c")
    assert rec["date"] == "2026-11-22" and rec["error"] == "timed out"
    back = _record.flatten(rec)
    assert back["ok"] is False and back["error"] == "timed out" and back["cmd"] == ["a", "b"]


def test_regret_rows_from_a_data_file_equal_the_rows_from_its_raw_records(tmp_path):
    raw = [{"kind": "single", "script": "m", "condition": None, "ok": True, "samples_per_s": 100.0,
            "params": 20_000_000, "batch": 64, "cmd": ["s.py", "--steps", "40"], "date": "2026-11-21",
            "time": "2026-11-22T01:00:00", "machine": "2xH200"},
           {"kind": "ddp", "script": "m", "condition": "host", "ok": True, "samples_per_s": 150.0,
            "time": "2026-11-22T01:01:00"},
           {"kind": "smartlaunch", "script": "m", "condition": "host", "ok": True, "wall_s": 9.0,
            "choice": "ddp", "nproc_per_node": 2, "predicted_speedup": 1.4, "reasons": ["why"],
            "candidates": [{"strategy": "ddp", "gpus": [0, 1], "speedup": 1.4, "chosen": True,
                            "reason": "DDP×2 (all-reduce 26.9 GB/s at the gradient size) …"}],
            "time": "2026-11-22T01:02:00"}]
    recs = [_record.make("regret", "s2", regret.measurement(r), date="2026-11-22",
                         machine=MACHINE, commit="c", command="c") for r in raw]
    _record.append(tmp_path / "regret.jsonl", recs)
    flat = common.read_jsonl(tmp_path / "regret.jsonl")
    assert flat[0]["steps"] == 40 and "cmd" not in flat[0] and "reasons" not in flat[2]
    assert flat[2]["candidates"][0]["busbw_GBps"] == 26.9
    rows = common.build_rows(flat)
    assert rows == common.build_rows(raw) and rows[0]["regret"]["smartlaunch"] == 0.0


# ---- the committed data ---------------------------------------------------------------------
def test_every_committed_data_file_is_a_registered_benchmarks_and_its_runs_are_explained():
    results = REPO / "bench" / "results"
    readme = (results / "README.md").read_text()
    files = sorted(results.glob("*.jsonl"))
    assert files
    for path in files:
        assert path.stem in runner.BY_NAME, path.name
        recs = _record.read(path)
        assert recs and {r["bench"] for r in recs} == {path.stem}, path.name
        for run in {r["run"] for r in recs}:
            assert f"`{run}`" in readme, (path.name, run)


def test_every_registered_benchmark_has_an_entry_and_a_smoke_or_a_reason():
    import importlib
    for b in runner.BENCHMARKS:
        mod = importlib.import_module(b.module)
        assert callable(getattr(mod, "bench", None)) or b.module == "job_overhead", b.name
        assert b.smoke is not None or b.needs, b.name


# ---- the runner -------------------------------------------------------------------------------
def bench_cli(*args, env=None, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_run_appends_one_record_with_the_machine_commit_and_command(clean_env, monkeypatch):
    monkeypatch.setenv("SMARTLAUNCH_FAKE_TOPOLOGY", "h200-nv18-pair")
    data = clean_env / "data dir" / "topology.jsonl"
    r = bench_cli("run", "--data", str(data), "--run", "t1", "--note", "a test", "topology",
                  "-n", "2", env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert f"1 record(s) of topology appended to {data} (run t1)" in r.stdout
    (rec,) = _record.read(data)
    assert rec["run"] == "t1" and rec["note"] == "a test"
    assert rec["command"] == "python -m bench run topology -n 2"
    assert rec["machine"]["cpus"] == os.cpu_count()
    assert rec["commit"] is None or rec["commit"].split("+")[0].isalnum()
    assert rec["conditions"]["calls"] == 2 and rec["figures"]["gpus"] == 2
    assert rec["figures"]["median_s"] >= 0
    shown = bench_cli("show", "--data", str(data), "topology")
    assert shown.returncode == 0 and "topology, run t1: 1 record(s)" in shown.stdout


def test_a_bad_name_or_run_is_one_line_and_exit_2(tmp_path):
    r = bench_cli("run", "regretx")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "unknown benchmark 'regretx' (did you mean regret?)" in r.stderr
    data = tmp_path / "w.jsonl"
    _record.append(data, [record(bench="wait")])
    r = bench_cli("show", "--data", str(data), "--run", "nope", "wait")
    assert r.returncode == 2 and "no run 'nope'" in r.stderr and "r1" in r.stderr
    # refused before the benchmark runs: nothing measured, nothing written
    r = bench_cli("run", "--data", str(tmp_path / "t.jsonl"), "--run", "my run", "topology")
    assert r.returncode == 2 and "--run 'my run'" in r.stderr and r.stdout == ""
    assert not (tmp_path / "t.jsonl").exists()
    (tmp_path / "a file").write_text("")          # a directory nobody, root included, can make
    r = bench_cli("run", "--data", str(tmp_path / "a file" / "t.jsonl"), "topology")
    assert r.returncode == 2 and "cannot append to the data file" in r.stderr and r.stdout == ""


def test_toy_figures_never_default_to_the_results():
    b = runner.BY_NAME["regret"]
    assert runner.data_path(b, [], None, False) == REPO / "bench" / "results" / "regret.jsonl"
    for argv, smoke in ((["--tiny"], False), (["--extra=--tiny"], False), ([], True)):
        path = runner.data_path(b, argv, None, smoke)
        assert REPO not in path.parents and path.name == "regret.jsonl"
    assert runner.data_path(b, ["--tiny"], "x.jsonl", True) == Path("x.jsonl")


def test_a_failed_measurement_is_kept_and_the_run_exits_1(tmp_path, monkeypatch, capsys):
    (tmp_path / "fake_bench.py").write_text(textwrap.dedent("""
        def bench(argv):
            return [{"conditions": {"n": 1}, "figures": {"x": 1.0}},
                    {"conditions": {"n": 2}, "figures": {}, "error": "rc=3: no GPU"}]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    b = runner.Benchmark("fake", "fake_bench", "a stand-in", ())
    data = tmp_path / "fake.jsonl"
    assert runner.run(b, ["--x"], data, label="f1") == 1
    assert "2 record(s) of fake" in capsys.readouterr().out
    recs = _record.read(data)
    assert [r.get("error") for r in recs] == [None, "rc=3: no GPU"]
    assert recs[1]["command"] == "python -m bench run fake --x"
    (tmp_path / "none_bench.py").write_text("def bench(argv):\n    return []\n")
    assert runner.run(runner.Benchmark("none", "none_bench", "", ()), [], data, "f2") == 1


def test_job_overhead_json_becomes_one_measurement_per_job():
    data = {"meta": {"nproc": 2}, "records": [
        {"kind": "torchrun", "script": "deep-mlp", "condition": "host", "rc": 0, "ok": True,
         "samples_per_s": 100.0, "chunks_ms": [1.0, 1.1], "round": 0},
        {"kind": "sl-ddp", "script": "deep-mlp", "condition": "host", "rc": 1, "ok": False,
         "error": "Traceback ...\nRuntimeError: boom\n", "round": 0}]}
    ok, bad = runner.job_overhead_records(data)
    assert ok["conditions"] == {"kind": "torchrun", "script": "deep-mlp", "condition": "host",
                                "nproc": 2, "round": 0}
    assert ok["detail"] == {"chunks_ms": [1.0, 1.1]} and "error" not in ok
    assert bad["error"] == "RuntimeError: boom"


def test_a_baton_session_becomes_one_measurement_with_its_ratio():
    pairs = [[5.0, 5.0 * (1.02, 1.03, 1.04)[i % 3], "torchrun"] for i in range(40)]
    data = {"meta": {"nproc": 2, "window_s": 0.3}, "records": [
        {"mode": "baton", "kind": "sl-ddp", "script": "deep-mlp", "condition": "host",
         "first": "sl-ddp", "pairs": pairs, "cpu_pairs": [[4.0, 4.0]] * 40, "ok": True,
         "world": {"torchrun": 2, "sl-ddp": 2}, "rc": {"torchrun": 0, "sl-ddp": 0}}]}
    (m,) = runner.job_overhead_records(data)
    assert m["conditions"] == {"kind": "sl-ddp", "script": "deep-mlp", "condition": "host",
                               "nproc": 2, "round": None, "mode": "baton", "first": "sl-ddp"}
    f = m["figures"]
    assert f["ratio_low"] < f["ratio"] < f["ratio_high"] and abs(f["ratio"] - 1 / 1.03) < 2e-3
    assert f["cpu_ratio"] == 1.0 and f["same_world"] is True and f["window_s"] == 0.3
    assert len(m["detail"]["pairs"]) == 40
