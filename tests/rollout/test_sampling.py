"""Fast sampling (rollout/sampling.py): the exponential race draws from exactly the policy's
distribution, and generate() with merged LoRA samples what the unmerged model samples."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.core import generate
from rlhfkit.rollout.sampling import ExponentialRaceSampler, exponential_race

from tiny_lm import build_tiny_lora_model as lora_model


def test_exponential_race_is_argmax_of_p_over_minus_log_u():
    """Golden: with the same generator state, the token is argmax_i p_i / (-log u_i)."""
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3], [0.7, 0.1, 0.1, 0.1]])
    torch.manual_seed(3)
    u = torch.rand(2, 4)
    expected = torch.tensor([max(range(4), key=lambda i: float(probs[r, i]) / -math.log(u[r, i])) for r in range(2)])
    torch.manual_seed(3)
    assert torch.equal(exponential_race(probs), expected)


@pytest.mark.parametrize("scale", [1.0, 37.0])
def test_exponential_race_frequencies_match_the_probabilities(scale):
    """200k draws: each frequency within 5 standard errors of p; a zero-probability token never
    wins; unnormalised weights give the same distribution."""
    p = torch.tensor([0.5, 0.25, 0.125, 0.0, 0.0625, 0.0625])
    n = 200_000
    torch.manual_seed(0)
    tokens = exponential_race((p * scale).expand(n, -1).contiguous())
    freq = torch.bincount(tokens, minlength=len(p)).double() / n
    se = (p.double() * (1 - p.double()) / n).sqrt()
    assert freq[3] == 0
    assert ((freq - p.double()).abs() <= 5 * se + 1e-12).all(), freq


def test_sampler_draws_at_the_temperature():
    """The processor samples from softmax(scores / T): frequencies match at T = 0.5."""
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    T, n = 0.5, 200_000
    p = torch.softmax(logits / T, dim=-1).double()
    torch.manual_seed(1)
    out = ExponentialRaceSampler(T)(None, logits.expand(n, -1).contiguous())
    tokens = out.argmax(-1)
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all(), (freq, p)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(2, 40), temperature=st.floats(0.1, 3.0), seed=st.integers(0, 99))
def test_sampler_output_is_one_zero_per_row_on_an_allowed_token(rows, vocab, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, vocab, generator=g) * 4
    scores[:, 0] = float("-inf")  # a banned token (probability 0) is never drawn
    torch.manual_seed(seed)
    out = ExponentialRaceSampler(temperature)(None, scores)
    assert ((out == 0).sum(-1) == 1).all()
    assert torch.isneginf(out[out != 0]).all()
    assert (out.argmax(-1) != 0).all()


def test_sampler_rejects_a_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ExponentialRaceSampler(0.0)


def test_generate_with_lora_samples_the_same_tokens_as_the_unmerged_model(monkeypatch):
    """The merged weights change nothing a sample can see (tiny model, 12 tokens, T = 1)."""
    import contextlib

    import rlhfkit.rollout.core as core

    model, tok = lora_model(seed=2)
    texts = ["<|im_start|>user\nWrite a short review<|im_end|>\n<|im_start|>assistant\n",
             "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    torch.manual_seed(0)
    merged = generate(model, tok, texts, params)
    monkeypatch.setattr(core, "merged_lora", lambda m: contextlib.nullcontext(m))
    torch.manual_seed(0)
    unmerged = generate(model, tok, texts, params)
    assert torch.equal(merged.response_ids, unmerged.response_ids)
    assert merged.response_mask.sum() > 4  # something was sampled
