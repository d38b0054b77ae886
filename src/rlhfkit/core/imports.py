"""Import user code named in a spec: ``MODULE:ATTR`` or ``path/to/file.py:ATTR``.

Shared by reward specs (``reward=python:...``) and environment specs (``env=python:...``).
Every failure is a one-line UserError that starts with ``label`` (e.g. ``reward 'python:x:f'``),
so the message names the option the user wrote.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlhfkit.errors import UserError


def split_target(target: str) -> tuple[str, str] | None:
    """``"pkg.mod:Name"`` -> ``("pkg.mod", "Name")``; None when either side is empty or there is no colon.

    The last colon splits, so Windows paths (``C:\\x\\f.py:Name``) keep their drive.
    """
    source, sep, attr = target.rpartition(":")
    if not sep or not source or not attr:
        return None
    return source, attr


def is_file_source(source: str) -> bool:
    """Whether ``source`` names a Python file (``.py`` or a path) rather than a module."""
    return source.endswith(".py") or "/" in source or "\\" in source


def load_source(source: str, label: str) -> Any:
    """The module named by ``source``: a file path (see :func:`is_file_source`) or a dotted module name."""
    return import_file(source, label) if is_file_source(source) else import_module(source, label)


def get_attribute(module: Any, source: str, attr: str, label: str) -> Any:
    """``module.attr``, or a UserError that suggests the closest public callable name."""
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"{label}: {source!r} has no attribute {attr!r}{hint}")
    return getattr(module, attr)


def import_module(name: str, label: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as e:  # ModuleNotFoundError, or anything the module raises on import
        raise UserError(f"{label}: cannot import module {name!r}: {type(e).__name__}: {first_line(e)}") from None


def import_file(path: str, label: str) -> Any:
    """Import a Python file once per resolved path (a second spec naming it gets the same module)."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"{label}: no such file {path!r}")
    # A unique module name per file, so two user files called rewards.py do not collide, and a
    # file that holds both a reward and an environment is imported once.
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    mod_name = f"rlhfkit_user_{file.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    module_spec = importlib.util.spec_from_file_location(mod_name, file)
    if module_spec is None or module_spec.loader is None:
        raise UserError(f"{label}: cannot import {path!r} as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[mod_name]
        if isinstance(e, KeyboardInterrupt):
            raise
        raise UserError(f"{label}: importing {path!r} failed: {type(e).__name__}: {first_line(e)}") from None
    return module


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
