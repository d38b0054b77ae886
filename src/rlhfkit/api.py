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

from rlhfkit.commands import COMMANDS

# the trainers: the commands whose config a `train()` in rlhfkit.trainers runs
TRAINER_COMMANDS = {name: c for name, c in COMMANDS.items() if c.run.startswith("rlhfkit.trainers.")}

# command -> its config class (`rlhfkit COMMAND` parses into this)
COMMAND_CONFIGS: dict[str, str] = {name: c.config.split(":")[1] for name, c in TRAINER_COMMANDS.items()}

# config class -> (the module of the config, the module whose train() runs it); subclasses share a
# train(): RLOO/GSPO/DAPO/REINFORCE++ run GRPO's, SimPO/ORPO DPO's
CONFIGS: dict[str, tuple[str, str]] = {c.config.split(":")[1]: (c.config.split(":")[0], c.run.split(":")[0])
                                       for c in TRAINER_COMMANDS.values()}


def config_class(name: str) -> type:
    """The config class called `name` (e.g. "GRPOConfig")."""
    return getattr(importlib.import_module(CONFIGS[name][0]), name)


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
        from rlhfkit.core.config import check_resumed_command

        command = next(c for c, k in COMMAND_CONFIGS.items() if k == name)
        check_resumed_command(str(cfg.resume), command)
    return importlib.import_module(CONFIGS[name][1]).train(checked(cfg))
