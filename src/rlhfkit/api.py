"""The Python API: one `train(config)` for every trainer, chosen by the config's class.

    from rlhfkit import GRPOConfig, train

    def reward(completions, **kwargs):          # TRL's reward signature
        return [float(len(c) < 40) for c in completions]

    summary = train(GRPOConfig(prompts=my_dataset, reward=reward, iterations=10))

A config built directly is checked as the command line checks it (types, ranges, the options'
relations) before anything loads; values only Python can give (a reward function, a
``datasets.Dataset``) pass through and config.yaml records them by import path or with a note
(core/recorded.py). docs/python-api.md has runnable examples.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from rlhfkit.commands import (  # noqa: F401  (COMMAND_CONFIGS, TRAINER_COMMANDS: part of the API)
    COMMAND_CONFIGS,
    CONFIGS,
    TRAINER_COMMANDS,
    config_class,
)


def checked(cfg: Any) -> Any:
    """`cfg` rebuilt through runtime.config.build_config: coerced and validated like a command line."""
    from rlhfkit.core.config import build_config

    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return build_config(type(cfg), values, source="config")


def train(cfg: Any) -> dict:
    """Train with any rlhfkit config (GRPOConfig, PPOConfig, SFTConfig, DPOConfig, ...); returns the
    run's summary (also RUN/summary.json). Bad values raise rlhfkit.errors.UserError (one line)."""
    name = next((k.__name__ for k in type(cfg).__mro__ if k.__name__ in CONFIGS), None)
    if name is None or not dataclasses.is_dataclass(cfg):
        raise TypeError(f"train() takes an rlhfkit config ({', '.join(CONFIGS)}), got {type(cfg).__name__}")
    if cfg.resume not in (None, "", "auto"):  # another command's run: the CLI's message
        from rlhfkit.core.command_line import check_resumed_command

        command = next(c for c, k in COMMAND_CONFIGS.items() if k == name)
        check_resumed_command(str(cfg.resume), command)
    return importlib.import_module(CONFIGS[name][1]).train(checked(cfg))
