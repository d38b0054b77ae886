"""How config.yaml records values the Python API accepts but YAML cannot hold.

A reward given as a function is recorded as ``python:module:name`` when that imports back to the
same function (so `--resume` and `rlhfkit grpo CONFIG.yaml` can rebuild it); a function defined in
``__main__``, inside another function, or a callable object is recorded as a ``<not recorded: ...>``
note that says so. A ``datasets.Dataset`` (or a list of records) is recorded as a note with its
size and columns: the rows themselves belong in a data file.
"""

from __future__ import annotations

import importlib
from typing import Any

NOT_RECORDED = "<not recorded: "


def import_path(fn: Any) -> str | None:
    """``python:module:name`` for a module-level function or class that imports back to `fn`; else None."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not name or module == "__main__" or "." in name or "<" in name:
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception:  # any import failure means: cannot be recorded
        return None
    return f"python:{module}:{name}" if found is fn else None


def recorded_value(value: Any) -> Any:
    """`value` as config.yaml holds it: YAML scalars, lists and mappings as they are; callables,
    datasets and record lists as an import path or a note (module docstring)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): recorded_value(v) for k, v in value.items()}
    if hasattr(value, "column_names") and hasattr(value, "num_rows"):  # datasets.Dataset / DatasetDict
        return f"{NOT_RECORDED}a {type(value).__name__} object ({_rows(value)}); save it to a file to record it>"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        return f"{NOT_RECORDED}{len(value)} records in memory; save them to a file to record them>"
    if isinstance(value, (list, tuple)):
        return [recorded_value(v) for v in value]
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__name__
        return import_path(value) or (f"{NOT_RECORDED}the callable {name} cannot be imported back (defined in "
                                       "__main__, inside a function, or an object); give it again to resume>")
    return f"{NOT_RECORDED}a {type(value).__name__} object>"


def _rows(ds: Any) -> str:
    rows, cols = ds.num_rows, ds.column_names
    if isinstance(rows, dict):  # DatasetDict: {split: rows}
        return ", ".join(f"{split}: {n} rows" for split, n in rows.items())
    return f"{rows} rows, columns {', '.join(cols)}"
