"""Issue 27's 4-GPU bench: the row plan, the budget, the scoring (allowed vs unconstrained best,
regret both ways, the DDP×4 ratio, the flags), the harness's window parts, and the whole
pipeline on the CPU (gloo ranks, real smartlaunch on a fake 4-GPU node, --tiny models)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "suite"))
import _harness  # noqa: E402
import multi_n_4gpu as mn4  # noqa: E402
import multi_n_4gpu_report as rep  # noqa: E402


def test_rows_parse_and_refuse_what_does_not_exist():
    assert mn4.parse_rows("1-3,2,12") == [1, 2, 3, 12]
    for bad, word in (("0-3", "rows are 1-12"), ("x", "write row numbers"), (",", "names no row"),
                      ("5-2", "rows are 1-12")):
        with pytest.raises(ValueError, match=word):
            mn4.parse_rows(bad)


def test_every_row_is_a_suite_script_and_a_required_shape():
    import common
    assert len(mn4.ROWS) == 12 and {c for _, c in mn4.ROWS} == {"host", "nvlink"}
    for s in mn4.SCRIPTS:
        e = common.entry(s)
        assert (REPO / e.script).exists() and s in mn4.WINDOWS


def test_plan_is_script_blocks_with_single_at_both_ends_and_skips_done_rows():
    tasks = mn4.plan([2, 1, 3])
    kinds = [(t.kind, t.script, t.condition, t.nproc, t.position) for t in tasks]
    gpt = kinds[:len(kinds) - 8]
    assert gpt[0] == ("single", "gpt-124m-b8", None, None, "start")
    assert gpt[-1] == ("single", "gpt-124m-b8", None, None, "end")
    assert [k[0] for k in gpt[1:8]] == ["ddp", "ddp", "ddp", "cold", "default", "launch", "ddp"]
    assert [k[2] for k in gpt[1:7]] == ["host"] * 6            # host first, as numbered
    assert [k[3] for k in gpt[1:4]] == [2, 3, 4]
    assert kinds[-8][1] == "embbag-b4096" and len(tasks) == 2 + 12 + 2 + 6
    assert [t.row for t in mn4.plan([1, 2, 3], done={1, 2}) if t.row] == [3] * 6


def test_done_rows_need_every_part():
    recs = [{"row": 1, "kind": k, "ok": True, **({"nproc": n} if n else {})}
            for k, n in (("ddp", 2), ("ddp", 3), ("ddp", 4), ("cold", None), ("default", None),
                         ("launch", None))]
    assert mn4.done_rows(recs) == {1}
    assert mn4.done_rows(recs[:-1]) == set()
    assert mn4.done_rows([*recs[:-1], {**recs[-1], "ok": False}]) == set()


def test_ddp_window_is_cut_to_the_target_at_the_last_step_seen():
    assert mn4.ddp_steps(400, None) == 400
    assert mn4.ddp_steps(400, 0.020) == 125                  # 2.5 s / 20 ms
    assert mn4.ddp_steps(400, 1.0) == mn4.MIN_STEPS           # never fewer than the floor
    assert mn4.ddp_steps(10, 1.0) == 10                       # nor more than the script's


def test_budget_starts_nothing_that_cannot_fit():
    now = [0.0]
    b = mn4.Budget(100.0, clock=lambda: now[0])
    assert b.fits("cold")                                     # 30 s estimate + reserve
    now[0] = 100.0 - mn4.RESERVE_S - 29.0
    assert not b.fits("cold") and b.fits("default")
    b.spent("default", 40.0)                                  # this call's own walls win
    assert not b.fits("default")
    assert b.timeout(120) <= b.left() and mn4.Budget(None).left() == float("inf")


def test_fake_topology_has_every_pair_on_nvlink(tmp_path):
    data = json.loads(mn4.fake_topology(4, tmp_path / "t.json").read_text())
    assert [g["index"] for g in data["gpus"]] == [0, 1, 2, 3]
    assert len({g["uuid"] for g in data["gpus"]}) == 4
    assert sorted((l["a"], l["b"]) for l in data["links"]) == [(0, 1), (0, 2), (0, 3), (1, 2),
                                                               (1, 3), (2, 3)]
    from smartlaunch.topology import discover
    topo = discover({**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": str(tmp_path / "t.json")})
    assert len(topo.gpus) == 4


# ---- the harness's window parts -------------------------------------------------------------
def test_chunk_ends_split_the_window_evenly():
    assert _harness.chunk_ends(100, 4) == [25, 50, 75, 100]
    assert _harness.chunk_ends(10, 3) == [3, 7, 10]
    assert _harness.chunk_ends(2, 8) == [1, 2] and _harness.chunk_ends(50, 0) == []


def test_a_suite_script_prints_its_window_parts():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "bench/suite/wide_mlp.py"), "--tiny",
                          "--warmup", "1", "--steps", "6", "--chunks", "3"],
                         capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    parts = rep.parse_chunks(out)
    assert parts is not None and len(parts) == 3 and all(p > 0 for p in parts)
    import common
    assert common.parse_throughput(out)["step_ms"] > 0      # the throughput line is still last


# ---- scoring ------------------------------------------------------------------------------
def test_allowed_best_follows_the_policy_and_regret_is_scored_both_ways():
    m = {1: 100.0, 2: 180.0, 3: 270.0, 4: 260.0}            # ×3 best, outside world sizes
    sizes = (1, 2, 4, 8)
    assert rep.allowed(m, 0.5, sizes) == {1: 100.0, 2: 180.0, 4: 260.0}
    assert rep.allowed(m, 0.7, sizes) == {1: 100.0, 2: 180.0}          # ×4 is 65% efficient
    s = rep.score(m, 4, 0.5, sizes)
    assert (s["allowed_best"], s["free_best"]) == (4, 3)
    assert s["regret_policy"] == 0.0 and s["regret_free"] == pytest.approx(1 - 260 / 270)
    s = rep.score(m, 1, 0.7, sizes)
    assert s["regret_policy"] == pytest.approx(1 - 100 / 180) and not s["outside_policy"]
    s = rep.score(m, 4, 0.7, sizes)                          # faster, but below the floor
    assert s["regret_policy"] == 0.0 and s["outside_policy"]
    assert rep.score({1: 100.0}, 1, 0.5, sizes)["regret_policy"] is None


def rec(kind, row=1, cond="host", call="c1", ok=True, **kw):
    return {"kind": kind, "script": "gpt-124m-b8", "condition": cond if kind != "single" else None,
            "row": row if kind != "single" else None, "call": call, "ok": ok, "machine": "box",
            "date": "2026-11-27", "wall_s": 10.0, **kw}


def plan_rec(kind, n, pred2, pred4, call="c1", **kw):
    cands = [{"strategy": "single", "gpus": [0], "speedup": 1.0},
             {"strategy": "ddp", "gpus": [0, 1], "speedup": pred2, "measured": True},
             {"strategy": "ddp", "gpus": [0, 1, 2, 3], "speedup": pred4}]
    return rec(kind, call=call, choice="single" if n == 1 else "ddp", nproc_per_node=n,
               candidates=cands, profile_batch=8, step_time_s=8 / 130.0, **kw)


def records():
    return [
        {"kind": "baseline", "script": "-", "condition": None, "call": "c1", "ok": True,
         "wall_s": 3.0},
        rec("single", samples_per_s=100.0, position="start", chunks_ms=[10.0, 10.1]),
        rec("ddp", nproc=2, samples_per_s=190.0),
        rec("ddp", nproc=3, samples_per_s=250.0),
        rec("ddp", nproc=4, samples_per_s=330.0, chunks_ms=[5.0, 5.8]),
        plan_rec("cold", 4, 1.9, 3.0, wall_s=25.0, startup_s=4.0,
                 timings={"since_process_start": 24.0, "profile": 8.0, "allreduce": 6.0,
                          "trials": 5.0, "trials_setup": 3.0}),
        plan_rec("default", 2, 1.9, 3.0, wall_s=5.0),
        rec("launch", samples_per_s=326.7, world=4),
        rec("single", samples_per_s=110.0, position="end"),
        # an earlier call's single of the same script must not be this row's reference
        rec("single", call="c0", samples_per_s=50.0, position="start"),
    ]


def test_build_scores_a_row_against_its_own_calls_singles():
    data = rep.build(records())
    (r,) = data["rows"]
    assert r["single_sps"] == 105.0 and r["single_drift"] == pytest.approx(0.1)
    assert r["measured_speedup"][4] == pytest.approx(330 / 105)
    t, d = r["scores"]["throughput"], r["scores"]["default"]
    assert (t["allowed_best"], t["n"], t["regret_policy"]) == (4, 4, 0.0)
    assert (d["allowed_best"], d["n"]) == (4, 2)          # ×4 is 79% efficient: allowed at 0.7
    assert d["regret_policy"] == pytest.approx(1 - 190 / 330)
    assert r["ddp4_ratio"] == pytest.approx(0.99)
    assert r["cold_beyond_s"] == pytest.approx(24.0 - 3.0 - 4.0)
    assert r["dry_run_sps"] == pytest.approx(130.0)
    flags = " ".join(r["flags"])
    assert "drifted +10.0%" in flags and "dry run's one-GPU rate 1.24×" in flags
    assert "+16.0% vs its first" in flags
    goals = data["summary"]["goals"]
    assert goals["throughput policy: regret under the policy ≤ 2% max"] is True
    assert goals["default policy: regret under the policy ≤ 2% max"] is False
    assert goals["cold decision ≤ 20 s beyond start-up (max)"] is True
    assert goals["the largest DDP×N under smartlaunch ÷ torchrun's ≥ 0.99 (geomean)"] is True


def test_superlinear_reference_is_flagged_and_a_failed_run_scores_nothing():
    rs = records()
    rs[2] = rec("ddp", nproc=2, samples_per_s=240.0)          # 2.29× on 2 GPUs
    rs[7] = rec("launch", ok=False, error="failed (rc=1): boom")
    (r,) = rep.build(rs)["rows"]
    assert any("DDP×2 2.29×" in f and "reference suspect" in f for f in r["flags"])
    assert r["ddp4_ratio"] is None and r["errors"] == {"launch": "failed (rc=1): boom"}
    md = rep.render(rep.build(rs))
    assert "reference suspect" in md and "row 1 gpt-124m-b8 / host / launch" in md
    assert "the largest DDP×N under smartlaunch ÷ torchrun's ≥ 0.99 (geomean): no data" in md


def test_report_cli_merges_two_calls_and_says_what_is_missing(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    other = [{**r, "call": "c2", "row": 7 if r.get("row") else None,
              "script": "bn-convnet-b64", "condition": "nvlink" if r.get("row") else None}
             for r in records()[1:9]]
    (b / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other) + "{cut")
    out = tmp_path / "README.md"
    assert rep.main([str(a), str(b / "records.jsonl"), "--out", str(out)]) == 0
    md = out.read_text()
    assert "| 1 | gpt-124m-b8 | host memory |" in md and "| 7 | bn-convnet-b64 | NVLink |" in md
    assert rep.main([str(tmp_path / "none")]) == 2
    assert "no records" in capsys.readouterr().err


# ---- the whole pipeline on the CPU --------------------------------------------------------------
@pytest.mark.slow
def test_one_row_end_to_end_on_cpu_with_a_fake_4_gpu_node(tmp_path, clean_env, monkeypatch):
    """Real torchrun gloo ranks ×1..×4, real smartlaunch decisions and launch on a fake 4-GPU
    node; then a second call skips the finished row and only writes the report."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "out"
    argv = ["--tiny", "--steps", "3", "--fake-gpus", "4", "--rows", "2", "--machine", "cpubox",
            "--call", "c1", "--out", str(out), "--tar", str(tmp_path / "o.tar.gz"),
            "--timeout", "240"]
    assert mn4.main(argv) == 0
    recs = rep.load([out])
    parts = sorted(rep.part(r) for r in recs)
    assert parts == ["baseline", "cold", "ddp2", "ddp3", "ddp4", "default", "launch", "single",
                     "single"], parts
    assert all(r["ok"] for r in recs), [r.get("error") for r in recs if not r["ok"]]
    launch = next(r for r in recs if r["kind"] == "launch")
    assert launch["world"] == 4 and "--strategy" in launch["cmd"]
    cold = next(r for r in recs if r["kind"] == "cold")
    assert cold["profile_cached"] is False and cold["timings"]["since_process_start"] > 0
    (row,) = rep.build(recs)["rows"]
    assert row["condition"] == "nvlink" and row["ddp4_ratio"] is not None
    assert set(row["measured_sps"]) == {1, 2, 3, 4}
    assert "| 2 | gpt-124m-b8 | NVLink |" in (out / "README.md").read_text()
    with tarfile.open(tmp_path / "o.tar.gz") as tf:
        assert "out/records.jsonl" in tf.getnames()
    assert mn4.main([*argv[:-6], "--call", "c2", "--out", str(out),
                     "--skip-done", str(out / "records.jsonl"), "--budget", "60"]) == 0
    assert len(rep.load([out])) == len(recs) + 1             # only c2's baseline


def test_decisions_rerun_first_alone_then_the_rows_references():
    tasks = mn4.plan([9], decisions=[7, 1])
    assert [(t.kind, t.row) for t in tasks[:4]] == [("cold", 1), ("default", 1), ("cold", 7),
                                                    ("default", 7)]
    assert all(t.nproc == 4 for t in tasks[:4]) and tasks[4].kind == "single"
    assert {t.row for t in tasks[4:] if t.row} == {9}
    assert mn4.parse_args(["--rows", "", "--decisions", "1-8", "--out", "x"]).row_list == []
