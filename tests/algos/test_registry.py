"""Registries: one name -> one function, keyed by the choices the configs offer; an unknown name is a
one-line error listing the keys."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.algos import clipped_policy_loss, group_advantages, leave_one_out_advantages, remax_advantages
from rlhfkit.algos.registry import ADVANTAGE_ESTIMATORS, IMPORTANCE_RATIOS, KL_ESTIMATORS, choose
from rlhfkit.core import choices


def test_registry_keys_are_the_configs_choices():
    from rlhfkit.rollout.backends import BACKENDS
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.grpo_variants import ADVANTAGES
    from rlhfkit.trainers.ppo_config import PPOConfig

    assert tuple(ADVANTAGES) == choices.ADVANTAGES
    assert set(ADVANTAGE_ESTIMATORS) == set(choices.ADVANTAGES) - set(choices.REINFORCE_PP_ADVANTAGES)
    assert tuple(IMPORTANCE_RATIOS) == choices.IMPORTANCE_LEVELS
    assert tuple(KL_ESTIMATORS) == choices.KL_ESTIMATORS
    assert set(choices.KL_LOSS_ESTIMATORS) <= set(KL_ESTIMATORS)
    assert BACKENDS == choices.GENERATION_BACKENDS
    fields = GRPOConfig.__dataclass_fields__
    assert fields["advantage"].metadata["choices"] == choices.ADVANTAGES
    assert fields["importance_level"].metadata["choices"] == choices.IMPORTANCE_LEVELS
    assert PPOConfig.__dataclass_fields__["kl_estimator"].metadata["choices"] == choices.KL_ESTIMATORS


@pytest.mark.parametrize("registry, what", [(ADVANTAGE_ESTIMATORS, "advantage"), (KL_ESTIMATORS, "KL estimator"),
                                            (IMPORTANCE_RATIOS, "importance level")])
def test_an_unknown_name_lists_the_keys_in_one_line(registry, what):
    with pytest.raises(ValueError) as e:
        choose(registry, "nope", what)
    message = str(e.value)
    assert message == f"unknown {what} 'nope'; choose one of: {', '.join(registry)}" and "\n" not in message


def test_unknown_importance_level_names_the_levels():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown importance level 'seq'; choose one of: token, sequence, "
                                         "sequence-token"):
        clipped_policy_loss(x, x, x, torch.ones(2, 3), level="seq")


def test_estimators_are_the_algos_functions():
    s = torch.tensor([1.0, 0.0, 3.0, 1.0, 2.0, 2.0])  # two groups of three
    greedy = torch.tensor([0.5, 2.0])
    assert torch.equal(ADVANTAGE_ESTIMATORS["group"](s, 3, None, True), group_advantages(s, 3, scale_by_std=True))
    assert torch.equal(ADVANTAGE_ESTIMATORS["group"](s, 3, None, False), group_advantages(s, 3, scale_by_std=False))
    # RLOO, by hand: 1 - (0 + 3) / 2 = -0.5, ...
    assert torch.allclose(ADVANTAGE_ESTIMATORS["rloo"](s, 3, None, True), torch.tensor([-0.5, -2.0, 2.5, -1.0, 0.5, 0.5]))
    assert torch.equal(ADVANTAGE_ESTIMATORS["rloo"](s, 3, None, True), leave_one_out_advantages(s, 3))
    assert torch.equal(ADVANTAGE_ESTIMATORS["remax"](s, 3, greedy, True), remax_advantages(s, greedy, 3))
