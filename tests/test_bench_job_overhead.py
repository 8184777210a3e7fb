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


@pytest.mark.slow
def test_a_baton_session_pairs_every_window_of_both_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "b"
    rc = job_overhead.main(["--tiny", "--baton", "3", "--window-s", "0.05", "--scripts",
                            "deep-mlp", "--kinds", "torchrun", "sl-ddp", "--nproc", "2",
                            "--timeout", "240", "--out", str(out)])
    (rec,) = json.loads(Path(f"{out}.json").read_text())["records"]
    assert rc == 0 and rec["ok"], rec.get("error") or rec.get("logs")
    assert rec["world"] == {"torchrun": 2, "sl-ddp": 2} and rec["first"] == "sl-ddp"
    assert rec["rc"] == {"torchrun": 0, "sl-ddp": 0}
    # three pairs, in alternating order, each with both jobs' wall and CPU time a step
    assert [p[2] for p in rec["pairs"]] == ["torchrun", "sl-ddp", "torchrun"]
    assert all(a > 0 and b > 0 for a, b, _ in rec["pairs"])
    assert len(rec["cpu_pairs"]) == 3 and all(a > 0 and b > 0 for a, b in rec["cpu_pairs"])
    assert set(rec["launcher_cpu"]) == {"torchrun", "sl-ddp"}
    assert "| host | deep-mlp | sl-ddp | 3 |" in Path(f"{out}.md").read_text()
