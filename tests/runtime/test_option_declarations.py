"""Each option of the trainers and of the commands that sample without training (eval, tpo, prefs) is
declared once: in an option group (trainers/options.py, trainers/reward_options.py) or in the one config
that has it; a command that wants its own default or help text retunes it (core/config.py `retune`),
which keeps the option's type, choices and checks. Every config-driven command's config is validated and frozen however built."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from rlhfkit.api import CONFIGS, TRAINER_COMMANDS, config_class
from rlhfkit.commands import COMMANDS, load
from rlhfkit.errors import ConfigError

# The configs of the commands that are no trainers and share the trainers' option groups. estimate-memory's
# MemoryArgs is left out: its options describe a trainer's (same names, the trainer's defaults:
# commands/estimate_memory.py TRAINER_OPTIONS) and estimate/ sits below trainers/, so it cannot mix their
# groups in.
SAMPLING_COMMANDS = ("eval", "tpo", "prefs")


def _classes() -> list[type]:
    return [config_class(name) for name in CONFIGS] + [load(COMMANDS[c].config) for c in SAMPLING_COMMANDS]

# Options whose type, choices or meaning differ between commands, so one declaration cannot serve them: each
# named with the reason. The list only shrinks; a new duplicate fails the test.
DIFFERENT_TYPES = {
    "max_steps": "sft/rm: int, 0 = from epochs; dpo/kto: int | None, None = from epochs",
    "micro_batch_size": "ppo/grpo: int | str (auto); the others: int",
    "mini_batch_size": "ppo: int; grpo: int | None (None = the whole rollout)",
    "max_prompt_length": "sampling: int | None (None = the context window); dpo/kto: int",
    "prompt_overflow": "declared with max_prompt_length in both groups (sampling; dpo/kto pairs)",
    "loss_agg": "ppo's choices lack grpo's constant",
    "loss_type": "online-dpo takes the reference losses only",
    "temperature": "rollouts' sampling temperature (also the log-prob pass's), the judged evaluation's, and "
                   "eval/tpo/prefs' (eval: 0 = greedy)",
    "batch_size": "offline trainers: pairs per optimiser step; eval/tpo/prefs: sequences per generate() call",
    "overwrite": "trainers: a run folder (never a live run's, nor one of other files); prefs: its output file",
    "reward": "the RL trainers: several rewards (a,b) summed with reward_weights; tpo: the one score it ranks by",
    "judge": "dpo/kto: a reward function; online-dpo also a reward model, and it makes the pairs",
    "gamma": "ppo: the discount; dpo: simpo's margin",
    "beta": "dpo/kto/grpo: the KL strength (> 0); distill: GKD's JSD mixture weight in [0, 1]",
}


def declarations() -> dict[str, list[str]]:
    """Option name -> the classes (configs and their groups) that declare it (retuned ones and
    class constants not counted)."""
    classes = {k for cls in _classes() for k in cls.__mro__ if dataclasses.is_dataclass(k)}
    found = collections.defaultdict(list)
    for klass in classes:
        fields = {f.name: f for f in dataclasses.fields(klass)}
        for name in vars(klass).get("__annotations__", {}):
            if name in fields and not fields[name].metadata.get("retuned"):
                found[name].append(klass.__name__)
    return found


def test_every_option_is_declared_once():
    repeated = {name: sorted(where) for name, where in declarations().items() if len(where) > 1}
    unexplained = {k: v for k, v in repeated.items() if k not in DIFFERENT_TYPES}
    assert unexplained == {}
    assert sorted(repeated) == sorted(DIFFERENT_TYPES), "an explained duplicate is gone: drop it from the list"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_retuned_option_keeps_its_declarations_type_and_choices(name):
    cls = config_class(name)
    retuned = [f for f in dataclasses.fields(cls) if f.metadata.get("retuned")]
    assert retuned  # every trainer has its own default for some group's option (lr at least)
    for f in retuned:
        declared = next(k.__dataclass_fields__[f.name] for k in reversed(cls.__mro__)
                        if f.name in vars(k).get("__annotations__", {}) and dataclasses.is_dataclass(k))
        assert (f.type, f.metadata.get("choices"), f.metadata.get("several")) == (
            declared.type, declared.metadata.get("choices"), declared.metadata.get("several"))


def test_retune_needs_an_inherited_option():
    from rlhfkit.core.config import retune
    from rlhfkit.trainers.options import RunArgs

    with pytest.raises(TypeError, match="Lonely.nope: retune\\(\\) needs an option a base class declares"):
        @dataclasses.dataclass
        class Lonely(RunArgs):
            nope = retune(3)


@pytest.mark.parametrize("command", [c for c, entry in COMMANDS.items() if entry.config and c not in TRAINER_COMMANDS])
def test_every_other_command_config_is_validated_and_frozen_however_built(command):
    """As the trainers' configs are (tests/runtime/test_frozen_config.py): eval, tpo, prefs, estimate-memory."""
    cls = load(COMMANDS[command].config)
    cfg = cls()  # called in Python: the command line's path (build_config)
    name = next(f.name for f in dataclasses.fields(cls) if f.type in ("int", int))
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot set {name}="):
        setattr(cfg, name, 1)
    with pytest.raises(ConfigError, match=f"{name}='x': expected int"):
        cls(**{name: "x"})
    with pytest.raises(ConfigError, match=f"{name}='x': expected int"):
        dataclasses.replace(cfg, **{name: "x"})
    with pytest.raises(ConfigError, match="unknown config key 'no_such_option'"):
        cls(no_such_option=1)


@pytest.mark.parametrize("command", SAMPLING_COMMANDS)
def test_sampling_commands_check_their_shared_options_in_one_place(command):
    cls = load(COMMANDS[command].config)
    for values, message in [({"num_prompts": 0}, r"num_prompts \(0\) must be >= 1"),
                            ({"max_prompt_length": 0}, r"max_prompt_length \(0\) must be >= 1"),
                            ({"seed": -1}, r"seed \(-1\) must be in \[0, 2\*\*63 - 1\]"),
                            ({"dtype": "fp64"}, "dtype='fp64': expected one of auto, fp32, bf16"),
                            ({"prompt_overflow": "drop"}, "prompt_overflow='drop': expected one of truncate_left")]:
        with pytest.raises(ConfigError, match=message):
            cls(**values)
    assert cls(dtype="fp32").dtype == "fp32" and cls().dtype in ("fp32", "bf16")  # auto resolved when built


def test_a_help_only_retune_keeps_the_nearest_retuned_default():
    """A config that retunes only the help of an option its base retuned keeps the base's default (as
    the dataclass would without the retune), not the declaring group's."""
    from rlhfkit.core.config import option, retune
    from rlhfkit.trainers.options import RunArgs

    @dataclasses.dataclass
    class Group:
        n: int = option(1, "n")

    @dataclasses.dataclass
    class Mid(Group, RunArgs):
        n = retune(2)

    @dataclasses.dataclass
    class Leaf(Mid):
        n = retune(help="leaf's n")

    assert (Leaf.n, Leaf.__dataclass_fields__["n"].metadata["help"]) == (2, "leaf's n")
    assert Leaf().n == 2
