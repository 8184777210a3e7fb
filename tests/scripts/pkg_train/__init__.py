"""A training package run with `-m pkg_train` (its entrypoint is __main__.py)."""
