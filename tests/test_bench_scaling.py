"""bench/scaling.py: the committed 4-GPU records replay to the figures their README quotes, and
one run with gloo ranks on the CPU (which exercises the harness's --scaling mode and the
records, not the GPU figures it is for)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers_common import REPO

sys.path.insert(0, str(REPO / "bench"))
import scaling  # noqa: E402

RESULTS = REPO / "bench" / "results" / "scaling-2026-11-27-4xH200"


def test_the_committed_fit_reproduces_its_constants_and_rows():
    fit = scaling.fit([RESULTS / "fit-records.jsonl"])
    saved = json.loads((RESULTS / "fit.json").read_text())
    assert fit["rows"] == saved["rows"] == 12
    assert fit["ddp_overhead_s"] == pytest.approx(saved["ddp_overhead_s"])
    assert fit["per_tensor_s"] == pytest.approx(saved["per_tensor_s"])
    rows = scaling.rows_from([RESULTS / "heldout-records.jsonl"])
    assert sorted({r["script"] for r in rows}) == ["bert-base-b32", "bn-convnet-b64",
                                                   "embbag-b4096", "lstm-b64"]
    assert sorted(r["n"] for r in rows) == [2, 2, 2, 2, 4, 4, 4, 4]
    assert all(r["profile"] is not None and r["curve"] is not None for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_gloo_run_measures_single_and_ddp_in_one_launch(clean_env, tmp_path):
    out = tmp_path / "sc"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "scaling.py"), "--tiny",
                        "--fake-world", "2", "--ns", "1,2", "--scripts", "cnn-small-b128@host",
                        "--skip-curves", "--rounds", "1", "--window-s", "0.1", "--out", str(out),
                        "--report-to", str(out / "report.md")],
                       cwd=REPO, capture_output=True, text=True, timeout=220)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in recs] == ["profile", "scaling"]
    sizes = recs[1]["result"]["sizes"]
    assert len(sizes["1"]["window_ms"]) == len(sizes["2"]["window_ms"]) == 1
    assert recs[1]["result"]["steps"]["1"] >= 10 and recs[1]["result"]["world"] == 2
    assert "| cnn-small-b128 | host | 2 |" in (out / "report.md").read_text()


NOW = REPO / "bench" / "results" / "scaling-2026-11-28-4xH200"


def _summary(report: str, constants: str) -> dict[int, tuple[str, str]]:
    out = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] == constants:
            out[int(cells[1])] = (cells[3], cells[4])
    return out


def test_the_host_slack_fit_and_its_held_out_rows_replay_to_the_readme(tmp_path):
    fit = scaling.fit([NOW / "fit-records.jsonl"])
    assert (fit["rows"], fit["ddp_overhead_s"], fit["per_tensor_s"]) == (12, 1.6e-3, 22e-6)
    assert all(r["profile"].host_slack_s is not None
               for r in scaling.rows_from([NOW / "heldout-records.jsonl"]))
    out = tmp_path / "r.md"
    scaling.report([NOW / "heldout-records.jsonl"], out)      # the shipped (frozen) constants
    assert _summary(out.read_text(), "shipped") == {2: ("5.0%", "10.9%"), 4: ("5.4%", "12.0%")}


def test_a_node_calibration_in_the_records_is_replayed_beside_the_shipped_constants(tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text((NOW / "heldout-records.jsonl").read_text() + json.dumps(
        {"kind": "calibration", "condition": "host", "record": {"constants": {
            "contention_s_per_byte": 8e-12, "ddp_overhead_s": 0.3e-3, "per_tensor_s": 19e-6}}})
        + "\n")
    out = tmp_path / "r.md"
    scaling.report([records], out)
    text = out.read_text()
    calibrated = _summary(text, "node calibration")
    assert set(calibrated) == {2, 4}                       # the host-memory rows only
    assert "| bn-convnet-b64 | host | 2 |" in text.split("node calibration")[1]
    assert "| bert-base-b32 | nvlink |" not in text.split("With this machine's")[1]
    assert calibrated != _summary(text, "shipped")
