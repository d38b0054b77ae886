"""Each trainer option is declared once: in an option group (trainers/options.py) or in the one
config that has it; a command that wants its own default or help text retunes it (core/config.py
`retune`), which keeps the option's type, choices and checks."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from rlhfkit.api import CONFIGS, config_class

# Options whose type or choices differ between commands, so one declaration cannot serve them: each
# named with the reason. The list only shrinks; a new duplicate fails the test.
DIFFERENT_TYPES = {
    "max_steps": "sft/rm: int, 0 = from epochs; dpo/kto: int | None, None = from epochs",
    "micro_batch_size": "ppo/grpo: int | str (auto); the others: int",
    "mini_batch_size": "ppo: int; grpo: int | None (None = the whole rollout)",
    "max_prompt_length": "sampling: int | None (None = the context window); dpo/kto: int",
    "prompt_overflow": "declared with max_prompt_length in both groups (sampling; dpo/kto pairs)",
    "loss_agg": "ppo's choices lack grpo's constant",
    "loss_type": "online-dpo takes the reference losses only",
    "temperature": "rollouts' sampling temperature (also the log-prob pass's) and the judged evaluation's",
    "judge": "dpo/kto: a reward function; online-dpo also a reward model, and it makes the pairs",
    "gamma": "ppo: the discount; dpo: simpo's margin",
    "beta": "dpo/kto/grpo: the KL strength (> 0); distill: GKD's JSD mixture weight in [0, 1]",
}


def declarations() -> dict[str, list[str]]:
    """Option name -> the classes (configs and their groups) that declare it (retuned ones and
    class constants not counted)."""
    classes = {k for name in CONFIGS for k in config_class(name).__mro__ if dataclasses.is_dataclass(k)}
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
