"""`smartlaunch-node topo`, run as the installed console script."""
from __future__ import annotations

import json

from helpers_topology import run_node
from smartlaunch.errors import ExitCode
from smartlaunch.topology.api import Topology
from smartlaunch.topology.fake import from_json
from helpers_common import own_lines


def _matrix(text: str, title_line: int) -> list[list[str]]:
    lines = text.splitlines()
    rows = []
    for line in lines[title_line + 1:]:
        if not line.startswith("GPU"):
            break
        rows.append(line.split())
    return rows


def test_text_output_of_the_4gpu_box(clean_env):
    res = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "pcie-4gpu-x8"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    header = next(i for i, l in enumerate(lines) if "CPU Affinity" in l)
    assert lines[header].split() == ["GPU0", "GPU1", "GPU2", "GPU3", "CPU", "Affinity", "NUMA", "Affinity"]
    assert _matrix(res.stdout, header) == [
        ["GPU0", "X", "PIX", "NODE", "NODE", "0-31", "N/A"],
        ["GPU1", "PIX", "X", "NODE", "NODE", "0-31", "N/A"],
        ["GPU2", "NODE", "NODE", "X", "PIX", "0-31", "N/A"],
        ["GPU3", "NODE", "NODE", "PIX", "X", "0-31", "N/A"],
    ]
    p2p = lines.index("P2P read/write")
    assert _matrix(res.stdout, p2p + 1) == [
        ["GPU0", "X", "OK", "NS", "NS"], ["GPU1", "OK", "X", "NS", "NS"],
        ["GPU2", "NS", "NS", "X", "OK"], ["GPU3", "NS", "NS", "OK", "X"],
    ]
    gpu2 = next(l for l in lines if l.startswith("GPU2  NVIDIA"))
    assert "[free, 1 warning(s)]" in gpu2
    assert "warning: GPU2 PCIe link runs at x8 of x16" in res.stdout
    assert "PCIe Gen4 x8 (max Gen4 x16)" in res.stdout
    assert f"fingerprint {from_json('pcie-4gpu-x8', {}).fingerprint()}" in res.stdout


def test_text_output_numa_affinity_and_nvlink_p2p(clean_env):
    res = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "nvswitch-8gpu", "CUDA_VISIBLE_DEVICES": "0,5"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    header = next(i for i, l in enumerate(lines) if "CPU Affinity" in l)
    assert _matrix(res.stdout, header) == [["GPU0", "X", "NV18", "0-63", "0"],
                                           ["GPU1", "NV18", "X", "64-127", "1"]]
    assert _matrix(res.stdout, lines.index("P2P NVLink") + 1) == [["GPU0", "X", "OK"], ["GPU1", "OK", "X"]]
    assert "(nvml 5)" in next(l for l in lines if l.startswith("GPU1  NVIDIA H200"))


def test_busy_and_lost_gpus_are_shown(clean_env):
    busy = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "busy-gpu"})
    assert "[busy, healthy]" in busy.stdout and "pid 48213 bob 20480 MiB" in busy.stdout
    lost = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "lost-gpu"})
    assert lost.returncode == 0
    assert "[LOST]" in lost.stdout and "critical: GPU1 (00000000:0F:00.0) does not answer NVML" in lost.stdout


def test_json_output_is_the_dataclass_and_loads_back(clean_env, tmp_path):
    res = run_node(["topo", "--json"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "busy-gpu"})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    expected = from_json("busy-gpu", {})
    assert Topology.from_dict(data) == expected
    assert data["findings"] == [{"severity": "info", "code": "gpu_busy", "gpu": 1,
                                 "message": expected.findings[0].message}]
    # The dump is itself a fixture (the bug-report path).
    dump = tmp_path / "node.json"
    dump.write_text(res.stdout)
    again = run_node(["topo", "--json"], {"SMARTLAUNCH_FAKE_TOPOLOGY": str(dump)})
    assert json.loads(again.stdout)["gpus"] == data["gpus"]
    assert json.loads(again.stdout)["findings"] == data["findings"]


def test_all_ignores_cuda_visible_devices(clean_env):
    env = {"SMARTLAUNCH_FAKE_TOPOLOGY": "nvswitch-8gpu", "CUDA_VISIBLE_DEVICES": "3"}
    assert len(json.loads(run_node(["topo", "--json"], env).stdout)["gpus"]) == 1
    assert len(json.loads(run_node(["topo", "--all", "--json"], env).stdout)["gpus"]) == 8


def test_no_nvml_says_so_in_one_line_and_exits_no_gpu(clean_env):
    for args in (["topo"], ["topo", "--json"]):
        res = run_node(args)
        assert res.returncode == ExitCode.NO_GPU == 4
        assert res.stdout == ""
        (line,) = own_lines(res.stderr)
        assert line.startswith("smartlaunch-node: no NVIDIA driver/NVML on this machine (")
        assert line.endswith("); the launcher will run on the CPU")


def test_unknown_fixture_is_a_usage_error_with_a_suggestion(clean_env):
    res = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "h200-nv18-pai"})
    assert res.returncode == ExitCode.USAGE
    assert "did you mean 'h200-nv18-pair'?" in res.stderr
    assert "Traceback" not in res.stderr


def test_bad_cuda_visible_devices_is_a_usage_error(clean_env):
    res = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "busy-gpu", "CUDA_VISIBLE_DEVICES": "cuda:0"})
    assert res.returncode == ExitCode.USAGE
    (line,) = own_lines(res.stderr)
    assert "'cuda:0' is neither a GPU index nor a GPU/MIG UUID" in line


def test_empty_visibility_prints_the_reason(clean_env):
    res = run_node(["topo"], {"SMARTLAUNCH_FAKE_TOPOLOGY": "busy-gpu", "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0
    assert "CUDA_VISIBLE_DEVICES='' hides all 2 GPU(s) of this machine" in res.stdout


def test_topo_into_a_pipe_its_reader_closed_ends_quietly(clean_env):
    # `smartlaunch-node topo | head -1` with head gone first: no traceback, exit 128 + SIGPIPE.
    import os
    import subprocess
    import sys
    from pathlib import Path
    exe = Path(sys.executable).with_name("smartlaunch-node")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "smartlaunch.node_cli"]
    p = subprocess.Popen(cmd + ["topo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": "pcie-4gpu-x8"})
    p.stdout.close()
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 141, err[-2000:]
    assert "Traceback" not in err and "Error" not in err, err[-2000:]
