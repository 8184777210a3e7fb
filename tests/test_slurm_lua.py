"""smartlaunch/slurm/scripts/job_submit.lua under a plain Lua interpreter with a stub `slurm` table.

The real-slurmctld test (test_slurm_cluster.py) shows the plugin loads and rejects; this one
covers every spelling of a GPU request quickly."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from helpers_slurm import HOOKS

LUA = next((shutil.which(n) for n in ("lua5.3", "lua5.4", "lua5.1", "lua") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(LUA is None, reason="no lua interpreter: apt-get install lua5.3")

NO_VAL, NO_VAL16 = 4294967294, 65534

HARNESS = r"""
local logged = {}
slurm = { SUCCESS = 0, ERROR = -1,
          log_user = function(fmt, ...) table.insert(logged, string.format(fmt, ...)) end,
          log_info = function(fmt, ...) end }
dofile(arg[1])
local cases = load("return " .. arg[2])()
for _, job in ipairs(cases) do
  logged = {}
  local rc = slurm_job_submit(job, {}, 1000)
  local n = smartlaunch_gpus_requested(job)
  io.write(string.format("%d\t%d\t%s\n", rc, n, logged[1] or ""))
end
"""


def lua_table(d: dict) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + "}"


def submit(tmp_path, jobs: list[dict]) -> list[tuple[int, int, str]]:
    harness = tmp_path / "harness.lua"
    harness.write_text(HARNESS)
    table = "{" + ", ".join(lua_table({"min_nodes": NO_VAL, "num_tasks": NO_VAL,
                                        "ntasks_per_node": NO_VAL16,
                                        "sockets_per_node": NO_VAL16, **j}) for j in jobs) + "}"
    out = subprocess.run([LUA, str(harness), str(HOOKS / "job_submit.lua"), table],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    rows = []
    for line in out.splitlines():
        rc, n, msg = line.split("\t")
        rows.append((int(rc), int(n), msg))
    return rows


@pytest.mark.parametrize("job, gpus", [
    ({"tres_per_job": "gres:gpu:9"}, 9),                        # --gpus=9 (22.05)
    ({"tres_per_job": "gres/gpu:9"}, 9),                        # --gpus=9 (23.02+)
    ({"tres_per_node": "gres:gpu:a100:9"}, 9),                  # --gres=gpu:a100:9
    ({"tres_per_node": "gres/gpu:3", "min_nodes": 4}, 12),      # 3 per node x 4 nodes
    ({"tres_per_task": "gres:gpu:1,cpu:4", "num_tasks": 10}, 10),
    ({"tres_per_task": "gres/gpu:2", "ntasks_per_node": 3, "min_nodes": 2}, 12),
    ({"tres_per_socket": "gres/gpu:5", "sockets_per_node": 2}, 10),
    ({"gres": "gpu:9"}, 9),                                     # Slurm < 21.08
    ({"tres_per_job": "gres:gpu:4,gres:gpu:a100:5"}, 9),
])
def test_rejects_every_spelling_above_the_cap(tmp_path, job, gpus):
    (rc, n, msg), = submit(tmp_path, [job])
    assert (rc, n) == (-1, gpus)
    assert f"asks for {gpus} GPUs" in msg and "the limit is 8 per job" in msg


@pytest.mark.parametrize("job, gpus", [
    ({}, 0),
    ({"tres_per_job": "gres:gpu:8"}, 8),
    ({"tres_per_node": "gres/gpu"}, 1),                         # --gres=gpu means one
    ({"tres_per_node": "gres:gpu:a100"}, 1),
    ({"tres_per_node": "gres:gpumem:80G,gres:mps:100"}, 0),     # not GPU counts
    ({"tres_per_task": "cpu:4", "num_tasks": 64}, 0),
    ({"tres_per_node": "gres:gpu:2", "min_nodes": 4}, 8),
])
def test_accepts_at_or_below_the_cap(tmp_path, job, gpus):
    (rc, n, msg), = submit(tmp_path, [job])
    assert (rc, n, msg) == (0, gpus, "")
