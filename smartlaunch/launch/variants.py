"""--each / --each-file: the script arguments of each independent job, one line of shell-quoted
arguments split as `shlex.split(line, comments=True)` would, in linear time (shlex is quadratic
in a token's length)."""
from __future__ import annotations

import re

from smartlaunch.errors import UsageError
from smartlaunch.store import read_capped

MAX_EACH_FILE_BYTES = 1 << 20      # 1 MiB, as for policy files; a sweep is a few KiB

# Outside quotes: whitespace ends a word, '#' starts a comment (mid-word too, as shlex does
# with comments=True), a backslash escapes the next character, quotes open.
_OUTSIDE = re.compile(r"""(?P<space>[ \t\r\n]+)|(?P<comment>\#[^\n]*)|(?P<plain>[^ \t\r\n'"\\\#]+)
                          |(?P<escape>\\)|(?P<single>')|(?P<double>")""", re.X)
_DOUBLE_RUN = re.compile(r'[^"\\]*')


def split_words(line: str) -> list[str]:
    """shlex.split(line, comments=True), in time linear in len(line); ValueError as shlex."""
    words: list[str] = []
    parts: list[str] = []
    quoted = False                 # '' and "" are words of their own, as in a shell
    pos, n = 0, len(line)
    while pos < n:
        m = _OUTSIDE.match(line, pos)
        kind, pos = m.lastgroup, m.end()
        if kind in ("space", "comment"):
            if parts or quoted:
                words.append("".join(parts))
            parts, quoted = [], False
        elif kind == "plain":
            parts.append(m.group())
        elif kind == "escape":
            if pos >= n:
                raise ValueError("No escaped character")
            parts.append(line[pos])
            pos += 1
        elif kind == "single":
            end = line.find("'", pos)
            if end < 0:
                raise ValueError("No closing quotation")
            parts.append(line[pos:end])
            pos, quoted = end + 1, True
        else:
            pos, quoted = _double_quoted(line, pos, parts), True
    if parts or quoted:
        words.append("".join(parts))
    return words


def _double_quoted(line: str, pos: int, parts: list[str]) -> int:
    """From just after an opening '"' to just after its closing one. Inside, a backslash
    escapes only '"' and itself; before any other character it stays."""
    n = len(line)
    while True:
        run = _DOUBLE_RUN.match(line, pos)
        parts.append(run.group())
        pos = run.end()
        if pos >= n:
            raise ValueError("No closing quotation")
        if line[pos] == '"':
            return pos + 1
        if pos + 1 >= n:                 # a backslash at the very end
            raise ValueError("No escaped character")
        nxt = line[pos + 1]
        parts.append(nxt if nxt in '"\\' else "\\" + nxt)
        pos += 2


def parse_each(arg: str, *, where: str = "--each") -> tuple[str, ...]:
    """One --each value -> the args appended to the script's own (shell quoting, # comments)."""
    try:
        return tuple(split_words(arg))
    except ValueError as exc:
        raise UsageError(f"{where} {arg[:80]!r}: {exc}; quote each variant's args as a shell "
                         f"would") from None


def parse_each_file(path: str) -> list[tuple[str, ...]]:
    """One variant per line (shell-quoted script args); '#' comments and blank lines ignored."""
    try:
        data = read_capped(path, MAX_EACH_FILE_BYTES)
        if data is None:
            raise UsageError(f"--each-file {path} is larger than {MAX_EACH_FILE_BYTES >> 20} MiB "
                             f"(the limit for --each-file); name the right file or split the sweep")
        lines = data.decode("utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"--each-file {path}: no such file; give a file with one line of script "
                         "args per job") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--each-file {path}: cannot read it ({exc}); give a readable UTF-8 text file") from None
    variants = [parse_each(line, where=f"--each-file {path} line {n}:")
                for n, line in enumerate(lines, 1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not variants:
        raise UsageError(f"--each-file {path} has no variants (only comments or blank lines); "
                         "add one line of script args per job")
    return variants
