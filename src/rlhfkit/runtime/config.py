"""Typed configs: one dataclass per command drives the Python API, YAML files and the CLI.

Every field is documented once, in ``field(metadata={"help": ...})``; that text becomes
``--help``. A command line is ``[CONFIG.yaml] [key=value ...]``; later values win.
Validation errors are one line naming the key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlhfkit.errors import ConfigError

C = TypeVar("C")


def option(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A config field with its help text (and optional allowed values)."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, optional?) for `X`, `X | None`, `Optional[X]`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), True
    return tp, False


def _coerce(key: str, raw: Any, tp: Any, choices: tuple | None, source: str) -> Any:
    base, optional = _base_type(tp)
    where = f"{source}: " if source else ""
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null") and optional):
        if optional:
            return None
        raise ConfigError(f"{where}{key}: null is not allowed (expected {getattr(base, '__name__', base)})")
    try:
        if base is bool:
            if isinstance(raw, bool):
                value = raw
            elif str(raw).lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError
        elif base is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(float(raw)) if isinstance(raw, str) and "e" in raw.lower() else int(raw)
        elif base is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
        elif typing.get_origin(base) is list or base is list:
            value = list(raw) if isinstance(raw, (list, tuple)) else [s for s in str(raw).split(",") if s]
        elif base is str:
            if isinstance(raw, (dict, list)):
                raise ValueError
            value = str(raw)
        else:
            value = raw
    except (TypeError, ValueError):
        name = getattr(base, "__name__", str(base))
        raise ConfigError(f"{where}{key}={raw!r}: expected {name}") from None
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}{key}={value!r}: expected one of {', '.join(map(str, choices))}")
    return value


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _unknown_key(key: str, known: typing.Iterable[str], source: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}unknown config key '{key}'{hint}")


def build_config(cls: type[C], values: dict[str, Any], source: str = "") -> C:
    """Make `cls` from a mapping, coercing types and rejecting unknown keys, then validate."""
    fields = _fields(cls)
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, raw in values.items():
        if key not in fields:
            raise _unknown_key(key, fields, source)
        kwargs[key] = _coerce(key, raw, hints[key], fields[key].metadata.get("choices"), source)
    cfg = cls(**kwargs)
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        validate()
    return cfg


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{p}{line}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of key: value, got {type(data).__name__}")
    return data


def parse_args(cls: type[C], argv: list[str], prog: str) -> C | None:
    """Parse ``[CONFIG.yaml] [key=value ...]``; return None after printing --help."""
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(cls, prog))
        return None
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for arg in argv:
        if "=" in arg:
            key, _, val = arg.partition("=")
            key = key.lstrip("-").replace("-", "_")
            if key not in _fields(cls):
                raise _unknown_key(key, _fields(cls), "command line")
            try:  # YAML scalars: 1e-5 -> float, true -> bool, [a, b] -> list
                merged[key] = yaml.safe_load(val) if val.strip() else ""
            except yaml.YAMLError:
                merged[key] = val
            sources[key] = "command line"
        elif arg.endswith((".yaml", ".yml")):
            data = read_yaml(arg)
            for k in data:
                if k not in _fields(cls):
                    raise _unknown_key(k, _fields(cls), arg)
            merged.update(data)
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option '{arg}'; options are key=value pairs (see '{prog} --help')")
        else:
            raise ConfigError(f"unexpected argument '{arg}': expected CONFIG.yaml or key=value")
    return build_config(cls, merged)


def config_main(cls: type[C], run: typing.Callable[[C], Any], argv: list[str], prog: str) -> int:
    """Entry of a config-driven command: parse ``[CONFIG.yaml] key=value ...`` (or print --help), run."""
    cfg = parse_args(cls, argv, prog)
    if cfg is not None:
        run(cfg)
    return 0


def help_text(cls: type, prog: str) -> str:
    doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
    lines = [f"usage: {prog} [CONFIG.yaml] [key=value ...]", "", doc, "", "options (key=value):"]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        base, optional = _base_type(hints[f.name])
        tname = getattr(base, "__name__", str(base)) + (" | None" if optional else "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        choices = f.metadata.get("choices")
        extra = f" {{{'|'.join(map(str, choices))}}}" if choices else ""
        lines.append(f"  {f.name} ({tname}, default {default!r}){extra}")
        lines.append(f"      {f.metadata.get('help', '')}")
    return "\n".join(lines)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def check(cond: bool, message: str) -> None:
    """Raise ConfigError(message) unless cond."""
    if not cond:
        raise ConfigError(message)
