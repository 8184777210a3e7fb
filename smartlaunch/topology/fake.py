"""The fake backend: a JSON fixture (Topology.to_dict) describing a whole physical node. Visibility
is applied by the same code as for NVML; findings are recomputed from the readings (fixture findings
with other codes are kept). CPU lists are taken as written."""
from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from pathlib import Path
from typing import Mapping

from smartlaunch.errors import UsageError
from smartlaunch.topology import health
from smartlaunch.topology.api import GPU, GPUProcess, Link, Topology
from smartlaunch.vocab import UNKNOWN_LINK
from smartlaunch.topology.visible import (
    PhysicalGPU, resolve_visibility, visibility_findings, visibility_note,
)

ENV_VAR = "SMARTLAUNCH_FAKE_TOPOLOGY"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Produced by health.assess / visibility_findings: recomputed on load.
COMPUTED_CODES = frozenset({
    "gpu_lost", "ecc_uncorrected", "ecc_uncorrected_history", "row_remap_failed",
    "row_remap_pending", "retired_pages", "pcie_width_degraded", "pcie_gen_degraded",
    "temperature_high", "power_at_limit", "clocks_throttled", "mig_enabled", "gpu_busy",
    "p2p_unavailable", "p2p_nvlink_unavailable", "cuda_visible_devices", "mig_instance",
    "cuda_device_order",
})


def fixture_names() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


def fixture_file(name_or_path: str) -> Path:
    """A fixture name ('h200-nv18-pair') from the fixtures folder, or a path to a JSON file."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        raise UsageError(f"{ENV_VAR}={name_or_path} is a directory; name a JSON topology file "
                         f"in it or a fixture ({', '.join(fixture_names())})")
    if path.suffix == ".json" or "/" in name_or_path:
        if path.is_file():
            return path
        if (FIXTURES / path.name).is_file() and "/" not in name_or_path:
            return FIXTURES / path.name
        raise UsageError(f"{ENV_VAR}={name_or_path}: no such file; give a fixture name "
                         f"({', '.join(fixture_names())}) or the path of a JSON topology")
    path = FIXTURES / f"{name_or_path}.json"
    if path.is_file():
        return path
    close = difflib.get_close_matches(name_or_path, fixture_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(f"{ENV_VAR}={name_or_path}: no such fixture; {hint}known fixtures: "
                     f"{', '.join(fixture_names())}")


def load_node(name_or_path: str) -> Topology:
    """The fixture as written: every GPU of the node, no visibility applied."""
    path = fixture_file(name_or_path)
    try:
        data = json.loads(path.read_text())
        check_fields(data)
        node = Topology.from_dict(data)
        check_references(node)
        return node
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a topology JSON ({exc}); write one with "
                         f"`smartlaunch-node topo --all --json > node.json`") from exc


def check_fields(data) -> None:
    """Each GPU's, process's and link's fields have the JSON type of their dataclass field
    (from_dict takes whatever it is given)."""
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("the top level must be an object with a list of 'gpus'")
    for i, gpu in enumerate(data["gpus"]):
        _check_record(gpu, GPU, f"gpus[{i}]")
        for j, proc in enumerate(gpu.get("processes") or ()):
            _check_record(proc, GPUProcess, f"gpus[{i}].processes[{j}]")
    for i, link in enumerate(data.get("links") or ()):
        _check_record(link, Link, f"links[{i}]")


def check_references(node: Topology) -> None:
    """Links name GPUs that are in the file, by `index`; indices are unique."""
    for attr in ("index", "nvml_index"):
        seen = [getattr(g, attr) for g in node.gpus]
        if len(set(seen)) != len(seen):
            dup = next(v for v in seen if seen.count(v) > 1)
            raise ValueError(f"two GPUs have {attr} {dup}; each GPU needs its own")
    indices = {g.index for g in node.gpus}
    for i, link in enumerate(node.links):
        for end in ("a", "b"):
            if getattr(link, end) not in indices:
                raise ValueError(f"links[{i}].{end} is {getattr(link, end)}, not the index of a "
                                 f"GPU in the file ({', '.join(map(str, sorted(indices)))})")
        if link.a == link.b:
            raise ValueError(f"links[{i}] joins GPU {link.a} to itself")


def _check_record(record, cls, where: str) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"{where} is {record!r}, not an object")
    hints = typing.get_type_hints(cls)
    for name, value in record.items():
        if name in hints and not _json_is(value, hints[name]):
            raise ValueError(f"{where}.{name} is {value!r}, not {_describe(hints[name])}")


def _json_is(value, tp) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_json_is(value, a) for a in args)
    if origin is tuple:
        return isinstance(value, list) and (
            args[0] not in (int, str) or all(_json_is(v, args[0]) for v in value))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp) if isinstance(tp, type) else True


def _describe(tp) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if typing.get_origin(tp) is tuple:
        return {int: "a list of integers", str: "a list of strings"}.get(args[0], "a list")
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def from_json(name_or_path: str, environ: Mapping[str, str]) -> Topology:
    node = load_node(name_or_path)
    return dataclasses.replace(apply_visibility(node, environ),
                               source=f"fake:{fixture_file(name_or_path)}")


def apply_visibility(node: Topology, environ: Mapping[str, str]) -> Topology:
    """The GPUs of `node` this job may use, renumbered in CUDA order, with findings computed."""
    physical = [PhysicalGPU(g.nvml_index, g.uuid, g.mig_devices) for g in node.gpus]
    vis = resolve_visibility(physical, environ)
    by_nvml = {g.nvml_index: g for g in node.gpus}
    new_pos = {n: pos for pos, n in enumerate(vis.nvml_indices)}
    old_to_nvml = {g.index: g.nvml_index for g in node.gpus}
    gpus = tuple(dataclasses.replace(by_nvml[n], index=pos)
                 for pos, n in enumerate(vis.nvml_indices))
    pairs = {frozenset((old_to_nvml[l.a], old_to_nvml[l.b])): l for l in node.links}
    links = []
    for i, a in enumerate(vis.nvml_indices):
        for j in range(i + 1, len(vis.nvml_indices)):
            known = pairs.get(frozenset((a, vis.nvml_indices[j])))
            links.append(dataclasses.replace(known, a=i, b=j) if known
                         else Link(i, j, UNKNOWN_LINK))
    extra = [f if f.gpu is None else dataclasses.replace(f, gpu=new_pos[old_to_nvml[f.gpu]])
             for f in node.findings if f.code not in COMPUTED_CODES
             and (f.gpu is None or old_to_nvml.get(f.gpu) in new_pos)]
    names = {g.nvml_index: g.name for g in node.gpus}
    extra += visibility_findings(vis, names, environ)
    return dataclasses.replace(
        node, gpus=gpus, links=tuple(links), findings=health.assess(gpus, links, extra),
        note=node.note or visibility_note(vis, environ, len(node.gpus)))


def to_json(topology: Topology) -> str:
    """Topology.to_dict() as readable JSON: one field a line, lists of numbers on one line."""
    text = json.dumps(topology.to_dict(), indent=1)
    return re.sub(r"\[[\d,\s-]*\]", lambda m: re.sub(r"\s+", "", m.group()).replace(",", ", "), text)
