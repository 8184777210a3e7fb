"""Values smartlaunch did not write itself (another node's, a cache file's), read into typed,
bounded Python values. Each reader takes the decoded JSON value and its field path and returns
the value, or raises the Reader's error (an errors.BadValue) naming the field, in one line.
`NET` is the rendezvous store's Reader; its readers are this module's functions.
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

from smartlaunch.errors import BadValue, WireError

Read = Callable[[Any, str], Any]
MAX_INT = 1 << 53           # JSON's exact integers
MAX_ITEMS = 1 << 16         # a list, unless its reader says otherwise
MAX_KEYS = 1 << 10          # an object's keys
MAX_TEXT = 16 << 10         # a string, unless its reader says otherwise
MAX_KEY_TEXT = 256
RECORD = "the record"       # the field of a record's own value (a list where an object goes)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")    # keeps \t and \n
_CONTROL_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class Reader:
    """The readers of one kind of source: they raise `error`, bound a string by max_text and
    a list by max_items by default, and when `printable` replace control characters."""

    def __init__(self, error: type[BadValue], *, max_text: int, max_items: int,
                 printable: bool):
        self.error, self.max_text, self.max_items = error, max_text, max_items
        self.printable = printable

    def loads(self, raw: bytes | str, cap: int, where: str = "") -> Any:
        """The JSON value of `raw`; the error when it is over `cap` bytes or not JSON."""
        if len(raw) > cap:
            raise self.error(where, f"{len(raw)} bytes, more than the {cap} it may be")
        try:
            return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        except UnicodeDecodeError:
            raise self.error(where, "not UTF-8 text") from None
        except RecursionError:
            raise self.error(where, "JSON nested too deep") from None
        except ValueError as exc:       # JSONDecodeError, or an integer of too many digits
            raise self.error(where, f"not JSON ({str(exc)[:80]})") from None

    def integer(self, v: Any, where: str, lo: int = -MAX_INT, hi: int = MAX_INT) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(where, f"{self.error.shown(v)}, not an integer")
        if not lo <= v <= hi:
            raise self.error(where, f"{self.error.shown(v)} is outside {lo}..{hi}")
        return v

    def number(self, v: Any, where: str, lo: float = -math.inf, hi: float = math.inf, *,
               positive: bool = False) -> float:
        """positive: > 0 (a rate, a step time), besides lo..hi."""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(where, f"{self.error.shown(v)}, not a number")
        try:
            v = float(v)
        except OverflowError:
            raise self.error(where, "a number too large") from None
        if not math.isfinite(v):
            raise self.error(where, f"{v}, not a finite number")
        if positive and v <= 0:
            raise self.error(where, f"{v:g} is not positive")
        if not lo <= v <= hi:       # one bound given: that one named
            raise self.error(where, f"{v:g} is " + (
                f"outside {lo:g}..{hi:g}" if math.isfinite(lo) and math.isfinite(hi) else
                f"below {lo:g}" if v < lo else f"above {hi:g}"))
        return v

    def flag(self, v: Any, where: str) -> bool:
        if not isinstance(v, bool):
            raise self.error(where, f"{self.error.shown(v)}, not true or false")
        return v

    def text(self, v: Any, where: str, limit: int | None = None, *, lines: bool = False) -> str:
        limit = self.max_text if limit is None else limit
        if not isinstance(v, str):
            raise self.error(where, f"{self.error.shown(v)}, not a string")
        if len(v) > limit:
            raise self.error(where, f"a string of {len(v)} characters, more than {limit}")
        if not self.printable:
            return v
        return (_CONTROL if lines else _CONTROL_LINE).sub("\ufffd", v)

    def items(self, v: Any, where: str, limit: int | None = None) -> list:
        limit = self.max_items if limit is None else limit
        if not isinstance(v, list):
            raise self.error(where, f"{self.error.shown(v)}, not a list")
        if len(v) > limit:
            raise self.error(where, f"a list of {len(v)} items, more than {limit}")
        return v

    def obj(self, v: Any, where: str, limit: int = MAX_KEYS) -> dict:
        if not isinstance(v, dict):
            raise self.error(where, f"{self.error.shown(v)}, not an object")
        if len(v) > limit:
            raise self.error(where, f"an object of {len(v)} keys, more than {limit}")
        return v

    def choice(self, v: Any, where: str, allowed: Collection[str]) -> str:
        s = self.text(v, where, MAX_KEY_TEXT)
        if s not in allowed:
            raise self.error(where, f"{s!r} is not one of "
                                    f"{', '.join(sorted(map(str, allowed)))}")
        return s

    def required(self, d: dict, key: str, prefix: str = "") -> Any:
        """d[key], else the error naming prefix + key as missing."""
        if key not in d:
            raise self.error(prefix + key, "missing")
        return d[key]

    def optional(self, read: Callable[..., Any], v: Any, where: str, *args, **kw) -> Any:
        """None, or read(v, where, ...)."""
        return None if v is None else read(v, where, *args, **kw)

    def within(self, prefix: str, parse: Callable[[Any], Any], v: Any) -> Any:
        """parse(v) for a record nested at `prefix`: its error's field named from the top."""
        try:
            return parse(v)
        except self.error as exc:
            field = prefix if exc.field == RECORD else f"{prefix}.{exc.field}"
            raise self.error(field, exc.why) from None

    def record(self, cls, v: Any, where: str, *, fields: Mapping[str, Read] | None = None,
               readers: Mapping[type, Read] | None = None) -> dict[str, Any]:
        """The keyword arguments of the dataclass `cls` from the object `v`, each read by its
        type; `fields` reads a field by name (this level), `readers` a type (everywhere)."""
        d = self.obj(v, where)
        hints = _hints(cls)
        unknown = sorted(k for k in d if k not in hints)
        if unknown:
            raise self.error(f"{where}.{line(unknown[0], 40)}", f"not a field of {cls.__name__}")
        out = {}
        for f in dataclasses.fields(cls):
            path = f"{where}.{f.name}"
            if f.name not in d:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise self.error(path, "missing")
                continue
            read = (fields or {}).get(f.name)
            out[f.name] = read(d[f.name], path) if read else \
                self.value(hints[f.name], d[f.name], path, readers or {})
        return out

    def value(self, tp, v: Any, where: str, readers: Mapping[type, Read]) -> Any:
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
            return self.value(inner[0], v, where, readers)
        if origin is tuple:
            got = self.items(v, where)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self.value(args[0], x, f"{where}[{i}]", readers)
                             for i, x in enumerate(got))
            if len(got) != len(args):
                raise self.error(where, f"a list of {len(got)} items, not {len(args)}")
            return tuple(self.value(a, x, f"{where}[{i}]", readers) for i, (a, x) in
                         enumerate(zip(args, got)))
        if origin is dict and args[0] is str:
            return {self.text(k, f"{where} key", MAX_KEY_TEXT):
                    self.value(args[1], x, f"{where}.{line(k, 40)}", readers)
                    for k, x in self.obj(v, where).items()}
        if tp is bool:
            return self.flag(v, where)
        if tp is int:
            return self.integer(v, where)
        if tp is float:
            return self.number(v, where)
        if tp is str:
            return self.text(v, where)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return tp(self.choice(v, where, [m.value for m in tp]))
        if dataclasses.is_dataclass(tp):
            return tp(**self.record(tp, v, where, readers=readers))
        raise TypeError(f"{where}: no reader for {tp}")


def line(v: Any, limit: int) -> str:
    """Any string as one printable line of at most `limit` characters (cut with "…")."""
    s = _CONTROL_LINE.sub(" ", v if isinstance(v, str) else "")
    return s if len(s) <= limit else s[:limit - 1] + "…"


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


NET = Reader(WireError, max_text=MAX_TEXT, max_items=MAX_ITEMS, printable=True)
loads, integer, number, flag, text = NET.loads, NET.integer, NET.number, NET.flag, NET.text
items, obj, choice, record, value = NET.items, NET.obj, NET.choice, NET.record, NET.value
