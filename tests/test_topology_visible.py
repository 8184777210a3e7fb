"""CUDA_VISIBLE_DEVICES and Slurm allocations: the pure resolver, then applied to fixtures."""
from __future__ import annotations

import re

import pytest

from smartlaunch.errors import SlurmError, UsageError
from smartlaunch.topology import discover
from smartlaunch.topology.fake import from_json
from smartlaunch.topology.visible import PhysicalGPU, resolve_visibility, resolve_visible

NODE = [
    PhysicalGPU(0, "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"),
    PhysicalGPU(1, "GPU-8937aa01-0000-0000-0000-000000000001", ("MIG-7e1c3f2a-1111-5b3c-9d0e-aaaaaaaaaaaa",
                                                                "MIG-7e1c3f2a-2222-5b3c-9d0e-bbbbbbbbbbbb")),
    PhysicalGPU(2, "GPU-1b2c3d4e-0000-0000-0000-000000000002"),
    PhysicalGPU(3, "GPU-ffee0011-0000-0000-0000-000000000003"),
]


@pytest.mark.parametrize("cvd, expected", [
    (None, [0, 1, 2, 3]),
    ("", []),
    ("2", [2]),
    ("3,1", [3, 1]),
    ("1, 2", [1, 2]),
    ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", [0]),
    ("GPU-8932f9,3", [0, 3]),                        # unique prefix
    ("gpu-1b2c", [2]),                               # we accept either case
    ("MIG-7e1c3f2a-2222-5b3c-9d0e-bbbbbbbbbbbb", [1]),
    ("MIG-GPU-ffee0011-0000-0000-0000-000000000003/1/0", [3]),   # pre-R470 MIG syntax
    ("0,9,1", [0]),                                  # CUDA stops at the first invalid entry
    ("1,GPU-deadbeef,2", [1]),
    ("2,2,3", [2]),                                  # a repeat ends the list too
    ("-1", []),
    ("0,-1,1", [0]),
])
def test_cuda_visible_devices(cvd, expected):
    env = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    assert resolve_visible(NODE, env) == expected


def test_tuples_are_accepted_for_reuse_by_other_layers():
    assert resolve_visible([(0, "GPU-a", ()), (1, "GPU-b", ())], {"CUDA_VISIBLE_DEVICES": "1"}) == [1]


@pytest.mark.parametrize("cvd", ["cuda:0", "gpu1", "0-3", "0,all", "GPU-xyz"])
def test_values_that_are_not_ids_raise_usage_error(cvd):
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES"):
        resolve_visible(NODE, {"CUDA_VISIBLE_DEVICES": cvd})


@pytest.mark.parametrize("cvd, why", [
    ("9", "'9' is out of range"),
    ("9,1", "'9' is out of range"),
    ("GPU-00000000-1111-2222-3333-444444444444", "matches no device"),
    ("GPU-893,2", "ambiguous prefix"),                # no first entry: CUDA would see nothing
    ("MIG-GPU-00000000-0000-0000-0000-000000000000/1/0", "not available"),
])
def test_naming_no_gpu_of_a_node_with_gpus_is_a_usage_error(cvd, why):
    # CUDA would see 0 devices: a typo, not the CPU (that is '', -1 or NoDevFiles, kept above)
    with pytest.raises(UsageError, match=f"CUDA_VISIBLE_DEVICES={re.escape(cvd)}: .*{why}.*"
                                         f"name GPUs of this node .*-1 or empty"):
        resolve_visible(NODE, {"CUDA_VISIBLE_DEVICES": cvd})
    assert resolve_visible([], {"CUDA_VISIBLE_DEVICES": cvd}) == []   # no GPU: nothing to name


def test_dropped_entries_explain_why():
    vis = resolve_visibility(NODE, {"CUDA_VISIBLE_DEVICES": "0,9,1"})
    (msg,) = vis.messages
    assert "'9' is out of range" in msg and "(9,1)" in msg
    vis = resolve_visibility(NODE, {"CUDA_VISIBLE_DEVICES": "1,GPU-893"})
    assert "ambiguous prefix (2 devices match)" in vis.messages[0]


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_GPUS": "2,3"}, [2, 3]),
    # No device cgroup: Slurm writes physical indices into CUDA_VISIBLE_DEVICES.
    ({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}, [2, 3]),
    ({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "3"}, [3]),
    # Device cgroup: CUDA sees only the allocation, Slurm renumbers from 0.
    ({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}, [2, 3]),
    ({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "1,0"}, [3, 1]),
    # The step's allocation wins over the job's.
    ({"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"}, [1]),
    # A GPU outside the allocation ends the list, as an invalid entry would.
    ({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,0"}, [2]),
    ({"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "GPU-1b2c"}, []),
])
def test_slurm_allocation(env, expected):
    assert resolve_visible(NODE, env) == expected


def test_slurm_with_device_cgroup_where_nvml_shows_only_the_allocation():
    # Inside the cgroup NVML enumerates the two allocated GPUs as 0 and 1.
    seen = NODE[:2]
    assert resolve_visible(seen, {"SLURM_JOB_GPUS": "5,7", "CUDA_VISIBLE_DEVICES": "0,1"}) == [0, 1]


def test_malformed_slurm_allocation_raises_slurm_error():
    with pytest.raises(SlurmError, match="SLURM_JOB_GPUS"):
        resolve_visible(NODE, {"SLURM_JOB_GPUS": "gpu:2"})


# ---- applied through the fake backend -------------------------------------------------------

def test_reordered_indices_renumber_gpus_and_links(clean_env, monkeypatch):
    monkeypatch.setenv("SMARTLAUNCH_FAKE_TOPOLOGY", "pcie-4gpu-x8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0,3")
    topo = discover()
    assert [(g.index, g.nvml_index) for g in topo.gpus] == [(0, 2), (1, 0), (2, 3)]
    # physical 2-0: NODE, 2-3: PIX, 0-3: NODE
    assert [(l.a, l.b, l.link_class) for l in topo.links] == [(0, 1, "NODE"), (0, 2, "PIX"), (1, 2, "NODE")]
    assert topo.link(0, 2).p2p is True
    # the x8 GPU (physical 2) is now CUDA device 0, and its finding says so
    (f,) = [f for f in topo.findings if f.code == "pcie_width_degraded"]
    assert f.gpu == 0 and f.message.startswith("GPU0 ")


def test_uuid_selection_through_the_backend():
    node = from_json("nvswitch-8gpu", {})
    u5, u1 = node.gpus[5].uuid, node.gpus[1].uuid
    topo = from_json("nvswitch-8gpu", {"CUDA_VISIBLE_DEVICES": f"{u5},{u1[:12]}"})
    assert [g.nvml_index for g in topo.gpus] == [5, 1]
    assert [g.numa_node for g in topo.gpus] == [1, 0]


def test_invalid_entry_becomes_a_warning_finding():
    topo = from_json("busy-gpu", {"CUDA_VISIBLE_DEVICES": "1,4,0"})
    assert [g.nvml_index for g in topo.gpus] == [1]
    warn = [f for f in topo.findings if f.code == "cuda_visible_devices"]
    assert len(warn) == 1 and "'4' is out of range" in warn[0].message


def test_empty_cuda_visible_devices_leaves_no_gpus_and_says_why():
    topo = from_json("h200-nv18-pair", {"CUDA_VISIBLE_DEVICES": ""})
    assert topo.gpus == () and topo.links == ()
    assert "hides all 2 GPU(s)" in topo.note
    assert topo.source.startswith("fake:")          # a GPU machine, not a CPU-only one


def test_mig_instance_selects_its_parent_gpu(tmp_path):
    import json
    from smartlaunch.topology.fake import FIXTURES
    d = json.loads((FIXTURES / "h200-nv18-pair.json").read_text())
    d["gpus"][1].update(mig_mode=True, mig_devices=["MIG-0d5e7f00-aaaa-bbbb-cccc-000000000001"])
    path = tmp_path / "mig.json"
    path.write_text(json.dumps(d))
    topo = from_json(str(path), {"CUDA_VISIBLE_DEVICES": "MIG-0d5e7f00"})
    assert [g.nvml_index for g in topo.gpus] == [1]
    assert {(f.severity.value, f.code) for f in topo.findings} == {("warning", "mig_enabled"),
                                                                   ("info", "mig_instance")}


def test_mixed_models_warn_about_cuda_device_order(tmp_path):
    import json
    from smartlaunch.topology.fake import FIXTURES
    d = json.loads((FIXTURES / "busy-gpu.json").read_text())
    d["gpus"][0]["name"] = "NVIDIA RTX A4000"
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(d))
    assert any(f.code == "cuda_device_order" for f in from_json(str(path), {}).findings)
    ordered = from_json(str(path), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert not any(f.code == "cuda_device_order" for f in ordered.findings)
