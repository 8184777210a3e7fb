"""Overrides the caller's globals from the command line: `config/file.py` files are executed,
`--key=value` pairs are parsed as Python literals (strings stay strings). Executed, not
imported, by train.py: `exec(open("configurator.py").read())` from the working directory."""
import sys
from ast import literal_eval

for _arg in sys.argv[1:]:
    if not _arg.startswith("--"):
        exec(open(_arg).read())
        continue
    _key, _, _val = _arg[2:].partition("=")
    if _key not in globals():
        raise ValueError(f"unknown config key: {_key}")
    try:
        _val = literal_eval(_val)
    except (SyntaxError, ValueError):
        pass
    if type(_val) is not type(globals()[_key]):
        raise ValueError(f"--{_key}={_val!r}: expected {type(globals()[_key]).__name__}")
    globals()[_key] = _val
