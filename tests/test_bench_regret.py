"""The regret harness: its arithmetic on synthetic records, the plan parser against the real
Plan schema, the report builder, child control (timeouts, failures), and one end-to-end run on
the CPU with a stand-in for smartlaunch."""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from smartlaunch.decide.plan import Candidate, Plan, Reason, Strategy
from smartlaunch.profile.api import ModelProfile, ProfileStatus

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import common  # noqa: E402
import regret  # noqa: E402


def rec(kind, script, cond=None, ok=True, **kw):
    return {"kind": kind, "script": script, "condition": cond, "ok": ok, "machine": "box",
            "date": "2026-11-21", **kw}


def plan_json(choice: str, speedup: float, params: int = 6_887_178) -> str:
    ddp = choice == "ddp"
    return Plan(
        strategy=Strategy.DDP if ddp else Strategy.SINGLE, device="cuda", gpus=(0, 1) if ddp else (0,),
        nproc_per_node=2 if ddp else 1, requested_max=2,
        candidates=(Candidate(Strategy.SINGLE, (0,), speedup=1.0, chosen=not ddp),
                    Candidate(Strategy.DDP, (0, 1), speedup=speedup, chosen=ddp, reason="r")),
        reasons=(Reason(f"DDP×2 predicted {speedup:.2f}×"),),
        profile=ModelProfile(ProfileStatus.OK, total_params=params, batch_size=64, cached=False),
    ).to_json()


# ---- arithmetic ---------------------------------------------------------------------------
@pytest.mark.parametrize("params,batch,want", [
    (258_378, 64, "single"), (25_000_000, 64, "ddp"), (25_000_000, 32, "single"),
    (10_000_000, 64, "single"), (10_000_001, 64, "ddp"), (None, 64, None)])
def test_seeds_rule(params, batch, want):
    assert common.seeds_rule(params, batch) == want


def test_regret_is_one_minus_chosen_over_best():
    assert common.regret("ddp", 100.0, 150.0) == 0.0
    assert common.regret("single", 100.0, 150.0) == pytest.approx(1 / 3)
    assert common.regret("ddp", 100.0, 40.0) == pytest.approx(0.6)
    assert common.regret("ddp", 0.0, 40.0) is None          # a failed measurement scores nothing
    assert common.regret(None, 100.0, 40.0) is None


def test_rows_score_all_three_policies():
    records = [
        rec("single", "mlp", samples_per_s=1000.0, params=6_887_178, batch=64),
        rec("ddp", "mlp", "nvlink", samples_per_s=1900.0),
        rec("ddp", "mlp", "sockets", samples_per_s=400.0),
        rec("smartlaunch", "mlp", "nvlink", choice="ddp", predicted_speedup=1.71, wall_s=9.0,
            warm_wall_s=1.5, profile_cached=False),
        rec("smartlaunch", "mlp", "sockets", choice="ddp", predicted_speedup=0.5, wall_s=2.0),
        rec("single", "gpt", samples_per_s=50.0, params=124_000_000, batch=8),
        rec("ddp", "gpt", "nvlink", samples_per_s=65.0),
        rec("smartlaunch", "gpt", "nvlink", ok=False, error="failed (rc=5): no plan"),
    ]
    rows = {(r["script"], r["condition"]): r for r in common.build_rows(records)}
    assert set(rows) == {("mlp", "nvlink"), ("mlp", "sockets"), ("gpt", "nvlink")}
    nv, so, gpt = rows["mlp", "nvlink"], rows["mlp", "sockets"], rows["gpt", "nvlink"]
    assert nv["measured_speedup"] == pytest.approx(1.9) and nv["oracle"] == "ddp"
    assert nv["regret"] == {"smartlaunch": 0.0, "always_ddp": 0.0, "seeds": pytest.approx(1 - 1 / 1.9)}
    assert nv["pred_error"] == pytest.approx((1.71 - 1.9) / 1.9)
    assert so["oracle"] == "single" and so["regret"]["smartlaunch"] == pytest.approx(0.6)
    assert so["regret"]["seeds"] == 0.0
    # batch 8 < 64: the seeds' rule stays single even at 124M parameters
    assert gpt["choice"]["seeds"] == "single" and gpt["regret"]["seeds"] == pytest.approx(1 - 50 / 65)
    assert gpt["regret"]["smartlaunch"] is None and "no plan" in gpt["errors"]["smartlaunch"]

    s = common.summarize(list(rows.values()), baseline_s=1.2)
    assert s["regret"]["smartlaunch"]["n"] == 2 and s["regret"]["smartlaunch"]["missing"] == 1
    assert s["regret"]["smartlaunch"]["max"] == pytest.approx(0.6)
    assert s["regret"]["always_ddp"]["mean"] == pytest.approx((0 + 0.6 + 0) / 3)
    assert s["pred_error_abs"]["max"] == pytest.approx(abs(0.5 - 0.4) / 0.4)
    assert s["decision_cold_s"]["n"] == 1 and s["decision_warm_s"]["max"] == 1.5
    assert s["decision_warm_over_import_s"] == pytest.approx(0.3)
    assert s["goals"]["max regret <= 8%"] is False
    assert s["goals"]["warm decision beyond torch's start-up <= 0.5 s"] is True


def test_a_later_failure_never_replaces_a_measurement():
    ok, bad = rec("ddp", "a", "host", samples_per_s=5.0), rec("ddp", "a", "host", ok=False, error="x")
    assert common.latest([ok, bad])["ddp", "a", "host"] is ok
    assert common.latest([bad, ok])["ddp", "a", "host"] is ok


# ---- parsers ------------------------------------------------------------------------------
def test_throughput_parser_takes_the_last_line_and_rejects_garbage():
    text = ("model=m params=10 batch=4\nthroughput: samples/s=1.0 per_rank=0.5 world=2 step_ms=3\n"
            "throughput: samples/s=2.5e3 per_rank=1250.0 world=2 step_ms=1.6\nbye\n")
    assert common.parse_throughput(text) == {"samples_per_s": 2500.0, "per_rank": 1250.0,
                                             "world": 2, "step_ms": 1.6}
    assert common.parse_throughput("throughput: samples/s=fast") is None
    assert common.parse_model_line(text) == {"params": 10, "batch": 4}


def test_plan_parser_reads_the_real_plan_schema_among_log_lines():
    text = "smartlaunch: profiling {script}...\n" + plan_json("ddp", 1.42) + "\ndone\n"
    s = common.plan_summary(common.parse_plan(text), nproc=2)
    assert s["choice"] == "ddp" and s["predicted_speedup"] == 1.42
    assert s["profile_params"] == 6_887_178 and s["profile_cached"] is False
    single = common.plan_summary(common.parse_plan(plan_json("single", 0.7)), nproc=2)
    assert single["choice"] == "single" and single["predicted_speedup"] == 0.7
    assert common.parse_plan("no json here {not: json}") is None


def test_child_env_has_only_the_condition_and_the_machine_requirements():
    parent = {"PATH": "/bin", "NCCL_P2P_DISABLE": "1", "RANK": "3", "PET_NPROC_PER_NODE": "4"}
    nv = common.child_env(parent, "nvlink")
    assert "NCCL_P2P_DISABLE" not in nv and "RANK" not in nv and "PET_NPROC_PER_NODE" not in nv
    assert nv["PATH"] == "/bin"
    for cond in (None, "nvlink", "host", "sockets"):
        env = common.child_env(parent, cond)
        assert all(env[k] == v for k, v in common.REQUIRED_ENV.items())
    sock = common.child_env({}, "sockets")
    assert sock["NCCL_P2P_DISABLE"] == "1" and sock["NCCL_SHM_DISABLE"] == "1"
    assert "NCCL_SHM_DISABLE" not in common.child_env({}, "host")


# ---- report -------------------------------------------------------------------------------
def test_report_builds_the_table_from_records(tmp_path):
    records = [rec("baseline", "-", wall_s=1.1),
               rec("single", "cnn-small-b128", samples_per_s=900.0, params=964_170, batch=128),
               rec("ddp", "cnn-small-b128", "nvlink", samples_per_s=1500.0),
               rec("ddp", "cnn-small-b128", "host", ok=False, error="timed out after 150 s"),
               rec("smartlaunch", "cnn-small-b128", "nvlink", choice="single",
                   predicted_speedup=1.2, wall_s=8.0, warm_wall_s=1.9)]
    (tmp_path / regret.RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records) + '{"cut')
    paths = regret.write_report(regret.load_records(tmp_path), tmp_path)
    md = paths[0].read_text()
    assert paths[0].name == "regret-2026-11-21-box.md"
    table = [ln for ln in md.splitlines() if ln.startswith("| cnn-small-b128")]
    assert len(table) == 2 and "| nvlink |" in table[0] and "| host |" in table[1]
    assert "40.0%" in table[0]                    # smartlaunch kept single: 1 - 900/1500
    assert "timed out after 150 s" in md
    data = json.loads(paths[1].read_text())
    assert data["summary"]["rows"] == 2 and data["summary"]["python_torch_import_s"] == 1.1


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    import plot
    rows = [{"script": "a", "condition": c, "predicted_speedup": p, "measured_speedup": m}
            for c, p, m in (("nvlink", 1.8, 1.9), ("host", 1.3, 1.5), ("sockets", 0.5, 0.4))]
    path = plot.plot_speedups(rows, tmp_path / "p.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- children -----------------------------------------------------------------------------
def test_timeout_ends_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    res = regret.run([sys.executable, "-c", code, str(pidfile)], dict(os.environ), timeout=2)
    assert res["timed_out"] and time.monotonic() - t0 < 20
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        assert state == "Z", "grandchild survived the timeout"


def fake_smartlaunch(tmp_path: Path) -> str:
    """Prints a real Plan: DDP (predicted 1.5x) unless NCCL_P2P_DISABLE is set, then single
    (predicted 0.6x) — so the test also sees that each condition's variables reach it."""
    script = tmp_path / "fake sl.py"
    script.write_text(
        "import os, sys\nsys.path.insert(0, %r)\n" % str(Path(__file__).parent) +
        "from test_bench_regret import plan_json\n"
        "if os.environ.get('NCCL_NVLS_ENABLE') != '0': sys.exit('required env missing')\n"
        "if not sys.argv[sys.argv.index('--policy') + 1].endswith('policy-throughput.yaml'):\n"
        "    sys.exit('the benchmark policy was not passed')\n"
        "p2p_off = os.environ.get('NCCL_P2P_DISABLE') == '1'\n"
        "print(plan_json('single', 0.6) if p2p_off else plan_json('ddp', 1.5))\n")
    return shlex.join([sys.executable, str(script)])


def test_failed_decision_is_recorded_not_raised(tmp_path):
    args = regret.parse_args(["--smartlaunch", shlex.join([sys.executable, "-c",
                              "import sys; print('smartlaunch: error: no GPU'); sys.exit(4)"])])
    r = regret.decide(common.entry("lstm-b64"), "host", args, timeout=30, warm=True)
    assert r["ok"] is False and "rc=4" in r["error"] and "no GPU" in r["error"]


@pytest.mark.slow
def test_end_to_end_on_cpu_then_resume(tmp_path, clean_env, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    argv = ["--scripts", "lstm-b64", "--conditions", "nvlink,host", "--steps", "2", "--warmup", "1",
            "--tiny", "--out", str(tmp_path / "out"), "--machine", "cpubox",
            "--smartlaunch", fake_smartlaunch(tmp_path)]
    assert regret.main(argv) == 0
    records = regret.load_records(tmp_path / "out")
    kinds = sorted((r["kind"], r["condition"] or "") for r in records)
    assert kinds == [("baseline", ""), ("ddp", "host"), ("ddp", "nvlink"), ("single", ""),
                     ("smartlaunch", "host"), ("smartlaunch", "nvlink")]
    assert all(r["ok"] for r in records), [r.get("error") for r in records]
    report = json.loads(next((tmp_path / "out").glob("regret-*-cpubox.json")).read_text())
    rows = {r["condition"]: r for r in report["rows"]}
    assert rows["nvlink"]["choice"]["smartlaunch"] == "ddp" and rows["nvlink"]["predicted_speedup"] == 1.5
    assert rows["host"]["choice"]["smartlaunch"] == "single"
    assert rows["nvlink"]["decision_warm_s"] > 0 and rows["host"]["decision_warm_s"] is None
    assert rows["host"]["single_sps"] == rows["nvlink"]["single_sps"]    # measured once
    # Everything recorded: a second invocation starts nothing.
    assert regret.main(argv) == 0
    assert len(regret.load_records(tmp_path / "out")) == len(records)


# ---- replaying the cost model ----------------------------------------------------------------
def replayable(script, cond, *, step_s, grad_bytes, busbw):
    pts = [[2 ** k, 30e-6 + 2 ** k / busbw] for k in range(10, 31, 2)]
    return rec("smartlaunch", script, cond, choice="ddp", predicted_speedup=1.5,
               predicted_by_trial=True,
               profile={"status": "ok", "total_params": grad_bytes // 4, "trainable_params":
                        grad_bytes // 4, "grad_bytes": grad_bytes, "batch_size": 64,
                        "step_time_s": step_s, "backward_s": 0.6 * step_s},
               comm={"world_size": 2, "backend": "nccl", "points": pts})


def test_rows_replay_the_cost_model_even_where_a_trial_decided():
    from smartlaunch.decide.cost import CostModel, predict_ddp
    from smartlaunch.profile.api import CommCurve, ModelProfile
    sl = replayable("m", "host", step_s=0.01, grad_bytes=100 << 20, busbw=27e9)
    rows = common.build_rows([rec("single", "m", samples_per_s=100.0),
                              rec("ddp", "m", "host", samples_per_s=150.0), sl])
    want = predict_ddp(ModelProfile.from_dict(sl["profile"]),
                       CommCurve.from_points(2, "nccl", sl["comm"]["points"]), 2, CostModel())
    assert rows[0]["model_speedup"] == pytest.approx(want.speedup)
    assert rows[0]["model_error"] == pytest.approx(want.speedup / 1.5 - 1)
    assert rows[0]["predicted_speedup"] == 1.5           # the plan's (trial) number is kept
    assert common.replay_model(rec("smartlaunch", "m", "host")) is None   # old records


def test_fit_recovers_constants_that_generated_the_measurements():
    import dataclasses
    import fit_cost
    from smartlaunch.decide.cost import CostModel
    truth = dataclasses.replace(CostModel(), compute_slowdown=1.1, ddp_overhead_s=0.5e-3,
                                contention_s_per_byte=20e-12)
    records = []
    for i, (step, grad, bw, cond) in enumerate([(0.002, 4 << 20, 280e9, "nvlink"),
                                                (0.03, 100 << 20, 280e9, "nvlink"),
                                                (0.02, 500 << 20, 280e9, "nvlink"),
                                                (0.02, 500 << 20, 27e9, "host"),
                                                (0.005, 80 << 20, 3e9, "sockets"),
                                                (0.013, 47 << 20, 27e9, "host")]):
        sl = replayable(f"s{i}", cond, step_s=step, grad_bytes=grad, busbw=bw)
        speed = common.replay_model(sl, truth)
        records += [rec("single", f"s{i}", samples_per_s=100.0),
                    rec("ddp", f"s{i}", cond, samples_per_s=100.0 * speed), sl]
    rows = fit_cost.rows_from(records)
    assert len(rows) == 6
    best, score = fit_cost.fit(rows)
    assert score < 0.01
    assert max(abs(e) for e in fit_cost.errors(rows, best)) < 0.02


def test_warm_decision_is_compared_with_its_own_invocations_import_floor():
    records = [rec("single", "m", samples_per_s=100.0), rec("ddp", "m", "nvlink", samples_per_s=150.0),
               rec("smartlaunch", "m", "nvlink", choice="ddp", predicted_speedup=1.5,
                   warm_wall_s=5.0, time="2026-11-22T02:00:00")]
    rows = common.build_rows(records)
    s = common.summarize(rows, 3.0, [("2026-11-22T01:00:00", 3.0), ("2026-11-22T01:59:00", 4.0),
                                     ("2026-11-22T03:00:00", 2.0)])
    assert s["decision_warm_over_import_s"] == pytest.approx(1.0)    # 5.0 - the 4.0 before it


# ---- several N on one machine (issue 17) -----------------------------------------------------
def test_nproc_takes_a_list_and_refuses_what_cannot_run(capsys):
    assert regret.parse_args(["--nproc", "4,2,3"]).nprocs == (2, 3, 4)
    assert regret.parse_args([]).nprocs == (2,)
    for bad in ("1,2", "two", ""):
        with pytest.raises(SystemExit) as e:
            regret.parse_args(["--nproc", bad])
        assert e.value.code == 2 and "--nproc 2,3,4" in capsys.readouterr().err


def several_n():
    return [
        rec("single", "mlp", samples_per_s=1000.0, params=6_887_178, batch=64),
        rec("ddp", "mlp", "nvlink", samples_per_s=1900.0, nproc=2),
        rec("ddp", "mlp", "nvlink", samples_per_s=2500.0, nproc=3),
        rec("ddp", "mlp", "nvlink", samples_per_s=2400.0, nproc=4),
        rec("smartlaunch", "mlp", "nvlink", choice="ddp", nproc_per_node=3, predicted_speedup=1.8,
            candidates=[{"strategy": "ddp", "gpus": [0, 1], "speedup": 1.8},
                        {"strategy": "ddp", "gpus": [0, 1, 3], "speedup": 2.6}]),
        rec("ddp", "mlp", "sockets", samples_per_s=1200.0, nproc=2),
        rec("ddp", "mlp", "sockets", samples_per_s=900.0, nproc=3),
        rec("ddp", "mlp", "sockets", ok=False, error="timed out after 150 s", nproc=4),
        rec("smartlaunch", "mlp", "sockets", choice="single", nproc_per_node=1),
    ]


def test_several_n_are_kept_apart_and_the_oracle_is_the_best_of_all():
    by = common.latest(several_n())
    assert by["ddp", "mlp", "nvlink"]["samples_per_s"] == 1900.0          # x2 keeps the old key
    assert by["ddp3", "mlp", "nvlink"]["samples_per_s"] == 2500.0
    assert by["ddp4", "mlp", "sockets"]["ok"] is False
    rows = {r["condition"]: r for r in common.build_rows(several_n())}
    nv, so = rows["nvlink"], rows["sockets"]
    assert nv["oracle_n"] == 3 and nv["ddp_sps_by_n"] == {2: 1900.0, 3: 2500.0, 4: 2400.0}
    assert nv["choice_n"] == {"smartlaunch": 3, "always_ddp": 4, "seeds": 1}
    assert nv["regret"]["smartlaunch"] == 0.0
    assert nv["regret"]["always_ddp"] == pytest.approx(1 - 2400 / 2500)    # torchrun x4
    assert nv["regret"]["seeds"] == pytest.approx(1 - 1000 / 2500)
    assert nv["measured_speedup"] == pytest.approx(1.9)                   # the legacy x2 column
    assert nv["pred_error_by_n"] == {2: pytest.approx(1.8 / 1.9 - 1), 3: pytest.approx(2.6 / 2.5 - 1)}
    # sockets: DDP x2 is best (1.2x); single costs 1 - 1000/1200; x4 failed, so always-DDP x4
    # has no measurement to score (counted as missing, never as zero regret)
    assert so["oracle_n"] == 2 and so["regret"]["smartlaunch"] == pytest.approx(1 - 1000 / 1200)
    assert so["regret"]["always_ddp"] is None and "timed out" in so["errors"]["ddp×4"]
    s = common.summarize(list(rows.values()))
    assert s["regret"]["always_ddp"]["missing"] == 1
    assert s["regret"]["smartlaunch"]["max"] == pytest.approx(1 - 1000 / 1200)
    assert s["goals"]["max regret <= 5% (several N)"] is False


def test_report_with_several_n_names_each_rate_and_the_oracle(tmp_path):
    paths = regret.write_report(several_n(), tmp_path)
    row = [ln for ln in paths[0].read_text().splitlines() if ln.startswith("| mlp") and "nvlink" in ln][0]
    assert "×2 1,900; ×3 2,500; ×4 2,400" in row and "| DDP×3 | DDP×3 | 0.0% | 4.0% |" in row


def test_run_measures_every_n_per_condition_then_resumes(tmp_path, monkeypatch):
    rates = {None: 1000.0, 2: 1900.0, 3: 2500.0, 4: 2400.0}

    def measure(kind, e, cond, args, timeout, nproc=None):
        return {"kind": kind, "script": e.id, "condition": cond, "ok": True, "wall_s": 1.0,
                "samples_per_s": rates[nproc], "step_ms": 1.0, "params": 7_000_000, "batch": 64,
                **({"nproc": nproc} if kind == "ddp" else {})}

    def decide(e, cond, args, timeout, warm):
        assert args.nprocs == (2, 3, 4)
        return {"kind": "smartlaunch", "script": e.id, "condition": cond, "ok": True,
                "wall_s": 2.0, "choice": "ddp", "nproc_per_node": 4, "predicted_speedup": 1.8}
    monkeypatch.setattr(regret, "measure", measure)
    monkeypatch.setattr(regret, "decide", decide)
    argv = ["--scripts", "lstm-b64", "--conditions", "nvlink,host", "--nproc", "2,3,4",
            "--out", str(tmp_path), "--machine", "box4"]
    assert regret.main(argv) == 0
    recs = [r for r in regret.load_records(tmp_path) if r["kind"] != "baseline"]
    assert sorted((r["kind"], r["condition"] or "", r.get("nproc") or 0) for r in recs) == sorted(
        [("single", "", 0)] + [(k, c, n) for c in ("nvlink", "host")
                               for k, n in (("ddp", 2), ("ddp", 3), ("ddp", 4), ("smartlaunch", 0))])
    report = json.loads(next(tmp_path.glob("regret-*-box4.json")).read_text())
    assert report["summary"]["regret"]["smartlaunch"]["max"] == pytest.approx(1 - 2400 / 2500)
    n = len(regret.load_records(tmp_path))
    assert regret.main(argv) == 0 and len(regret.load_records(tmp_path)) == n


def test_fit_rows_compare_a_curve_with_the_ddp_run_of_its_own_size():
    import fit_cost
    sl = replayable("m", "host", step_s=0.01, grad_bytes=100 << 20, busbw=27e9)
    sl["comm"]["world_size"] = 3
    rows = fit_cost.rows_from([rec("single", "m", samples_per_s=100.0),
                               rec("ddp", "m", "host", samples_per_s=150.0, nproc=2),
                               rec("ddp", "m", "host", samples_per_s=240.0, nproc=3), sl])
    assert [r["measured"] for r in rows] == [pytest.approx(2.4)]
