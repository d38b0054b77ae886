"""Which command made a run folder (`run_method`) and that command's default config (`config_defaults`),
for `rlhfkit export` and the HTML report of `rlhfkit report`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rlhfkit.commands import COMMAND_CONFIGS, COMMANDS, config_class
from rlhfkit.core.recorded import recorded_value


def run_method(run_dir: Path, config: dict) -> str:
    """The command that made the run: from a checkpoint's meta.json, else the default run name
    (COMMAND-DATE-TIME), else the config's telltale keys."""
    for meta in sorted((run_dir / "checkpoints").glob("step-*/meta.json")):
        try:
            return str(json.loads(meta.read_text())["command"])
        except (OSError, ValueError, KeyError):
            continue
    prefix = run_dir.name.split("-", 1)[0]
    if prefix in COMMANDS:
        return prefix
    for key, method in (("vf_coef", "ppo"), ("prefs", "dpo"), ("group_size", "grpo"), ("data", "sft")):
        if key in config:
            return method
    return "rlhfkit"


def config_defaults(run_dir: Path, config: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(command, its default config as config.yaml records it) for a run folder; None when the command
    is not known (another tool's folder)."""
    command = run_method(Path(run_dir), config)
    if command not in COMMAND_CONFIGS:
        return None
    fields = dataclasses.fields(config_class(COMMAND_CONFIGS[command]))
    return command, {f.name: recorded_value(f.default if f.default is not dataclasses.MISSING
                                            else f.default_factory()) for f in fields}  # type: ignore[misc]
