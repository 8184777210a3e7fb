"""The policy file validator: walks the YAML node tree so every error names `file:line` and
the dotted key, and goes on past a bad key (PolicyProblems); the tables are in rules.py."""
from __future__ import annotations

import contextlib
import difflib
import shlex
import typing
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from smartlaunch.errors import PolicyError
from smartlaunch.policy.rules import (CHOICES, EMPTY_MEANS, ENFORCE_ONLY, KIND_NAMES, RANGES,
                                      SECTIONS, field_default, section_fields)
from smartlaunch.vocab import FAMILY_P2P_LEVEL, LINK_FAMILIES, P2P_FAMILIES, P2P_LEVELS, p2p_level

# The lowest NCCL_P2P_LEVEL each P2P family needs to keep its P2P path.
P2P_FAMILY_LEVEL = {f: P2P_LEVELS.index(FAMILY_P2P_LEVEL[f]) for f in P2P_FAMILIES}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]!]+\Z")     # ENV_NAME with fnmatch's * ? [...]


@dataclass
class ParsedFile:
    """One validated policy file, flattened to dotted keys; `lines`: each key's line."""
    path: str
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    enforce: dict[str, Any] = field(default_factory=dict)
    enforce_lines: dict[str, int] = field(default_factory=dict)
    user_refusal: str | None = None    # why a launch would refuse it as the user's policy


class PolicyProblems(PolicyError):
    """Every problem of one policy file, in file order; str() is the first and a count."""

    def __init__(self, path: str, problems: list[str]):
        more = len(problems) - 1
        tail = (f" (and {more} more problem{'s' if more > 1 else ''}; `smartlaunch-node policy "
                f"check {shlex.quote(path)}` lists them)") if more else ""
        super().__init__(problems[0] + tail)
        self.problems = tuple(problems)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _did_you_mean(word: str, valid: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(valid), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def _describe(v: Any) -> str:
    if isinstance(v, bool):
        return f"boolean {str(v).lower()}"
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return "a list" if isinstance(v, list) else "a mapping"
    return f"{type(v).__name__} {v!r}"


class _Walker:
    """Validates one document; `construct` turns a scalar node into its Python value."""

    def __init__(self, path: str, construct: Callable[[yaml.Node], Any], allow_enforce: bool):
        self.path = path
        self.construct = construct
        self.allow_enforce = allow_enforce
        self.problems: list[PolicyError] = []

    @contextlib.contextmanager
    def noting(self):
        """Record a problem of one key and go on with the next."""
        try:
            yield
        except PolicyError as exc:
            self.problems.append(exc)

    def in_file_order(self) -> list[str]:
        return [str(p) for p in sorted(self.problems, key=lambda p: getattr(p, "line", 0))]

    def error(self, node: yaml.Node, key: str, msg: str) -> PolicyError:
        where = f"{self.path}:{_line(node)}"
        exc = PolicyError(f"{where}: {key}: {msg}" if key else f"{where}: {msg}")
        exc.line = _line(node)
        return exc

    def got(self, node: yaml.Node) -> str:
        """What a node holds, for 'expected X, got Y'."""
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        return _describe(self.construct(node))

    def items(self, node: yaml.Node, key: str, what: str):
        """(name, key node, value node) of a mapping; rejects non-mappings and repeats."""
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return []          # a section header with everything under it commented out
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, f"expected {what}, got {self.got(node)}; write it as "
                             "'name: value' lines indented under it")
        seen: dict[str, int] = {}
        out = []
        for knode, vnode in node.value:
            if not (isinstance(knode, yaml.ScalarNode) and knode.tag == "tag:yaml.org,2002:str"):
                raw = knode.value if isinstance(knode, yaml.ScalarNode) else "?"
                self.problems.append(self.error(
                    knode, key, f"key {raw!r} is not a name; keys are words such as "
                    "min_efficiency (quote it if it really is a name)"))
                continue
            name = knode.value
            sub = f"{key}.{name}" if key else name
            if name in seen:
                self.problems.append(self.error(
                    knode, sub, f"duplicate key (first set at line {seen[name]}); keep only one"))
                continue
            seen[name] = _line(knode)
            out.append((name, knode, vnode))
        return out

    def unknown(self, knode: yaml.Node, key: str, name: str, valid: typing.Iterable[str],
                what: str = "key", whats: str = "keys") -> PolicyError:
        valid = list(valid)
        return self.error(knode, key, f"unknown {what}; {_did_you_mean(name, valid)}"
                          f"valid {whats}: {', '.join(valid)}")

    def document(self, node: yaml.Node | None) -> ParsedFile:
        out = ParsedFile(self.path)
        if node is None:
            return out
        what = "a mapping of sections (" + ", ".join(SECTIONS) + ")"
        for name, knode, vnode in self.items(node, "", what):
            with self.noting():
                if name == "enforce":
                    if not self.allow_enforce:
                        raise self.error(knode, "enforce", "only the admin policy "
                                         "/etc/smartlaunch/policy.yaml may enforce values; "
                                         "remove this section (ask your administrator to change "
                                         "the rule)")
                    self.sections(vnode, "enforce", out.enforce, out.enforce_lines)
                elif name in SECTIONS:
                    self.section(name, vnode, "", out.values, out.lines)
                else:
                    valid = [*SECTIONS, "enforce"] if self.allow_enforce else list(SECTIONS)
                    raise self.unknown(knode, name, name, valid, "section", "sections")
        return out

    def sections(self, node: yaml.Node, prefix: str, values: dict, lines: dict) -> None:
        for name, knode, vnode in self.items(node, prefix, "a mapping of sections"):
            with self.noting():
                if name not in SECTIONS:
                    raise self.unknown(knode, f"{prefix}.{name}", name, SECTIONS, "section",
                                       "sections")
                self.section(name, vnode, prefix, values, lines)

    def section(self, section: str, node: yaml.Node, prefix: str, values: dict,
                lines: dict) -> None:
        shown = f"{prefix}.{section}" if prefix else section
        for name, fknode, vnode in self.items(node, shown, f"a mapping of {section} keys"):
            with self.noting():
                self.field(section, name, fknode, vnode, prefix, values, lines)

    def field(self, section: str, name: str, fknode: yaml.Node, vnode: yaml.Node, prefix: str,
              values: dict, lines: dict) -> None:
        fields = section_fields(section)
        dotted = f"{section}.{name}"
        label = f"{prefix}.{dotted}" if prefix else dotted
        if dotted in ENFORCE_ONLY:
            if prefix != "enforce":
                fix = "move it under enforce:" if self.allow_enforce else \
                    "remove it (ask your administrator to change the rule)"
                raise self.error(fknode, label, f"holds {ENFORCE_ONLY[dotted]}: only the admin "
                                 f"policy's enforce: section may set it; {fix}")
            values[dotted] = self.patterns(vnode, label)
            lines[dotted] = _line(fknode)
            return
        if name not in fields:
            valid = [*fields, *(k.split(".")[1] for k in ENFORCE_ONLY
                                if prefix == "enforce" and k.startswith(f"{section}."))]
            raise self.unknown(fknode, label, name, valid)
        kind = fields[name]
        if kind == "nccl":
            for fam, fam_knode, fam_node in self.items(vnode, label, "a mapping of link "
                                                       "families (NV, PIX, ...)"):
                with self.noting():
                    if fam not in LINK_FAMILIES:
                        raise self.unknown(fam_knode, f"{label}.{fam}", fam, LINK_FAMILIES,
                                           "link family", "link families")
                    values[f"{dotted}.{fam}"] = self.env_vars(fam_node, f"{label}.{fam}", fam,
                                                              lines, f"{dotted}.{fam}")
                    lines[f"{dotted}.{fam}"] = _line(fam_knode)
        elif kind == "env":
            for var, value in self.env_vars(vnode, label, None, lines, dotted).items():
                values[f"{dotted}.{var}"] = value
        else:
            values[dotted] = self.scalar(kind, vnode, label, dotted)
            lines[dotted] = _line(fknode)

    def env_vars(self, node: yaml.Node, label: str, family: str | None, lines: dict,
                 dotted: str) -> dict[str, str]:
        """{variable: value}; each variable's line goes to lines[f"{dotted}.{variable}"]."""
        out: dict[str, str] = {}
        for var, knode, vnode in self.items(node, label, "a mapping of variables to values"):
            with self.noting():
                self.env_var(var, knode, vnode, label, family, out)
                lines[f"{dotted}.{var}"] = _line(knode)
        return out

    def env_var(self, var: str, knode: yaml.Node, vnode: yaml.Node, label: str,
                family: str | None, out: dict[str, str]) -> None:
        key = f"{label}.{var}"
        if family is not None and not var.startswith("NCCL_"):
            hint = f"did you mean 'NCCL_{var}'? " if ENV_NAME.match(var) else ""
            raise self.error(knode, key, "NCCL settings must be NCCL_* variables; "
                             f"{hint}put other variables under launch.env")
        if not ENV_NAME.match(var):
            raise self.error(knode, key, "not a valid environment variable name; use "
                             "letters, digits and _")
        raw = self.construct(vnode) if isinstance(vnode, yaml.ScalarNode) else []
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise self.error(vnode, key, f"expected a string or integer, got "
                             f"{_describe(raw)}; write one value, quoted, e.g. {var}: \"1\"")
        out[var] = str(raw)
        self.check_p2p(vnode, key, var, out[var], family)

    def check_p2p(self, node: yaml.Node, key: str, var: str, value: str,
                  family: str | None) -> None:
        # launch.env applies to every link, so it must keep P2P on the fastest family too.
        floor = P2P_FAMILY_LEVEL.get(family, 0) if family else max(P2P_FAMILY_LEVEL.values())
        where = f"the working P2P path of {family} links" if family else \
            "the working P2P path of NV/PIX/PXB links"
        fix = "remove it; NCCL already skips P2P where it does not work"
        if var == "NCCL_P2P_DISABLE" and (family is None or family in P2P_FAMILY_LEVEL):
            if value.strip().lower() not in ("", "0", "false", "no"):
                raise self.error(node, key, f"NCCL_P2P_DISABLE={value} disables {where}; {fix}")
        if var == "NCCL_P2P_LEVEL" and floor:
            name = p2p_level(value)
            if name is None:
                raise self.error(node, key, f"{value!r} is not an NCCL_P2P_LEVEL; use one of: "
                                 + ", ".join(P2P_LEVELS))
            if P2P_LEVELS.index(name) < floor:
                raise self.error(node, key, f"NCCL_P2P_LEVEL={value} disables {where}; {fix}")

    def scalar(self, kind: str, node: yaml.Node, label: str, dotted: str) -> Any:
        if kind == "strtuple":
            return self.name_list(node, label, dotted)
        if kind == "inttuple":
            return self.int_list(node, label, dotted)
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, label, f"expected {KIND_NAMES[kind]}, got {self.got(node)}")
        v = self.construct(node)
        if kind == "str" and dotted in CHOICES and node.style is None and \
                node.value in CHOICES[dotted][0]:
            v = node.value      # YAML 1.1 reads a plain `off` as false; the choice is meant
        is_int = isinstance(v, int) and not isinstance(v, bool)
        is_number = isinstance(v, (int, float)) and not isinstance(v, bool)
        ok = {"bool": isinstance(v, bool), "int": is_int, "optint": v is None or is_int,
              "float": is_number, "optfloat": v is None or is_number,
              "str": isinstance(v, str)}[kind]
        if not ok:
            hint = {"bool": "; write true or false", "str": "; quote it",
                    "optint": "; write an integer, e.g. 4, or null",
                    "optfloat": "; write a number, e.g. 0.25, or null",
                    "int": f"; write an integer, e.g. {field_default(dotted)}",
                    "float": f"; write a number, e.g. {field_default(dotted)}"}[kind]
            raise self.error(node, label, f"expected {KIND_NAMES[kind]}, got {_describe(v)}"
                             + hint)
        if kind == "float" or (kind == "optfloat" and v is not None):
            v = float(v)
            if v != v or v in (float("inf"), float("-inf")):
                raise self.error(node, label, f"{v} is not a finite number; write a number, "
                                 f"e.g. {field_default(dotted)}")
        if kind == "str" and not v.strip() and dotted not in EMPTY_MEANS:
            raise self.error(node, label, "must not be empty; remove the key to keep the "
                             "default")
        rng = RANGES.get(dotted)
        if rng and v is not None and not rng.holds(v):
            extra = {"optint": ", or null for every visible GPU",
                     "optfloat": ", or null for the default"}.get(kind, "")
            raise self.error(node, label, f"{v:g} is out of range; use a value "
                             f"{rng.describe()}{extra}")
        if dotted in CHOICES:
            self.choice(node, label, dotted, v)
        return v

    def choice(self, node: yaml.Node, label: str, dotted: str, v: str) -> None:
        allowed, what = CHOICES[dotted]
        if v not in allowed:
            raise self.error(node, label, f"{v!r} is not a {what}; "
                             f"{_did_you_mean(v, allowed)}use one of: {', '.join(allowed)}")

    def sequence(self, node: yaml.Node, label: str, expected: str, empty: str | None,
                 check: Callable[[yaml.Node, str, Any], None]) -> list:
        """The distinct items of a list, each checked by check(item node, label, value);
        empty: the error for an empty list (None: allowed)."""
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, label, f"expected {expected}, got {self.got(node)}")
        if empty and not node.value:
            raise self.error(node, label, empty)
        out: list = []
        for i, item in enumerate(node.value):
            with self.noting():         # every bad element is named, not the first only
                v = self.construct(item) if isinstance(item, yaml.ScalarNode) else None
                check(item, f"{label}[{i}]", v)
                if v in out:
                    raise self.error(item, f"{label}[{i}]", f"{v!r} is listed twice; remove the "
                                     "repeat")
                out.append(v)
        return out

    def name_list(self, node: yaml.Node, label: str, dotted: str) -> tuple[str, ...]:
        def check(item, where, v):
            if not isinstance(v, str):
                raise self.error(item, where, f"expected a name, got {_describe(v)}")
            self.choice(item, where, dotted, v)
        return tuple(self.sequence(node, label, "a list such as [single, ddp]",
                                   f"must list at least one {CHOICES[dotted][1]}", check))

    def patterns(self, node: yaml.Node, label: str) -> tuple[str, ...]:
        """A list of distinct variable-name patterns (an empty list allows none)."""
        def check(item, where, v):
            if not isinstance(v, str) or not ENV_PATTERN.match(v):
                raise self.error(item, where, f"{_describe(v)} is not a variable name or "
                                 "pattern; use letters, digits, _ and the wildcards * ? [...], "
                                 "quoted (\"NCCL_*\")")
        return tuple(self.sequence(node, label, "a list of variable names or patterns such as "
                                   "[\"NCCL_*\", OMP_NUM_THREADS]", None, check))

    def int_list(self, node: yaml.Node, label: str, dotted: str) -> tuple[int, ...]:
        """A list of distinct integers in the key's range, smallest first."""
        example = "[" + ", ".join(map(str, field_default(dotted))) + "]"
        rng = RANGES.get(dotted)

        def check(item, where, v):
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.error(item, where, f"expected an integer, got {_describe(v)}")
            if rng and not rng.holds(v):
                raise self.error(item, where, f"{v} is out of range; use a value "
                                 f"{rng.describe()}")
        return tuple(sorted(self.sequence(
            node, label, f"a list of integers such as {example}",
            f"must list at least one integer, e.g. {example}", check)))


def parse_text(text: str, path: str, *, allow_enforce: bool) -> ParsedFile:
    """Validate one policy document; PolicyError (PolicyProblems for key faults) naming
    file:line and the key."""
    loader = yaml.SafeLoader(text)
    walker = _Walker(path, lambda n: loader.construct_object(n, deep=True), allow_enforce)
    try:
        try:
            parsed = walker.document(loader.get_single_node())
            if walker.problems:
                raise PolicyProblems(path, walker.in_file_order())
            return parsed
        except yaml.MarkedYAMLError as exc:   # syntax, or a tag safe loading refuses
            mark = exc.problem_mark or exc.context_mark
            line = f":{mark.line + 1}" if mark else ""
            if isinstance(exc, yaml.constructor.ConstructorError):
                raise PolicyError(f"{path}{line}: YAML tag not allowed: {exc.problem}; write a "
                                  "plain value (policy files are read with safe loading)"
                                  ) from None
            problem = exc.problem or exc.context or "cannot parse"
            if exc.context and exc.context.startswith("expected") and exc.problem:
                problem = f"{exc.context} {exc.problem}"     # "expected a single document ..."
            raise PolicyError(f"{path}{line}: malformed YAML: {problem}; fix the syntax "
                              "(indent with spaces, 'key: value')") from None
        except yaml.YAMLError as exc:
            raise PolicyError(f"{path}: malformed YAML: {exc}; fix the syntax") from None
    finally:
        loader.dispose()
