"""Values another machine wrote, read into typed, bounded Python values: what a multi-node job's
nodes read from its rendezvous store (pipeline_nodes.py, profile/internode.py). Ground floor.

Each reader takes the decoded JSON value and where it is (its field path, for the error) and
returns the value, or raises WireError naming the field and what is wrong (one line):

- `loads`: the raw text, at most `cap` bytes, UTF-8, JSON, not nested past Python's limit;
- `integer`: an int (not a bool) in the range given; `number`: a finite int or float in range;
- `text`: a str of at most `limit` characters, its control characters (terminal escapes, CR,
  NUL; newlines and tabs too unless `lines`) replaced by U+FFFD, so it can be shown;
- `items`: a list of at most `limit` items; `choice`: a text among the allowed ones;
- `record`: an object whose every key is a field of the dataclass, every field without a
  default present, each value read by its type (int, float, str, bool, `X | None`, str
  enums, `tuple[X, ...]`, `tuple[X, Y]`, `dict[str, X]`, nested dataclasses) or by the
  reader the caller gives for that field name or type.

What a value may be used for is the caller's contract (docs/trust-model.md): nothing read from
the network names code, an environment variable or a path to run.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

from smartlaunch.errors import WireError

Reader = Callable[[Any, str], Any]
MAX_INT = 1 << 53           # JSON's exact integers
MAX_ITEMS = 1 << 16         # a list, unless its reader says otherwise
MAX_KEYS = 1 << 10          # an object's keys
MAX_TEXT = 16 << 10         # a string, unless its reader says otherwise
MAX_KEY_TEXT = 256
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")    # keeps \t and \n
_CONTROL_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def loads(raw: bytes | str, cap: int) -> Any:
    """The JSON value of `raw`; WireError when it is over `cap` bytes or not JSON."""
    if len(raw) > cap:
        raise WireError("", f"{len(raw)} bytes, more than the {cap} it may be")
    try:
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError:
        raise WireError("", "not UTF-8 text") from None
    except RecursionError:
        raise WireError("", "JSON nested too deep") from None
    except ValueError as exc:       # JSONDecodeError, or an integer of too many digits
        raise WireError("", f"not JSON ({str(exc)[:80]})") from None


def integer(v: Any, where: str, lo: int = -MAX_INT, hi: int = MAX_INT) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise WireError(where, f"{shown(v)}, not an integer")
    if not lo <= v <= hi:
        raise WireError(where, f"{shown(v)} is outside {lo}..{hi}")
    return v


def number(v: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(where, f"{shown(v)}, not a number")
    try:
        v = float(v)
    except OverflowError:
        raise WireError(where, "a number too large") from None
    if not math.isfinite(v):
        raise WireError(where, f"{v}, not a finite number")
    if not lo <= v <= hi:
        raise WireError(where, f"{v:g} is outside {lo:g}..{hi:g}")
    return v


def flag(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise WireError(where, f"{shown(v)}, not true or false")
    return v


def text(v: Any, where: str, limit: int = MAX_TEXT, *, lines: bool = False) -> str:
    if not isinstance(v, str):
        raise WireError(where, f"{shown(v)}, not a string")
    if len(v) > limit:
        raise WireError(where, f"a string of {len(v)} characters, more than {limit}")
    return (_CONTROL if lines else _CONTROL_LINE).sub("\ufffd", v)


def line(v: Any, limit: int) -> str:
    """Any string as one printable line of at most `limit` characters (cut with "…"); not a
    check: for text only shown (a host name, an error message)."""
    s = _CONTROL_LINE.sub(" ", v if isinstance(v, str) else "")
    return s if len(s) <= limit else s[:limit - 1] + "…"


def items(v: Any, where: str, limit: int = MAX_ITEMS) -> list:
    if not isinstance(v, list):
        raise WireError(where, f"{shown(v)}, not a list")
    if len(v) > limit:
        raise WireError(where, f"a list of {len(v)} items, more than {limit}")
    return v


def obj(v: Any, where: str, limit: int = MAX_KEYS) -> dict:
    if not isinstance(v, dict):
        raise WireError(where, f"{shown(v)}, not an object")
    if len(v) > limit:
        raise WireError(where, f"an object of {len(v)} keys, more than {limit}")
    return v


def choice(v: Any, where: str, allowed: Collection[str]) -> str:
    s = text(v, where, MAX_KEY_TEXT)
    if s not in allowed:
        raise WireError(where, f"{s!r} is not one of {', '.join(sorted(map(str, allowed)))}")
    return s


def record(cls, v: Any, where: str, *, fields: Mapping[str, Reader] | None = None,
           readers: Mapping[type, Reader] | None = None) -> dict[str, Any]:
    """The keyword arguments of `cls` (a dataclass) from the object `v`: unknown keys and
    missing fields without a default are errors; `fields` reads a field by its name (this
    level only), `readers` a type wherever it appears (nested records too)."""
    d = obj(v, where)
    hints = _hints(cls)
    unknown = sorted(k for k in d if k not in hints)
    if unknown:
        raise WireError(f"{where}.{line(unknown[0], 40)}", f"not a field of {cls.__name__}")
    out = {}
    for f in dataclasses.fields(cls):
        path = f"{where}.{f.name}"
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(path, "missing")
            continue
        read = (fields or {}).get(f.name)
        out[f.name] = read(d[f.name], path) if read else \
            value(hints[f.name], d[f.name], path, readers or {})
    return out


def value(tp, v: Any, where: str, readers: Mapping[type, Reader]) -> Any:
    """`v` read as the type `tp` (record's rules)."""
    if tp in readers:
        return readers[tp](v, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{where}: no reader for {tp}")
        return value(inner[0], v, where, readers)
    if origin is tuple:
        got = items(v, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(value(args[0], x, f"{where}[{i}]", readers) for i, x in enumerate(got))
        if len(got) != len(args):
            raise WireError(where, f"a list of {len(got)} items, not {len(args)}")
        return tuple(value(a, x, f"{where}[{i}]", readers) for i, (a, x) in
                     enumerate(zip(args, got)))
    if origin is dict and args[0] is str:
        return {text(k, f"{where} key", MAX_KEY_TEXT): value(args[1], x, f"{where}.{line(k, 40)}",
                                                            readers)
                for k, x in obj(v, where).items()}
    if tp is bool:
        return flag(v, where)
    if tp is int:
        return integer(v, where)
    if tp is float:
        return number(v, where)
    if tp is str:
        return text(v, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(choice(v, where, [m.value for m in tp]))
    if dataclasses.is_dataclass(tp):
        return tp(**record(tp, v, where, readers=readers))
    raise TypeError(f"{where}: no reader for {tp}")


def shown(v: Any) -> str:
    """What a value is, for an error, without echoing a stranger's text: 'a string', 3."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, float)):
        s = repr(v)
        return s if len(s) <= 24 else f"an integer of {len(s)} digits"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)
