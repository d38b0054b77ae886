"""A Rollout is a value: no stage fills in the one it was given, each returns a new one.

Rule, as stated in rollout/core.py: assigning a field of a Rollout raises, and the stages of an
iteration (scoring, the log-prob pass, advantages) leave their input as it was.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlhfkit.rollout import Rollout
from rlhfkit.rollout.score import score_rollout
from rlhfkit.trainers.advantages import compute_advantages
from rlhfkit.trainers.ppo_config import PPOConfig


def small_rollout() -> Rollout:
    """Two rows: prompt width 2, response width 3, the second row one token shorter."""
    return Rollout(query_ids=torch.tensor([[0, 5], [6, 7]]), query_mask=torch.tensor([[0, 1], [1, 1]]),
                   response_ids=torch.tensor([[3, 4, 2], [8, 2, 0]]),
                   response_mask=torch.tensor([[1.0, 1, 1], [1, 1, 0]]), stopped=torch.tensor([True, True]),
                   completions=["ab", "c"], info={"answer": ["x", "c"]}, timings={"timing/generate_s": 1.0})


def test_assigning_a_field_raises():
    ro = small_rollout()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ro.scores = torch.zeros(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ro.timings = {}


def test_scoring_returns_a_new_rollout_and_leaves_its_input_alone():
    ro = small_rollout()

    def reward(prompts, completions, answer, **kw):  # 1 where the completion is the answer
        return [float(c == a) for c, a in zip(completions, answer)]

    scored = score_rollout(ro, [{"prompt": "p", "answer": "x"}, {"prompt": "q", "answer": "c"}], reward)
    assert scored is not ro
    assert scored.scores.tolist() == [0.0, 1.0]
    assert scored.timings["timing/generate_s"] == 1.0  # what the rollout carried stays
    assert ro.scores is None and ro.timings == {"timing/generate_s": 1.0} and ro.reward_parts == {}


def test_advantages_return_a_new_rollout_and_leave_their_input_alone():
    ro = dataclasses.replace(small_rollout(), scores=torch.tensor([1.0, -1.0]),
                             logprobs=torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.2, 0.0]]),
                             values=torch.tensor([[0.1, 0.2, 0.3], [0.0, -0.1, 0.0]]))
    ro = dataclasses.replace(ro, ref_logprobs=ro.logprobs - 0.1 * ro.response_mask)
    cfg = PPOConfig()
    out, metrics = compute_advantages(ro, cfg, cfg.kl_coef)
    assert out is not ro and out.advantages is not None and out.returns is not None
    assert ro.rewards is None and ro.advantages is None and ro.returns is None
    # k1 = 0.1 on every real token: the rollout KL is 0.1 per token summed over each row, averaged
    assert metrics["rollout/kl"] == pytest.approx((3 * 0.1 + 2 * 0.1) / 2, rel=1e-5)
