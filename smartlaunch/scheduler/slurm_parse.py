"""Pure parsers of Slurm's text: hostlists, id lists, `scontrol` output. No I/O here."""
from __future__ import annotations

import re

from smartlaunch.errors import SlurmError
from smartlaunch.allocation import parse_id_list  # noqa: F401  (re-exported)

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")      # one hostlist range
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.\[\]]*)=")


def parse_tasks_per_node(text: str) -> tuple[int, ...]:
    """SLURM_TASKS_PER_NODE '2(x3),1' -> (2, 2, 2, 1)."""
    out: list[int] = []
    for part in (text or "").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise SlurmError(f"tasks per node {text!r} is not like '2(x3),1'; "
                             f"check SLURM_TASKS_PER_NODE")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(out)


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """'gpu[01-02,05],login1' -> ('gpu01', 'gpu02', 'gpu05', 'login1'), as
    `scontrol show hostnames` does; used where the client commands are absent (containers)."""
    hosts: list[str] = []
    for item in _split_top(expr.strip()):
        hosts.extend(_expand_one(item, expr))
    return tuple(hosts)


def _split_top(expr: str) -> list[str]:
    items, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmError(f"hostlist {expr!r} has unbalanced brackets; check SLURM_JOB_NODELIST")
    items.append("".join(cur))
    return [i for i in items if i]


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest, whole) if rest else [""]
    out = []
    for part in ranges.split(","):
        r = _RANGE.match(part)
        if not r:
            raise SlurmError(f"hostlist {whole!r}: {part!r} is not a number range; "
                             f"check SLURM_JOB_NODELIST")
        lo, hi = r.group(1), r.group(2) or r.group(1)
        width = len(lo) if lo.startswith("0") else 0
        for n in range(int(lo), int(hi) + 1):
            out.extend(f"{prefix}{n:0{width}d}{t}" for t in tails)
    return out


def parse_hostnames(text: str) -> tuple[str, ...]:
    """`scontrol show hostnames LIST` output: one host per line."""
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def parse_key_values(text: str) -> dict[str, str]:
    """`scontrol -o show node|job` one record: 'Key=value Key2=value with spaces ...' (a value
    runs until the next ' Key=')."""
    text = text.strip()
    keys = list(_KEY.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(text)
        out[m.group(1)] = text[m.end():end].strip()
    return out
