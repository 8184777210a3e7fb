"""Plan.to_dict() against the field tables of docs/plan-schema.md, both ways."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from helpers_decide import FakeComm, FakeTrial, dual_socket, nv_pair, pcie4, policy, profile, request
from smartlaunch.decide import EnvVar, NumaBinding
from helpers_decide import decide as _decide
from smartlaunch.decide.plan import SCHEMA_VERSION, Plan
from smartlaunch.decide.prepare import prepare
from smartlaunch.topology.api import cpu_only
from smartlaunch.strategies import REGISTRY

DOC = Path(__file__).resolve().parent.parent / "docs" / "plan-schema.md"

import functools  # noqa: E402

from helpers_decide import TEST_MODEL  # noqa: E402

decide = functools.partial(_decide, model=TEST_MODEL, units=REGISTRY)


def documented() -> dict[str, set[str]]:
    """'## Candidate (`candidates[]`)' -> {'Candidate': {field, ...}} from the markdown tables."""
    out, section = {}, None
    for line in DOC.read_text().splitlines():
        m = re.match(r"^## (\w+)", line)
        if m:
            section = m.group(1)
            out[section] = set()
        m = re.match(r"^\| `([A-Za-z0-9_]+)` \|", line)
        if m and section:
            out[section].add(m.group(1))
    return out


def plans():
    env = (EnvVar("NCCL_ALGO", "Tree", "policy launch.nccl.PHB (built-in)"),)
    numa = (NumaBinding(0, 0, 0, (0, 1, 2), "node", "numactl"),)
    ddp = decide(request(), nv_pair(), policy(), profile(params=163_000_000, step_ms=21),
                 comm_for=FakeComm(nv_pair()))
    yield dataclasses.replace(ddp, env=env, numa=numa)
    yield decide(request(max_gpus=2), dual_socket(), policy(), profile(), comm_for=FakeComm(
        dual_socket()), trial=FakeTrial({("single", 1): 10.0, ("ddp", 2): 17.0}))
    yield decide(request(variants=(("a",), ("b",))), pcie4(), policy(), None,
                 comm_for=FakeComm(pcie4()))
    yield decide(request(), cpu_only("no NVML"), policy(), None, comm_for=lambda g: None)
    packed = decide(request(variants=(("a",), ("b",))), pcie4(), policy(),
                    profile(params=6_900_000, step_ms=30), comm_for=FakeComm(pcie4()))
    yield prepare(packed, pcie4(), policy(), {}, units=REGISTRY, numactl="")


@pytest.mark.parametrize("plan", list(plans()), ids=lambda p: p.strategy.value)
def test_from_dict_reads_back_what_to_json_wrote(clean_env, plan):
    # A multi-node job's deciding node shares its plan as this JSON (pipeline_nodes.py).
    assert Plan.from_dict(json.loads(plan.to_json())) == plan


def test_the_doc_has_every_section():
    assert set(documented()) >= {"Plan", "Candidate", "Reason", "EnvVar", "NumaBinding", "Comm",
                                 "Topology", "VariantGroup"}


@pytest.mark.parametrize("plan", list(plans()), ids=lambda p: p.strategy.value)
def test_to_dict_matches_the_documented_fields(clean_env, plan):
    doc = documented()
    d = json.loads(plan.to_json())
    assert d["schema_version"] == SCHEMA_VERSION == 1
    assert set(d) == doc["Plan"]
    assert set(d["topology"]) == doc["Topology"]
    if d["comm"]:
        assert set(d["comm"]) == doc["Comm"]
    for c in d["candidates"]:
        assert set(c) == doc["Candidate"]
    for r in d["reasons"]:
        assert set(r) == doc["Reason"]
    for e in d["env"]:
        assert set(e) == doc["EnvVar"]
    for b in d["numa"]:
        assert set(b) == doc["NumaBinding"]
    for g in d["groups"]:
        assert set(g) == doc["VariantGroup"]
        assert all(set(b) == doc["NumaBinding"] for b in g["numa"])
        assert all(set(e) == doc["EnvVar"] for e in g["env"])


def test_the_plans_exercise_every_nested_section(clean_env):
    ds = [p.to_dict() for p in plans()]
    assert any(d["comm"] for d in ds) and any(d["env"] for d in ds) and any(d["numa"] for d in ds)
    assert any(c["measured"] for d in ds for c in d["candidates"])
    assert any(g["numa"] for d in ds for g in d["groups"])
