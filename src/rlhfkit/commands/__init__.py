"""The commands `rlhfkit COMMAND` runs, listed once (`COMMANDS`): the CLI dispatches from this list,
the pipeline runs its stages through it and `estimate-memory` takes the trainers' configs from it.
Each entry names its code by import path, so reading the list imports nothing. The trainers are
commands too (their modules sit in trainers/); the other commands' modules sit in this package.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from types import MappingProxyType
from typing import Any


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: `main` ("module:function", takes argv and returns an exit code; "" where the
    command line is the config's and `run` runs it: the trainers, eval, tpo, see `command_main`), its
    one-line `summary` for `rlhfkit --help`, the "module:Class" of the `config` its options parse into
    (the config-driven commands: key=value and --key value alike, core/command_line.py), the
    "module:function" that `run`s such a config in-process, and for an argparse command the
    "module:function" that builds its `parser` (read through core/argv.py `parse_command_line`, which
    takes both styles too)."""

    main: str
    summary: str
    config: str = ""
    run: str = ""
    parser: str = ""


def _trainer(module: str, config: str, summary: str) -> Command:
    return Command("", summary, f"rlhfkit.trainers.{config}", f"rlhfkit.trainers.{module}:train")


COMMANDS: MappingProxyType[str, Command] = MappingProxyType({
    "ppo": _trainer("ppo", "ppo_config:PPOConfig", "PPO with GAE and a value head (the default demo)"),
    "trpo": _trainer("trpo", "trpo_config:TRPOConfig", "TRPO: a natural-gradient step inside a KL trust region"),
    "sft": _trainer("sft", "sft_config:SFTConfig", "supervised fine-tuning (LoRA or full)"),
    "rm": _trainer("rm", "rm_config:RMConfig", "train a reward model on preference pairs"),
    "dpo": _trainer("dpo", "dpo_config:DPOConfig", "direct preference optimisation (sigmoid, IPO, cDPO)"),
    "simpo": _trainer("dpo", "dpo_config:SimPOConfig", "SimPO: reference-free, length-normalised, with a margin"),
    "orpo": _trainer("dpo", "dpo_config:ORPOConfig", "ORPO: SFT plus an odds-ratio preference term, no reference"),
    "kto": _trainer("kto", "kto_config:KTOConfig", "KTO: desirable / undesirable completions, no pairs needed"),
    "online-dpo": _trainer("online_dpo", "online_dpo_config:OnlineDPOConfig",
                           "online DPO: two samples per prompt, a judge picks, DPO step"),
    "grpo": _trainer("grpo", "grpo_config:GRPOConfig", "GRPO: group-relative policy optimisation"),
    "rloo": _trainer("grpo", "grpo_config:RLOOConfig", "RLOO: REINFORCE with a leave-one-out baseline"),
    "gspo": _trainer("grpo", "grpo_config:GSPOConfig", "GSPO: GRPO with sequence-level importance ratio and clip"),
    "dapo": _trainer("grpo", "grpo_config:DAPOConfig", "DAPO: clip-higher, dynamic sampling, overlong reward shaping"),
    "reinforce_pp": _trainer("grpo", "grpo_config:ReinforcePPConfig",
                             "REINFORCE++: KL in the reward, batch-normalised returns"),
    "distill": _trainer("distill", "distill_config:DistillConfig",
                        "distillation: on-policy reverse KL or GKD's JSD to a teacher (teacher=MODEL)"),
    "prefs": Command("rlhfkit.commands.prefs:main", "build preference data offline (`prefs make`)",
                     "rlhfkit.commands.prefs:PrefsConfig", "rlhfkit.commands.prefs:make_preferences"),
    "eval": Command("", "evaluate a model on a prompt set",
                    "rlhfkit.commands.evaluate_config:EvalConfig", "rlhfkit.commands.evaluate:evaluate"),
    "generate": Command("rlhfkit.commands.generate:main", "sample completions from a model",
                        parser="rlhfkit.commands.generate:build_parser"),
    "serve-reward": Command("rlhfkit.commands.serve_reward:main",
                            "host a reward as a server in OpenRLHF's remote reward protocol",
                            parser="rlhfkit.commands.serve_reward:build_parser"),
    "export": Command("rlhfkit.commands.export:main",
                      "write a run as a transformers/peft/vLLM folder with a model card; --push-to-hub",
                      parser="rlhfkit.commands.export:build_parser"),
    "serve": Command("rlhfkit.commands.serve:main", "serve a model through an OpenAI-compatible API (batched)",
                     parser="rlhfkit.commands.serve:build_parser"),
    "tpo": Command("", "test-time preference optimisation (textual feedback) vs best-of-N",
                   "rlhfkit.commands.tpo:TPOConfig", "rlhfkit.commands.tpo:run"),
    "pipeline": Command("rlhfkit.commands.pipeline:main", "SFT -> preferences -> RM -> PPO -> eval"),
    "label": Command("rlhfkit.label.cli:main", "collect human preferences in a local web app",
                     parser="rlhfkit.label.cli:build_parser"),
    "doctor": Command("rlhfkit.commands.doctor:doctor_main", "print training-health findings for a run",
                      parser="rlhfkit.commands.doctor:doctor_parser"),
    "report": Command("rlhfkit.commands.doctor:report_main", "build an HTML report of one or more runs",
                      parser="rlhfkit.commands.doctor:report_parser"),
    "selfcheck": Command("rlhfkit.commands.selfcheck:main", "check the RL maths on worked examples",
                         parser="rlhfkit.commands.selfcheck:build_parser"),
    "estimate-memory": Command("rlhfkit.commands.estimate_memory:main",
                               "memory per device of a run, component by component",
                               "rlhfkit.estimate.memory:MemoryArgs"),
})


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


def command_main(name: str) -> Callable[[list[str]], int]:
    """What `rlhfkit NAME ARGS...` calls with ARGS: the command's own `main` (imported now), or its config
    parsed from ARGS ([CONFIG.yaml] key=value ..., or --help) and run by its `run` (a trainer's `train`),
    which is imported only once the command line is read: --help and a mistyped option answer without
    loading torch."""
    command = COMMANDS[name]
    if command.main:
        return load(command.main)
    from rlhfkit.core.command_line import config_main  # here: `rlhfkit --help` does not import it

    return functools.partial(config_main, load(command.config), functools.partial(load, command.run),
                             prog=f"rlhfkit {name}")


def load(target: str) -> Any:
    """The object a "module:name" import path names (imported now)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
