"""`policy show`: the effective policy as YAML that `policy check` accepts, each value followed
by a comment naming the layer that set it."""
from __future__ import annotations

from typing import Any

import yaml

from smartlaunch.policy.api import Policy
from smartlaunch.policy.rules import ENFORCE_ONLY, SECTIONS, section_fields


def yaml_scalar(v: Any) -> str:
    """A value written so that YAML reads it back as the same value and type."""
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    plain = str(v)
    try:
        if plain and yaml.safe_load(plain) == v and ":" not in plain and "#" not in plain:
            return plain
    except yaml.YAMLError:
        pass
    return '"' + plain.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comment(policy: Policy, key: str) -> str:
    text = policy.source_of(key)
    if key in policy.notes:
        text += f"  ({policy.notes[key]})"
    return f"  # {text}"


def render(policy: Policy) -> str:
    lines = ["# Effective smartlaunch policy. Layers read, lowest first: "
             + ", ".join(policy.layers or ("built-in",)),
             "# Each value's comment names the layer that set it; 'enforced:' values are the "
             "admin's and win over user files, environment and command line."]
    for section in SECTIONS:
        obj = getattr(policy, section)
        lines.append(f"{section}:")
        for name, kind in section_fields(section).items():
            value, key = getattr(obj, name), f"{section}.{name}"
            if kind == "nccl":
                lines.append(f"  {name}:")
                for fam, env in value.items():
                    fkey = f"{key}.{fam}"
                    if not env:
                        lines.append(f"    {fam}: {{}}{_comment(policy, fkey)}")
                        continue
                    lines.append(f"    {fam}:{_comment(policy, fkey)}")
                    lines += [f"      {var}: {yaml_scalar(v)}" for var, v in env.items()]
            elif kind == "env":
                if not value:
                    lines.append(f"  {name}: {{}}  # built-in")
                    continue
                lines.append(f"  {name}:")
                lines += [f"    {var}: {yaml_scalar(v)}{_comment(policy, f'{key}.{var}')}"
                          for var, v in value.items()]
            else:
                lines.append(f"  {name}: {yaml_scalar(value)}{_comment(policy, key)}")
        lines += [_enforce_only(policy, key) for key in ENFORCE_ONLY
                  if key.startswith(f"{section}.")]
    return "\n".join(lines) + "\n"


def _enforce_only(policy: Policy, key: str) -> str:
    """An enforce-only rule, as a comment (the output stays a file any layer accepts)."""
    name = key.split(".", 1)[1]
    if key not in policy.enforced:
        return (f"  # {name}: any (built-in; only an admin's enforce: section limits "
                f"{ENFORCE_ONLY[key]})")
    return (f"  # {name}: {yaml_scalar(policy.enforced[key])}  # {policy.source_of(key)}: "
            f"{ENFORCE_ONLY[key]}")
