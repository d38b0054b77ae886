"""KV reuse across turns in the built-in multi-turn rollout (rollout/multiturn.py reuse_cache): the
same episodes as re-encoding the history (greedy), with fewer context tokens run."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.envs import Step
from rlhfkit.rollout.core import SamplingParams
from rlhfkit.rollout.multiturn import generate_episodes

from tiny_lm import build_tiny_model, build_tokenizer


class ThreeTurns:
    """Answers every turn with a tool-style message; the third turn ends the episode with reward 1."""

    def reset(self, record):
        self.turns = 0
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, history, model_turn):
        self.turns += 1
        if self.turns == 3:
            return Step(None, 1.0, True)
        return Step([{"role": "tool", "content": f"result {self.turns}"}], None, False)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_tiny_model(len(tok), seed=1), tok


def episodes(tiny, reuse: bool, temperature: float = 0.0):
    model, tok = tiny
    records = [{"prompt": f"Question number {i}?"} for i in range(4)]
    params = SamplingParams(max_new_tokens=5, temperature=temperature)
    return generate_episodes(model, tok, ThreeTurns, records, params, max_turns=3, max_total_tokens=200, seed=0,
                             reuse_cache=reuse)


def test_reused_turns_give_the_re_encoded_episodes_with_fewer_context_tokens(tiny):
    plain, cached = episodes(tiny, False), episodes(tiny, True)
    assert torch.equal(plain.response_ids, cached.response_ids)
    assert torch.equal(plain.response_mask, cached.response_mask)
    assert plain.info["turns"] == cached.info["turns"] == [3] * 4
    # golden: re-encoding runs turn k's whole context; reuse runs the prompt once, then per turn
    # only the last sampled token and the environment's tokens
    for b in range(4):
        p = int(plain.query_mask[b].sum())
        model = plain.response_mask[b]
        ctx = plain.context_mask[b]
        starts = [i for i in range(len(model)) if model[i] == 1 and (i == 0 or model[i - 1] == 0)]  # each turn's first token
        assert plain.info["prefill_tokens"][b] == sum(p + s for s in starts)
        env_tokens = int(ctx.sum() - model.sum())
        assert cached.info["prefill_tokens"][b] == p + env_tokens + (len(starts) - 1)


def test_reuse_samples_the_policy_distribution_at_temperature_1(tiny):
    """Sampling runs and the rows are well formed (the draws differ from HF generate's, not their law)."""
    ro = episodes(tiny, True, temperature=1.0)
    assert ro.response_ids.shape[0] == 4 and all(t >= 1 for t in ro.info["turns"])
    assert ((ro.response_mask == 1) <= (ro.context_mask == 1)).all()
