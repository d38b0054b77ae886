"""Typed configs: one dataclass per command drives the Python API, YAML files and the CLI.

Every field is documented once, in ``field(metadata={"help": ...})``; that text becomes
``--help``. A command line is ``[CONFIG.yaml] [key=value ...]``; later values win (core/command_line.py
reads it into the values `build_config` types and checks).
Validation errors are one line naming the key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlhfkit.core.aliases import alias_hint, canonical_key
from rlhfkit.core.bounds import check_count
from rlhfkit.core.disk import write_atomic
from rlhfkit.core.recorded import recorded_value
from rlhfkit.core.trl_batch import kept_names, trl_batch_values
from rlhfkit.core.trl_data import TOP_KEYS, trl_data_values
from rlhfkit.core.trl_peft import peft_values
from rlhfkit.core.trl_values import translate
from rlhfkit.errors import ConfigError

C = TypeVar("C")
BOOL_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")


def option(default: Any, help: str, choices: tuple | None = None, several: bool = False) -> Any:
    """A config field with its help text (and optional allowed values). `several`: a text option that
    also takes a YAML list of texts, kept as ``a,b`` (TRL's ``reward_funcs: [a, b]``)."""
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if several:
        meta["several"] = True
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class _Retuned:
    default: Any
    help: str | None


def retune(default: Any = dataclasses.MISSING, help: str | None = None) -> Any:
    """In a trainer config (a FrozenAfterValidation subclass): an option that a base class or option
    group declares, with this command's own default and/or --help text, written without a type
    (``lr = retune(2e-4, "AdamW learning rate (LoRA default; ...)")``). The option keeps its type,
    choices, checks and place in --help; it is not a second declaration."""
    return _Retuned(default, help)


def _retuned_fields(name: str, bases: tuple[type, ...], namespace: dict) -> None:
    """Turn each `retune()` in a class body into the inherited field with the new default/help."""
    inherited: dict[str, dataclasses.Field] = {}
    for base in reversed(bases):  # as the dataclass resolves it: the first base that has the option, as it has it
        inherited.update(getattr(base, "__dataclass_fields__", {}))
    declared_types = namespace.setdefault("__annotations__", {})
    for key, value in list(namespace.items()):
        if not isinstance(value, _Retuned):
            continue
        if key not in inherited:
            raise TypeError(f"{name}.{key}: retune() needs an option a base class declares")
        base = inherited[key]
        default = value.default if value.default is not dataclasses.MISSING else (
            base.default if base.default is not dataclasses.MISSING else base.default_factory())  # type: ignore[misc]
        meta = {**base.metadata, "retuned": True, **({"help": value.help} if value.help else {})}
        declared_types[key] = base.type
        namespace[key] = (dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
                          if isinstance(default, (list, dict)) else dataclasses.field(default=default, metadata=meta))


# An integer option that also takes a word (`micro_batch_size=auto`): a count where the value reads as
# one, else the text as given (the config's validate() names the words it takes).
COUNT_OR_WORD = int | str


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, optional?) for `X`, `X | None`, `Optional[X]`, `int | str`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if set(args) == {int, str}:
            return COUNT_OR_WORD, type(None) in typing.get_args(tp)
        return (args[0] if len(args) == 1 else str), True
    return tp, False


def _type_name(tp: Any) -> str:
    """``float``, ``list[int]``: how a type is shown in messages and --help."""
    return str(tp) if typing.get_origin(tp) is not None else getattr(tp, "__name__", str(tp))


def _coerce(key: str, raw: Any, tp: Any, choices: tuple | None, source: str) -> Any:
    """``raw`` (from YAML or the command line) as type ``tp``, or a one-line ConfigError."""
    base, optional = _base_type(tp)
    where = f"{source}: " if source else ""
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null") and optional):
        if optional:
            return None
        raise ConfigError(f"{where}{key}: null is not allowed (expected {_type_name(base)})")
    try:
        value = _convert(raw, base)
    except (TypeError, ValueError, OverflowError):
        finite = " (a finite number)" if base is float or "float" in _type_name(base) else ""
        raise ConfigError(f"{where}{key}={raw!r}: expected {_type_name(base)}{finite}") from None
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}{key}={value!r}: expected one of {', '.join(map(str, choices))}")
    return value


def coerce(key: str, raw: Any, tp: Any, choices: tuple | None = None, source: str = "") -> Any:
    """One value as type ``tp`` (``int``, ``list[str]``, ``float | None``, ...), or a one-line ConfigError."""
    return _coerce(key, raw, tp, choices, source)


def _convert(raw: Any, base: Any) -> Any:
    """Convert one value; TypeError/ValueError/OverflowError when it is not a ``base``."""
    if base is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).lower()
        if text in BOOL_WORDS:
            return text in ("1", "true", "yes", "on")
        raise ValueError
    if base == COUNT_OR_WORD:
        try:
            return _convert(raw, int)
        except (TypeError, ValueError, OverflowError):
            if isinstance(raw, str):
                return raw
            raise
    if base is int:
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError
        return int(float(raw)) if isinstance(raw, str) and "e" in raw.lower() else int(raw)
    if base is float:
        value = float(raw) if not isinstance(raw, (bool, dict, list)) else None
        if value is None or not math.isfinite(value):  # nan, inf: no option means them
            raise ValueError
        return value
    if base is list or typing.get_origin(base) is list:
        items = _as_list(raw)
        element = (typing.get_args(base) or (None,))[0]
        return items if element is None else [_convert(x, element) for x in items]
    if base is str:
        if in_memory(raw):  # the Python API: a reward function, a datasets.Dataset, records in memory
            return raw
        if isinstance(raw, (dict, list)):
            raise ValueError
        return str(raw)
    return raw


def in_memory(raw: Any) -> bool:
    """A value only the Python API gives a text option: a callable (reward), a datasets.Dataset or
    DatasetDict, a list of record dicts or of callables (several rewards)."""
    if isinstance(raw, str):
        return False
    if callable(raw) or (hasattr(raw, "column_names") and hasattr(raw, "num_rows")):
        return True
    if not isinstance(raw, (list, tuple)) or not raw:
        return False
    return all(isinstance(x, dict) for x in raw) or (any(callable(x) for x in raw)
                                                     and all(callable(x) or isinstance(x, str) for x in raw))


def _as_list(raw: Any) -> list:
    """A YAML list as is; ``a,b`` on the command line as ``["a", "b"]``; a scalar as ``[scalar]``."""
    if isinstance(raw, (list, tuple)):
        return list(raw)
    if isinstance(raw, dict):
        raise ValueError
    if isinstance(raw, str):
        return [s.strip() for s in raw.split(",") if s.strip()]
    return [raw]


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _unknown_key(key: Any, known: typing.Iterable[str], source: str) -> ConfigError:
    key = str(key)  # YAML keys may be numbers, null, booleans
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}unknown config key {key!r}{alias_hint(key, known)}")


def _field_key(cls: type, key: Any, source: str) -> str:
    """The option of `cls` that `key` names (its own name or an alias: TRL's `learning_rate` is `lr`,
    core/aliases.py), or a one-line ConfigError with a hint."""
    name = canonical_key(str(key), _fields(cls))
    if name is None:
        raise _unknown_key(key, _fields(cls), source)
    return name


def build_config(cls: type[C], values: dict[str, Any], source: str = "",
                 sources: dict[str, str] | None = None, problems: list[str] | None = None) -> C:
    """Make `cls` from a mapping, coercing types and rejecting unknown keys, then validate.

    `sources` names where a key came from (a YAML file) for its error messages. Every class in
    `cls`'s MRO that defines its own ``validate()`` runs it, mixins first (so ModelArgs and
    SamplingArgs check their fields for every trainer). A trainer config (FrozenAfterValidation)
    is read-only while it is validated; then the values its classes' ``derived()`` work out are
    applied (dataclasses.replace) and the result is frozen.

    Every problem is reported at once, in one ConfigError (`problems`: those the caller found
    already, e.g. unknown keys of a command line): each key's type, then each class's first failed
    check (a check that names a key with a type problem is left out: it saw the default instead).
    """
    fields = _fields(cls)
    hints = typing.get_type_hints(cls)
    values, translated = translate(values, fields)  # TRL's report_to, dtype=bfloat16, ... (core/trl_values.py)
    for given, line in translated:
        where = (sources or {}).get(given, source)
        problems = [*(problems or []), f"{where}: {line}" if where else line]
    problems = list(problems or [])
    values, said = _trl_values(cls, values, problems, source)
    kwargs, bad = {}, set()
    for given, raw in values.items():
        if given == FROZEN_FLAG:  # {**vars(cfg), ...} of a built config carries the flag: not an option
            continue
        try:
            key = _field_key(cls, given, (sources or {}).get(given, source))
            where = (sources or {}).get(given, (sources or {}).get(key, source))
            if fields[key].metadata.get("several") and isinstance(raw, (list, tuple)) and all(isinstance(x, str) for x in raw):
                raw = ",".join(raw)  # reward: [a, b] is reward=a,b
            value = _coerce(key, raw, hints[key], fields[key].metadata.get("choices"), where)
            _check_text(given, key, value, where)
            if isinstance(value, int) and not isinstance(value, bool):
                check_count(key, value, where)
            kwargs[key] = value
        except ConfigError as e:
            problems.append(str(e))
            bad.add(canonical_key(str(given), fields) or str(given))
    cfg = freeze(_construct(cls, kwargs))  # validate() only reads: a derived value is `derived()`'s
    problems = list(dict.fromkeys(problems + _validation_problems(cfg, bad)))  # two classes may check one range
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else f"{len(problems)} problems: " + "; ".join(problems))
    if said and os.environ.get("RANK", "0").strip() in ("", "0"):  # once, from the main process
        print(f"rlhfkit: {said}", file=sys.stderr, flush=True)
    if not isinstance(cfg, FrozenAfterValidation):
        return cfg
    return freeze(_construct(cls, {**_init_values(cfg), **derived_values(cfg)}))


def _trl_values(cls: type, values: dict[str, Any], problems: list[str],
                source: str = "") -> tuple[dict[str, Any], str | None]:
    """`values` with TRL's keys read as TRL reads them: a peft LoraConfig as the lora options
    (core/trl_peft.py), its data keys (``datasets:`` mixtures) as the data option (core/trl_data.py),
    its batch options as the rlhfkit options of the same work per step (core/trl_batch.py); and the
    line that says what a step does (None: no TRL batch name). A problem is added to `problems`."""
    fields = _fields(cls)
    try:
        values = trl_data_values(fields, peft_values(fields, values))
        canonical = {str(k): canonical_key(str(k), fields) or str(k) for k in values}
        values, said = trl_batch_values(fields, values, canonical)
    except ConfigError as e:
        problems.append(f"{source}: {e}" if source else str(e))
        dropped = {*kept_names(fields), "peft_config", *TOP_KEYS} - set(fields)
        return {k: v for k, v in values.items() if str(k) not in dropped}, None
    return values, said


def _option_name(cls: type, given: str) -> str | None:
    """The option of `cls` that `given` names, `given` itself where the config reads it as TRL does
    (its batch names: core/trl_batch.py), or None."""
    fields = _fields(cls)
    return given if given in kept_names(fields) else canonical_key(given, fields)


def _validation_problems(cfg: Any, bad: set[str]) -> list[str]:
    """The first failed check of each class's ``validate()`` (mixins first), but none that names a key
    in `bad` (its value is the default, the given one did not parse). A check that cannot run on the
    values so far (a zero divisor another check names) ends the list."""
    found: list[str] = []
    for klass in reversed(type(cfg).__mro__):
        validate = vars(klass).get("validate")
        if not callable(validate):
            continue
        try:
            validate(cfg)
        except ConfigError as e:
            if not any(str(e).startswith((f"{k} (", f"{k}=")) or f" {k} (" in str(e) for k in bad):
                found.append(str(e))
        except (ArithmeticError, TypeError, ValueError):
            if found or bad:
                break
            raise
    return found


def _check_text(given: str, key: str, value: Any, where: str) -> None:
    """A text option (or a list of texts) must be valid Unicode, as data files must: a lone surrogate
    (a YAML "\\ud800" escape, or a byte that is not UTF-8 on the command line, which Python keeps as
    \\udcXX) would reach the tokenizer as a TypeError. One line naming FILE:LINE or the option."""
    texts = value if isinstance(value, list) else [value]
    for text in texts:
        if not isinstance(text, str):
            continue
        bad = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is None:
            continue
        code = ord(text[bad])
        what = (f"byte 0x{code - 0xDC00:02x} is not UTF-8" if 0xDC80 <= code <= 0xDCFF
                else f"a lone surrogate \\u{code:04x}")
        place = _yaml_key_line(where, given) if where.endswith((".yaml", ".yml")) else where
        prefix = f"{place}: " if place else ""
        raise ConfigError(f"{prefix}{key}: not valid Unicode ({what} at character {bad + 1})")


def _yaml_key_line(path: str, key: str) -> str:
    """``FILE:LINE`` of the top-level `key` in a YAML file (``FILE`` when it cannot be found)."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, ValueError, yaml.YAMLError):
        return path
    for key_node, _ in getattr(node, "value", []) if isinstance(node, yaml.MappingNode) else []:
        if str(key_node.value) == key:
            return f"{path}:{key_node.start_mark.line + 1}"
    return path


def _construct(cls: type[C], kwargs: dict[str, Any]) -> C:
    """The dataclass's own __init__, without the validation a ValidatedOnConstruction class adds."""
    return type.__call__(cls, **kwargs)


def _init_values(cfg: Any) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}


class ValidatedOnConstruction(type):
    """Metaclass of FrozenAfterValidation: ``GRPOConfig(lr=1e-5)`` (and ``dataclasses.replace``, which
    calls the class) goes through `build_config`, so a config built in Python is coerced, checked and
    frozen exactly as a command line is: an unknown keyword or a bad value is the CLI's one-line
    ConfigError (named after the class), never a bare TypeError."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict, **kwargs: Any) -> type:
        _retuned_fields(name, bases, namespace)
        return super().__new__(mcls, name, bases, namespace, **kwargs)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        if len(args) > len(names):
            raise ConfigError(f"{cls.__name__} takes keyword options (key=value), got {len(args)} positional values")
        for name, value in zip(names, args):
            if name in kwargs:
                raise ConfigError(f"{cls.__name__}: {name} given twice")
            kwargs[name] = value
        return build_config(cls, kwargs, source=cls.__name__)


FROZEN_FLAG = "_frozen"  # the instance attribute that marks a validated config read-only


class FrozenAfterValidation(metaclass=ValidatedOnConstruction):
    """Mixin of the trainers' configs: however one is built (`build_config` from YAML or the command
    line, the class called in Python, ``dataclasses.replace``) it is coerced, validated and frozen, so
    a field assigned afterwards raises (one line). A value worked out from the options (the resolved
    dtype, a default cap) comes from a class's ``derived()`` (a dict of fields), applied before
    freezing; what the run works out at run time lives in the run (runtime/run.py)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if vars(self).get(FROZEN_FLAG, False):
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__} is frozen after validation: cannot set {name}={value!r} "
                f"(use dataclasses.replace, or keep the derived value in the run)")
        object.__setattr__(self, name, value)


def freeze(cfg: C) -> C:
    """`cfg` with assignment refused from now on (a FrozenAfterValidation config; others unchanged)."""
    if isinstance(cfg, FrozenAfterValidation):
        object.__setattr__(cfg, FROZEN_FLAG, True)
    return cfg


def derived_values(cfg: Any) -> dict[str, Any]:
    """The fields every class in `cfg`'s MRO (mixins first) derives from the validated options
    (its ``derived()``: a dict), later classes winning."""
    values: dict[str, Any] = {}
    for klass in reversed(type(cfg).__mro__):
        derive = vars(klass).get("derived")
        if callable(derive):
            values.update(derive(cfg))
    return values


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (the later would silently win)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    line = first.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if line != key_node.start_mark.line + 1:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {line})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{p}{line}: invalid YAML ({problem})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not a UTF-8 text file (byte {e.start})") from None
    except (OSError, ValueError, RecursionError) as e:  # unreadable; a bad date; absurd nesting
        raise ConfigError(f"{p}: cannot read the config ({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of key: value, got {type(data).__name__}")
    return data


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as YAML can hold it: a callable reward as its import path, a Dataset as a note
    (core/recorded.py)."""
    return {f.name: recorded_value(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def save_config(cfg: Any, path: str | Path) -> None:
    """Write config.yaml in one rename (never an empty or half-written file, even on a full disk)."""
    write_atomic(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False), Path(path).parent)


def check(cond: bool, message: str) -> None:
    """Raise ConfigError(message) unless cond."""
    if not cond:
        raise ConfigError(message)
