"""bench/comm_derive.py: its arithmetic on ideal ring curves, and one run with gloo ranks on
the CPU (which exercises the script, not the GPU figures it is for)."""
from __future__ import annotations

import json
import sys

import pytest

from helpers_common import REPO
from helpers_decide import curve

sys.path.insert(0, str(REPO / "bench"))
import comm_derive  # noqa: E402


def test_ideal_ring_curves_derive_exactly_and_scaling_the_latency_does_not():
    # t = latency + 2(N-1)/N x S / busbw with one busbw and one latency for every N
    curves = {n: curve(n, 300e9, latency_s=40e-6, gpus=tuple(range(n))) for n in (2, 3, 4)}
    res = comm_derive.analyse(curves, curves[4])
    for name in ("from_largest", "from_pair"):
        for n, e in res[name].items():
            assert e["max_abs_size"] < 1e-9 and e["max_abs_grad"] < 1e-9, (name, n)
    assert sorted(res["from_largest"]) == [2, 3] and sorted(res["from_pair"]) == [3, 4]
    # scaling every second by 2(N-1)/N shrinks the pair's latency to 2/3: small sizes off
    small = res["scaled"][2]["by_size"][str(1 << 10)]
    assert small == pytest.approx(2 / 3 - 1, rel=1e-3)
    assert res["repeat_noise"]["max_abs_size"] == 0.0
    text = comm_derive.report({"nvlink": res}, {"machine": "4xtest", "date": "d", "ns": "2,3,4",
                                                "conditions": "nvlink", "device": "cuda",
                                                "backend": "nccl", "links": "NV18",
                                                "wall_s": 1.0})
    assert "| from-largest | 2 | 0.0% |" in text and "| scaled | 2 | 33.3% |" in text


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_gloo_run_writes_its_three_files_in_one_directory(clean_env, tmp_path):
    out = tmp_path / "derive"
    assert comm_derive.main(["--device", "cpu", "--ns", "2,3", "--max-bytes", str(128 << 10),
                             "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["curves.json", "errors.json", "report.md"]
    errors = json.loads((out / "errors.json").read_text())["results"]["gloo"]
    assert set(errors["from_largest"]) == {"2"} and set(errors["from_pair"]) == {"3"}
    raw = json.loads((out / "curves.json").read_text())["raw"]["gloo"]
    assert set(raw["curves"]) == {"2", "3"} and raw["repeat"]["world_size"] == 3
    assert "| from-largest | 2 |" in (out / "report.md").read_text()
