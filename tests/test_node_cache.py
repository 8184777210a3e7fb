"""The node cache: all-reduce curves the Slurm prolog measured as root (bench-comm --node-cache),
read by a user's launch when its own cache has none, only from files nobody else could write."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from helpers_common import REPO
from smartlaunch.policy.api import PathsPolicy, Policy
from smartlaunch.profile.api import CommCurve
from smartlaunch.profile.cache import load_node_comm, node_comm_key, store_node_comm
from smartlaunch.profile.comm import comm_curve
from smartlaunch.topology.fake import from_json

FIXTURE = "pcie-4gpu-x8"
NODE = from_json(FIXTURE, {})                                   # the prolog: every GPU
JOB = from_json(FIXTURE, {"CUDA_VISIBLE_DEVICES": "2,3"})       # a job given GPUs 2 and 3
CURVE = CommCurve.from_points(2, "gloo", [(65536, 1e-4), (131072, 1.5e-4), (262144, 2.5e-4)],
                              gpus=(2, 3))
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def policy(tmp_path) -> Policy:
    return Policy(paths=PathsPolicy(cache_dir=str(tmp_path / "own"),
                                    node_cache=str(tmp_path / "node")))


def test_the_jobs_gpus_find_the_prologs_curve_by_uuid(tmp_path):
    assert [g.uuid for g in JOB.gpus] == [NODE.gpu(2).uuid, NODE.gpu(3).uuid]
    assert node_comm_key(JOB, (0, 1), "gloo", {}) == node_comm_key(NODE, (2, 3), "gloo", {})
    assert node_comm_key(JOB, (0, 1), "gloo", {"NCCL_ALGO": "Tree"}) != \
        node_comm_key(NODE, (2, 3), "gloo", {})
    path = store_node_comm(str(tmp_path / "node"), NODE, CURVE, {})
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    got = load_node_comm(policy(tmp_path), JOB, (0, 1), "gloo", {}, need_bytes=262144)
    assert got is not None and got.cached and got.gpus == (0, 1)
    assert got.points == CURVE.points
    # Larger messages than the prolog measured: not this curve.
    assert load_node_comm(policy(tmp_path), JOB, (0, 1), "gloo", {}, need_bytes=1 << 20) is None


def test_comm_curve_reads_the_node_cache_before_measuring(tmp_path):
    store_node_comm(str(tmp_path / "node"), NODE, CURVE, {})
    got = comm_curve(JOB, (0, 1), policy(tmp_path), {}, max_bytes=262144)
    assert got.cached and got.points == CURVE.points      # measured on the CPU: not cached
    assert not (tmp_path / "node" / "comm").stat().st_mode & 0o022
    assert os.listdir(tmp_path / "node" / "comm") == [f"{node_comm_key(NODE, (2, 3), 'gloo', {})}.json"]


@needs_root
@pytest.mark.parametrize("tamper", ["file owned by 65534", "file group-writable",
                                    "directory owned by 65534", "directory world-writable",
                                    "a symlink"])
def test_a_curve_another_user_could_have_written_is_ignored(tmp_path, tamper):
    path = store_node_comm(str(tmp_path / "node"), NODE, CURVE, {})
    comm_dir = path.parent
    if tamper == "file owned by 65534":
        os.chown(path, 65534, 65534)
    elif tamper == "file group-writable":
        os.chmod(path, 0o664)
    elif tamper == "directory owned by 65534":
        os.chown(comm_dir, 65534, 65534)
    elif tamper == "directory world-writable":
        os.chmod(comm_dir, 0o777)
    else:
        real = tmp_path / "elsewhere.json"
        os.replace(path, real)
        os.symlink(real, path)
    assert load_node_comm(policy(tmp_path), JOB, (0, 1), "gloo", {}, need_bytes=0) is None


def test_a_damaged_or_stale_curve_is_ignored(tmp_path):
    path = store_node_comm(str(tmp_path / "node"), NODE, CURVE, {})
    data = json.loads(path.read_text())
    path.write_text(json.dumps(dict(data, measured_at=0)))
    assert load_node_comm(policy(tmp_path), JOB, (0, 1), "gloo", {}, need_bytes=0) is None
    path.write_text("{not json")
    assert load_node_comm(policy(tmp_path), JOB, (0, 1), "gloo", {}, need_bytes=0) is None
    missing = dataclasses.replace(policy(tmp_path), paths=PathsPolicy(node_cache="/nonexistent"))
    assert load_node_comm(missing, JOB, (0, 1), "gloo", {}, need_bytes=0) is None


def test_bench_comm_node_cache_is_what_a_jobs_launch_reads(tmp_path):
    # As the prolog runs it (every GPU of the node, --node-cache its state directory), on the
    # CPU with gloo for this fake node; then the job's view of GPUs 2,3 finds the curve.
    own = tmp_path / "root-cache.yaml"
    own.write_text(f"paths:\n  cache_dir: {tmp_path / 'rootcache'}\n")

    def bench(node):
        return subprocess.run(
            [sys.executable, "-m", "smartlaunch.node_cli", "bench-comm", "--no-pairs",
             "--max-mb", "1", "--gpus", "2,3", "--policy", str(own), "--node-cache", str(node)],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("NCCL_")},
                 "PYTHONPATH": str(REPO), "SMARTLAUNCH_FAKE_TOPOLOGY": FIXTURE},
            capture_output=True, text=True, timeout=180, cwd=tmp_path)
    # a state directory that is not there (a typo) is refused, not made
    r = bench(tmp_path / "no" / "such")
    assert r.returncode == 2 and not (tmp_path / "no").exists(), r.stderr
    assert r.stderr.strip().splitlines() == [
        f"smartlaunch-node: error: --node-cache {tmp_path / 'no' / 'such'} is not a directory; give the "
        "node's state directory (the Slurm prolog's), which must exist"], r.stderr
    (tmp_path / "node").mkdir()
    r = bench(tmp_path / "node")
    assert r.returncode == 0, r.stderr[-2000:]
    got = load_node_comm(policy(tmp_path), JOB, (0, 1), "gloo", {}, need_bytes=0)
    assert got is not None and got.gpus == (0, 1) and got.world_size == 2
