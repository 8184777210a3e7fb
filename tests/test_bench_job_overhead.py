"""bench/job_overhead.py --baton end to end on the CPU: torchrun's job and smartlaunch's (two
gloo ranks each) alive at once, stepping only while they hold the baton."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import job_overhead  # noqa: E402  (bench/ is not a package)
from bench import pairs  # noqa: E402  (importable once job_overhead put the repository first)


def baton(tmp_path, monkeypatch, pairs: int, *extra: str) -> tuple[int, dict, Path]:
    """One --baton session of the tiny deep MLP, torchrun against sl-ddp, two gloo ranks each:
    (exit code, its record, the report's path prefix)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "b"
    rc = job_overhead.main(["--tiny", "--baton", str(pairs), "--window-s", "0.05", *extra,
                            "--scripts", "deep-mlp", "--kinds", "torchrun", "sl-ddp",
                            "--nproc", "2", "--timeout", "240", "--out", str(out)])
    (rec,) = json.loads(Path(f"{out}.json").read_text())["records"]
    return rc, rec, out


@pytest.mark.slow
def test_a_baton_session_pairs_every_window_of_both_jobs(tmp_path, monkeypatch):
    rc, rec, out = baton(tmp_path, monkeypatch, 3)
    assert rc == 0 and rec["ok"], rec.get("error") or rec.get("logs")
    assert rec["world"] == {"torchrun": 2, "sl-ddp": 2} and rec["first"] == "sl-ddp"
    assert rec["rc"] == {"torchrun": 0, "sl-ddp": 0}
    # three pairs, in alternating order, each with both jobs' wall and CPU time a step
    assert [p[2] for p in rec["pairs"]] == ["torchrun", "sl-ddp", "torchrun"]
    assert all(a > 0 and b > 0 for a, b, _ in rec["pairs"])
    assert len(rec["cpu_pairs"]) == 3 and all(a > 0 and b > 0 for a, b in rec["cpu_pairs"])
    assert set(rec["launcher_cpu"]) == {"torchrun", "sl-ddp"}
    assert "| host | deep-mlp | sl-ddp | 3 |" in Path(f"{out}.md").read_text()


@pytest.mark.slow
def test_several_launches_of_each_launcher_give_one_ratio_each(tmp_path, monkeypatch):
    # two smartlaunch jobs beside each other (busy GPUs allowed, leases of their own) and two
    # torchrun jobs: every window of each launch pair paired, the interval across the pairs
    rc, rec, _ = baton(tmp_path, monkeypatch, 3, "--launches", "2")
    assert rc == 0 and rec["ok"], rec.get("error") or rec.get("logs")
    assert set(rec["rc"]) == {"torchrun#0", "torchrun#1", "sl-ddp#0", "sl-ddp#1"}
    assert set(rec["rc"].values()) == {0} and set(rec["world"].values()) == {2}
    assert [len(one) for one in rec["launch_pairs"]] == [3, 3] and len(rec["pairs"]) == 6
    (row,) = job_overhead.baton_rows([rec])
    assert row["launches"] == 2 and row["ratio"][1] < row["ratio"][0] < row["ratio"][2]
    assert set(row["launcher_cpu"]) == {"torchrun", "sl-ddp"}


def test_the_decided_launch_beside_its_twins_may_use_their_busy_gpus(tmp_path):
    # alone it runs under --policy as given; beside other jobs on its GPUs (--launches, or
    # torchrun's job first) under the same policy with busy GPUs allowed, one file for the
    # cold decision and every warm launch, so they share the decision's cache
    policy = tmp_path / "p.yaml"
    policy.write_text("decision:\n  min_efficiency: 0.5\n")
    alone = job_overhead.parse_args(["--tiny", "--policy", str(policy)])
    assert job_overhead.argv_of("sl-auto", "deep-mlp", alone).count(str(policy)) == 1
    beside = job_overhead.parse_args(["--tiny", "--launches", "2", "--policy", str(policy)])
    first, again = (job_overhead.argv_of("sl-auto", "deep-mlp", beside) for _ in range(2))
    used = first[first.index("--policy") + 1]
    assert used != str(policy) and again[again.index("--policy") + 1] == used
    import yaml
    assert yaml.safe_load(Path(used).read_text()) == {
        "decision": {"min_efficiency": 0.5, "avoid_busy_gpus": False}}
    Path(used).unlink()


@pytest.mark.slow
def test_launch_pairs_can_take_turns_over_which_job_starts_first(tmp_path, monkeypatch):
    # --alternate-first: smartlaunch's job first in pair 0, torchrun's in pair 1, each pair's
    # windows all paired, and the report gives the ratio of each start order
    rc, rec, out = baton(tmp_path, monkeypatch, 2, "--launches", "2", "--alternate-first")
    assert rc == 0 and rec["ok"], rec.get("error") or rec.get("logs")
    assert rec["first"] == "alternating" and rec["first_by_launch"] == ["sl-ddp", "torchrun"]
    assert [len(one) for one in rec["launch_pairs"]] == [2, 2]
    (row,) = job_overhead.baton_rows([rec])
    assert row["order"] is not None and all(x > 0 for x in row["order"])
    assert "first started: sl-ddp" in Path(f"{out}.md").read_text()


def test_alternating_the_start_order_needs_several_launch_pairs():
    with pytest.raises(SystemExit):
        job_overhead.parse_args(["--baton", "3", "--alternate-first"])
    with pytest.raises(SystemExit):
        job_overhead.parse_args(["--launches", "2", "--alternate-first", "--torchrun-first"])


def _stored_session(run: str, kind: str, per_pair: list[float], cpu: float = 1.0) -> dict:
    """A stored --baton record (bench/_record.py form) whose launch pairs read `per_pair`."""
    pairs = [[[r * 4.0, 4.0, "torchrun"], [r * 4.0, 4.0, kind]] for r in per_pair]
    return {"run": run, "machine": {"gpus": 1, "gpu": "NVIDIA H200", "cpus": 16},
            "conditions": {"mode": "baton", "condition": "nvlink", "script": "deep-mlp",
                           "nproc": 1, "kind": kind},
            "detail": {"launch_pairs": pairs,
                       "cpu_pairs": [[cpu, 1.0]] * (2 * len(per_pair))}}


def test_pooled_launch_pairs_span_sessions_and_stand_against_a_control():
    records = [_stored_session("a", "sl-auto", [0.98, 0.99]),
               _stored_session("b", "sl-auto", [0.97, 1.00], cpu=0.98),
               _stored_session("b", "torchrun-b", [0.99, 1.01, 1.00])]
    rows = {r["kind"]: r for r in pairs.pooled_rows(records, control="torchrun-b")}
    mine = rows["sl-auto"]
    assert mine["runs"] == ["a", "b"] and mine["pairs"] == 4 and mine["machine"] == "1xH200"
    assert mine["ratio"][0] == pytest.approx((0.98 * 0.99 * 0.97 * 1.00) ** 0.25)
    assert mine["ratio"][1] < mine["ratio"][0] < mine["ratio"][2]
    assert mine["cpu_ratio"][0] == pytest.approx((0.98 * 0.98) ** 0.25)
    ctrl = (0.99 * 1.01 * 1.00) ** (1 / 3)
    assert mine["vs_control"][0] == pytest.approx(mine["ratio"][0] / ctrl)
    assert mine["vs_control"][1] < mine["vs_control"][0] < mine["vs_control"][2]
    assert rows["torchrun-b"]["vs_control"] is None     # not against itself


def test_welch_needs_two_values_a_side_and_widens_with_the_spread():
    assert pairs.welch([1.0], [1.0, 1.1]) is None
    narrow = pairs.welch([0.99, 1.01, 1.0, 1.0], [1.0, 1.0, 0.99, 1.01])
    wide = pairs.welch([0.9, 1.1, 1.0, 1.0], [1.0, 1.0, 0.9, 1.1])
    assert narrow[0] == pytest.approx(1.0, abs=1e-9) and wide[0] == pytest.approx(1.0, abs=1e-9)
    assert wide[2] - wide[1] > narrow[2] - narrow[1] > 0


def test_pooled_rows_keep_machines_apart_unless_asked():
    other = _stored_session("c", "sl-auto", [1.0, 1.02])
    other["machine"] = {"gpus": 1, "gpu": "NVIDIA H100 80GB HBM3", "cpus": 16}
    records = [_stored_session("a", "sl-auto", [0.98, 0.99]), other]
    assert sorted(r["pairs"] for r in pairs.pooled_rows(records)) == [2, 2]
    (both,) = pairs.pooled_rows(records, by_machine=False)
    assert both["pairs"] == 4 and both["machine"] == "all" and both["runs"] == ["a", "c"]
