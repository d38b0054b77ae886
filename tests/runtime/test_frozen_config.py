"""Trainer configs are frozen once validated; values worked out from the options are derived in
validation (`derived()`), before freezing, never assigned afterwards."""

from __future__ import annotations

import dataclasses

import pytest

from rlhfkit.api import CONFIGS, config_class
from rlhfkit.core.config import build_config, parse_args
from rlhfkit.trainers.grpo_config import OFF_POLICY_TIS_CAP, GRPOConfig

REQUIRED = {"RMConfig": {"data": "prefs.jsonl"}, "SFTConfig": {"data": "sft.jsonl"},
            "DPOConfig": {"prefs": "prefs.jsonl"}, "SimPOConfig": {"prefs": "prefs.jsonl"},
            "ORPOConfig": {"prefs": "prefs.jsonl"}, "KTOConfig": {"data": "kto.jsonl"}}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_assigning_a_field_after_validation_raises(name):
    cfg = build_config(config_class(name), dict(REQUIRED.get(name, {})))
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"{name} is frozen after validation: cannot set seed=5"):
        cfg.seed = 5
    assert cfg.seed == 0
    changed = dataclasses.replace(cfg, seed=5)  # the way to another config
    assert changed.seed == 5 and cfg.seed == 0


def test_a_config_built_directly_stays_open_until_validated():
    cfg = GRPOConfig()
    cfg.seed = 3  # the Python API: checked (and frozen) by train()
    assert build_config(GRPOConfig, {"seed": cfg.seed}).seed == 3


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
