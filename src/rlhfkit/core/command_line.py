"""The command line of a config-driven command (the trainers, eval, tpo, prefs make, estimate-memory):
``[CONFIG.yaml] [key=value | --key value ...]`` read into the values `core.config.build_config` types and
checks (later values win; a resumed run folder's config.yaml is the base), and the --help that lists
every option of the config with its type, default and help text.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlhfkit.core.aliases import aliases_of, canonical_key
from rlhfkit.core.config import (
    BOOL_WORDS,
    _base_type,
    _fields,
    _option_name,
    _type_name,
    _unknown_key,
    build_config,
    read_yaml,
)
from rlhfkit.core.run_files import CONFIG, META, latest_checkpoint, resumable_checkpoint
from rlhfkit.core.trl_batch import kept_names, trainer_kind
from rlhfkit.core.trl_values import VALUE_KEYS as TRL_VALUE_KEYS
from rlhfkit.errors import ConfigError, UserError

C = TypeVar("C")


def _yaml_scalar(val: str) -> Any:
    """A command-line value read as YAML reads a scalar (``8`` -> 8), or the text as typed."""
    try:
        return yaml.safe_load(val) if val.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        return val


def _cli_value(cls: type, key: str, val: str) -> Any:
    """A command-line value: YAML scalars (1e-5 -> float, true -> bool, [a, b] -> list), but text
    fields keep the text as typed (run_name=007 stays '007')."""
    base, optional = _base_type(typing.get_type_hints(cls)[key])
    if base is str and not (optional and val.strip().lower() in ("none", "null")):
        return val
    try:
        return yaml.safe_load(val) if val.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        return val


def parse_args(cls: type[C], argv: list[str], prog: str) -> C | None:
    """Parse ``[CONFIG.yaml] [key=value ...]``; return None after printing --help."""
    parsed = parse_values(cls, argv, prog)
    if parsed is None:
        return None
    merged, sources = parsed
    return build_config(cls, _with_resumed_config(cls, merged, prog.split()[-1]), sources=sources)


def parse_values(cls: type, argv: list[str], prog: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The values ``[CONFIG.yaml] [key=value ...]`` give (not yet coerced; an unknown key kept as given,
    for `build_config` to name with the other problems),
    and the YAML file each came from; None after printing --help. For commands whose defaults
    depend on what was given (`rlhfkit estimate-memory`)."""
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(cls, prog))
        return None
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for arg in _flag_values(cls, argv):
        if "=" in arg:  # an unknown key is kept as given: build_config names every problem at once
            given, _, val = arg.partition("=")
            given = given.lstrip("-").replace("-", "_")
            key = canonical_key(given, _fields(cls))
            if given in kept_names(_fields(cls)):  # read with its TRL companions by build_config
                merged[given], sources[given] = _yaml_scalar(val), "command line"
            elif key is None:
                merged[given], sources[given] = val, "command line"
            else:
                merged[key] = _cli_value(cls, key, val)
                sources.pop(key, None)
        elif arg.endswith((".yaml", ".yml")):
            data = {_option_name(cls, str(k)) or k: v for k, v in read_yaml(arg).items()}
            merged.update(data)
            sources.update(dict.fromkeys(data, arg))
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}; options are key=value pairs (see '{prog} --help')")
        else:
            raise ConfigError(f"unexpected argument {arg!r}: expected CONFIG.yaml or key=value")
    return merged, sources


def _flag_values(cls: type, argv: list[str]) -> list[str]:
    """Flags in the two-word form as ``key=value``: ``--resume RUN_DIR`` -> ``resume=RUN_DIR``,
    ``--learning_rate 1e-5`` -> ``learning_rate=1e-5`` (as TRL's and transformers' scripts take them),
    ``--config FILE.yaml`` -> ``FILE.yaml``; a boolean option alone (``--gradient_checkpointing``) is true."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        following = argv[i + 1] if i + 1 < len(argv) else None
        pair = following is not None and "=" in following and _option_name(
            cls, following.partition("=")[0].replace("-", "_")) is not None  # key=value, not a value
        takes_next = following is not None and not following.startswith("--") and not pair
        if arg == "--resume" and not takes_next:
            raise ConfigError("--resume needs a run folder: --resume RUN_DIR (or resume=auto)")
        if arg == "--config" and takes_next:
            out.append(following)
            i += 2
            continue
        key = _option_name(cls, arg[2:].replace("-", "_")) if arg.startswith("--") and "=" not in arg else None
        if key is None and arg[2:] in TRL_VALUE_KEYS and arg.startswith("--") and takes_next:  # --report_to none
            out.append(f"{arg[2:]}={following}")
            i += 2
            continue
        hints = typing.get_type_hints(cls)
        is_bool = key in hints and _base_type(hints[key])[0] is bool
        if key is not None and takes_next and (not is_bool or str(following).lower() in BOOL_WORDS):
            out.append(f"{key}={following}")
            i += 2
            continue
        if is_bool:
            out.append(f"{key}=true")
        elif key is not None:
            raise ConfigError(f"{arg} needs a value: {arg} VALUE or {arg[2:]}=VALUE (see --help)")
        else:
            out.append(arg)
        i += 1
    return out


def saved_config(run_dir: str | Path) -> dict:
    """The configuration of a run to resume (the base that command-line overrides change): the one
    saved with its newest checkpoint, else RUN/config.yaml (which a failed attempt may have changed)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"resume: {run_dir} is not a run folder")
    return read_yaml((resumable_checkpoint(run_dir)[0] or run_dir) / CONFIG)


def run_command(run_dir: str | Path) -> str | None:
    """The command (sft, dpo, ...) that wrote a run folder's newest checkpoint, or None."""
    import json

    found = latest_checkpoint(run_dir)
    try:
        command = json.loads((found / META).read_text()).get("command") if found else None
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) else None


def _with_resumed_config(cls: type, merged: dict[str, Any], command: str = "") -> dict[str, Any]:
    """Resuming a run folder: its saved config.yaml is the base that the given keys override. A
    folder of another command's run is named as such (its keys would be unknown here)."""
    resume = merged.get("resume")
    if resume in (None, "", "auto") or "resume" not in _fields(cls):
        return merged
    base = saved_config(str(resume))
    for k in base:
        if k not in _fields(cls):
            check_resumed_command(str(resume), command)
            raise _unknown_key(k, _fields(cls), f"{resume}/config.yaml")
    return {**base, **merged}


def check_resumed_command(resume: str, command: str) -> None:
    """A run folder written by another command is refused by name (the CLI and the Python API alike)."""
    other = run_command(resume)
    if other and other != command:
        raise ConfigError(f"resume: {resume} is a {other} run, not a {command} run: continue it with "
                          f"rlhfkit {other} --resume {resume}")


def config_main(cls: type[C], import_run: typing.Callable[[], typing.Callable[[C], Any]], argv: list[str],
                prog: str) -> int:
    """Entry of a config-driven command: parse ``[CONFIG.yaml] key=value ...`` (or print --help), then
    import the command's code (`import_run()` returns its run function) and run it: --help and a bad
    option answer before torch and the model code load."""
    cfg = parse_args(cls, argv, prog)
    if cfg is not None:
        import_run()(cfg)
    return 0


def help_text(cls: type, prog: str) -> str:
    doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
    lines = [f"usage: {prog} [CONFIG.yaml] [key=value | --key value ...]", "", doc, "", "options (key=value or --key value):"]
    hints = typing.get_type_hints(cls)
    fields = _fields(cls)
    for f in dataclasses.fields(cls):
        base, optional = _base_type(hints[f.name])
        tname = _type_name(base) + (" | None" if optional else "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        choices = f.metadata.get("choices")
        extra = f" {{{'|'.join(map(str, choices))}}}" if choices else ""
        also = aliases_of(f.name, fields)
        extra += f" (also: {', '.join(also)})" if also else ""
        lines.append(f"  {f.name} ({tname}, default {default!r}){extra}")
        lines.append(f"      {f.metadata.get('help', '')}")
    generation = {"generation_batch_size", "steps_per_generation", "num_iterations"}  # GRPO's only
    trl = sorted(kept_names(fields) - generation if trainer_kind(fields) != "group" else kept_names(fields))
    if trl:
        lines += ["", f"TRL's names, read together as TRL reads them (the same work per optimiser step; a run "
                  f"prints one line saying what a step does): {', '.join(trl)}"]
    if "generation_batch_size" in kept_names(fields) and trainer_kind(fields) != "group":
        lines += ["generation_batch_size: the former name of prompts_per_generate (still read, with a note)"]
    if "lora" in fields:
        lines += ["peft_config: a peft LoraConfig (Python) or a mapping of its fields (YAML): its r, lora_alpha, "
                  "lora_dropout, target_modules; None = full fine-tuning"]
    return "\n".join(lines)
