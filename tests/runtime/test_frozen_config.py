"""Trainer configs are frozen once validated; values worked out from the options are derived in
validation (`derived()`), before freezing, never assigned afterwards."""

from __future__ import annotations

import dataclasses

import pytest

from rlhfkit.api import CONFIGS, config_class
from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.grpo_config import OFF_POLICY_TIS_CAP, GRPOConfig

REQUIRED = {"RMConfig": {"data": "prefs.jsonl"}, "SFTConfig": {"data": "sft.jsonl"},
            "DPOConfig": {"prefs": "prefs.jsonl"}, "SimPOConfig": {"prefs": "prefs.jsonl"},
            "ORPOConfig": {"prefs": "prefs.jsonl"}, "KTOConfig": {"data": "kto.jsonl"},
            "DistillConfig": {"teacher": "teacher-model"}}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_assigning_a_field_after_validation_raises(name):
    cfg = build_config(config_class(name), dict(REQUIRED.get(name, {})))
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"{name} is frozen after validation: cannot set seed=5"):
        cfg.seed = 5
    assert cfg.seed == 0
    changed = dataclasses.replace(cfg, seed=5)  # the way to another config
    assert changed.seed == 5 and cfg.seed == 0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_config_built_directly_is_validated_and_frozen(name):
    """Calling the class (the Python API) or dataclasses.replace checks and freezes as build_config does."""
    cls = config_class(name)
    cfg = cls(**REQUIRED.get(name, {}))
    assert cfg == build_config(cls, dict(REQUIRED.get(name, {})))
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"{name} is frozen after validation"):
        cfg.seed = 3
    with pytest.raises(ConfigError, match=r"^keep_checkpoints \(0\) must be >= 1$"):
        dataclasses.replace(cfg, keep_checkpoints=0)
    with pytest.raises(ConfigError, match=rf"^{name}: lr='fast': expected float \(a finite number\)$"):
        cls(lr="fast", **REQUIRED.get(name, {}))


def test_a_directly_built_invalid_config_is_the_command_lines_one_line_error():
    with pytest.raises(ConfigError) as direct:
        GRPOConfig(mini_batch_size=64, rollout_batch_size=8)
    with pytest.raises(ConfigError) as cli:
        parse_args(GRPOConfig, ["mini_batch_size=64", "rollout_batch_size=8"], "rlhfkit grpo")
    assert str(direct.value) == str(cli.value) == "rollout_batch_size (8) must be divisible by mini_batch_size (64)"
    with pytest.raises(ConfigError, match=r"^GRPOConfig: unknown config key 'learnin_rate' \(did you mean "
                                          r"'learning_rate'\? rlhfkit calls it 'lr'\)$"):
        GRPOConfig(learnin_rate=1e-5)
    assert GRPOConfig(learning_rate=1e-5, max_completion_length=8).max_new_tokens == 8  # TRL's names, as on the CLI


def test_derived_values_are_resolved_before_freezing():
    cfg = parse_args(GRPOConfig, ["one_step_off_policy=true", "model=org/name", "model_revision=v1", "dtype=auto"],
                     "rlhfkit grpo")
    assert cfg.tis_cap == OFF_POLICY_TIS_CAP  # None becomes the off-policy cap
    assert cfg.model == "org/name@v1"
    assert cfg.dtype in ("fp32", "bf16")  # config.yaml records the resolved dtype
    given = parse_args(GRPOConfig, ["one_step_off_policy=true", "tis_cap=3"], "rlhfkit grpo")
    assert given.tis_cap == 3.0
    assert parse_args(GRPOConfig, [], "rlhfkit grpo").tis_cap is None  # on-policy: off unless asked


def test_validate_only_reads_the_config():
    """A validate() that assigns a field fails at once (the config is frozen while it runs)."""
    from rlhfkit.core.config import option
    from rlhfkit.trainers.options import RunArgs

    @dataclasses.dataclass
    class Assigning(RunArgs):
        x: int = option(1, "x")

        def validate(self) -> None:
            self.x = 2

    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot set x=2"):
        build_config(Assigning, {})
