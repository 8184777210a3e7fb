"""The package's import graph: no module imports a higher layer, and no modules import each
other in a circle. Read from the source (ast), function-level imports included, so a lazy
import that works around a cycle is still a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers_common import REPO

# Lowest first (docs/architecture.md). A module may import its own package and lower layers.
LAYERS = (
    ("smartlaunch", "smartlaunch.errors", "smartlaunch.vocab", "smartlaunch.request", "smartlaunch.logconf",
     "smartlaunch.worker_env", "smartlaunch.store", "smartlaunch.proc", "smartlaunch.guard",
     "smartlaunch.sandbox", "smartlaunch.entry", "smartlaunch.allocation", "smartlaunch.wire"),
    ("smartlaunch.topology", "smartlaunch.policy"),
    ("smartlaunch.profile",),
    ("smartlaunch.decide",),
    ("smartlaunch.launch",),
    ("smartlaunch.strategies",),
    ("smartlaunch.scheduler",),
    ("smartlaunch.slurm",),
    ("smartlaunch.pipeline_nodes",),
    ("smartlaunch.driver",),
    ("smartlaunch.pipeline",),
    ("smartlaunch.cli", "smartlaunch.node_cli", "smartlaunch.node_calibrate"),
)


def modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` imports (a `from pkg import sub` names pkg.sub)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:          # `import a.b.c` of a package: its deepest module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def layer_of(name: str) -> tuple[int, str]:
    best = None
    for rank, members in enumerate(LAYERS):
        for m in members:
            if (name == m or name.startswith(m + ".")) and (best is None or len(m) > len(best[1])):
                best = (rank, m)
    if best is None:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS (and docs/architecture.md)")
    return best


def violations(root: Path, package: str) -> list[str]:
    known = modules(root, package)
    graph = {n: imports(n, p, known) for n, p in known.items()}
    out = []
    for a, targets in sorted(graph.items()):
        ra, unit_a = layer_of(a)
        for b in sorted(targets):
            rb, unit_b = layer_of(b)
            if rb > ra or (rb == ra and unit_a != unit_b and ra > 0):
                out.append(f"{a} imports {b}: layer {unit_b} is not below {unit_a}")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_upward_import_and_no_cycle():
    assert violations(REPO, "smartlaunch") == []


def _tree(tmp_path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "smartlaunch" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


BASE = {"__init__.py": "", "errors.py": "", "topology/__init__.py": "",
        "topology/api.py": "from smartlaunch.errors import x\n",
        "launch/__init__.py": "", "launch/run.py": "from smartlaunch.topology.api import T\n"}


def test_checker_passes_a_clean_tree(tmp_path):
    assert violations(_tree(tmp_path, BASE), "smartlaunch") == []


@pytest.mark.parametrize("files, expected", [
    ({"topology/api.py": "def f():\n    from smartlaunch.launch import run\n"},
     "smartlaunch.topology.api imports smartlaunch.launch.run: layer smartlaunch.launch is not "
     "below smartlaunch.topology"),
    ({"policy/__init__.py": "", "policy/api.py": "from smartlaunch.topology import api\n"},
     "smartlaunch.policy.api imports smartlaunch.topology.api: layer smartlaunch.topology is "
     "not below smartlaunch.policy"),
    ({"launch/a.py": "from smartlaunch.launch import run\n",
      "launch/run.py": "def f():\n    import smartlaunch.launch.a\n"},
     "import cycle: smartlaunch.launch.a -> smartlaunch.launch.run -> smartlaunch.launch.a"),
])
def test_checker_finds_an_upward_import_or_a_cycle(tmp_path, files, expected):
    assert expected in violations(_tree(tmp_path, {**BASE, **files}), "smartlaunch")
