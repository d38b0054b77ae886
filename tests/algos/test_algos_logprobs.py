"""Token log-probs and entropies from (temperature-scaled) logits (docs/pitfalls.md#temperature)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.algos import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits


def _random(B=3, T=5, V=11, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, V, (B, T), generator=g)
    return logits, tokens


def _ref_logp(logits, tokens, temp):
    return torch.log_softmax(logits.float() / temp, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _ref_entropy(logits, temp):
    logp = torch.log_softmax(logits.float() / temp, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_logprobs_golden_with_temperature():
    # logits [0, ln 3]: softmax = [1, 3] / 4 -> log p(token 1) = ln(3/4), log p(token 0) = ln(1/4)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    tokens = torch.tensor([[1, 0]])
    torch.testing.assert_close(
        logprobs_from_logits(logits, tokens), torch.tensor([[math.log(0.75), math.log(0.25)]])
    )
    # temperature 0.5 doubles the logits: [0, 2 ln 3] -> softmax = [1, 9] / 10
    torch.testing.assert_close(
        logprobs_from_logits(logits, tokens, temperature=0.5), torch.tensor([[math.log(0.9), math.log(0.1)]])
    )
    # entropy at T=0.5: -(0.9 ln 0.9 + 0.1 ln 0.1)
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    torch.testing.assert_close(entropy_from_logits(logits, temperature=0.5), torch.tensor([[h, h]]))


@pytest.mark.parametrize("temp", [1.0, 0.7, 2.0])
def test_logprobs_match_log_softmax_gather(temp):
    logits, tokens = _random()
    torch.testing.assert_close(logprobs_from_logits(logits, tokens, temp), _ref_logp(logits, tokens, temp))
    torch.testing.assert_close(entropy_from_logits(logits, temp), _ref_entropy(logits, temp))


def test_logits_are_never_modified():
    for temp in (1.0, 0.5):
        logits, tokens = _random()
        before, version = logits.clone(), logits._version
        logprobs_and_entropy(logits, tokens, temperature=temp, chunk_size=4)
        logprobs_from_logits(logits, tokens, temperature=temp)
        entropy_from_logits(logits, temperature=temp)
        assert torch.equal(logits, before)
        assert logits._version == version  # no in-place op touched it at all


def test_bf16_logits_are_computed_in_float32():
    logits, tokens = _random(V=50, dtype=torch.bfloat16)
    logp, ent = logprobs_and_entropy(logits, tokens, temperature=0.7)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    # equal to the float32 computation on the (exactly representable) upcast logits
    torch.testing.assert_close(logp, _ref_logp(logits.float(), tokens, 0.7))
    torch.testing.assert_close(ent, _ref_entropy(logits.float(), 0.7))


def test_gradients_match_log_softmax():
    logits, tokens = _random()
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    w = torch.randn(3, 5)
    logp, ent = logprobs_and_entropy(a, tokens, temperature=0.8)
    ((logp * w).sum() + (ent * w).sum()).backward()
    ((_ref_logp(b, tokens, 0.8) * w).sum() + (_ref_entropy(b, 0.8) * w).sum()).backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_entropy_golden_uniform_and_masked_vocab():
    V = 8
    # uniform over V: H = ln V
    torch.testing.assert_close(entropy_from_logits(torch.zeros(1, 1, V)), torch.tensor([[math.log(V)]]))
    # banned tokens (-inf, as logits processors produce): uniform over the 2 allowed -> ln 2, no NaN
    logits = torch.full((1, 1, V), -math.inf)
    logits[..., :2] = 0.0
    logits.requires_grad_(True)
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent.detach(), torch.tensor([[math.log(2.0)]]))
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()
    # a single allowed token: H = 0
    one = torch.full((1, 1, V), -math.inf)
    one[..., 3] = 1.0
    assert entropy_from_logits(one).item() == 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.floats(0.3, 3.0), st.booleans())
def test_chunked_equals_unchunked(chunk, temp, with_entropy):
    logits, tokens = _random(B=2, T=7, V=13, seed=chunk)
    full = logprobs_and_entropy(logits, tokens, temp, with_entropy=with_entropy)
    chunked = logprobs_and_entropy(logits, tokens, temp, with_entropy=with_entropy, chunk_size=chunk)
    torch.testing.assert_close(chunked[0], full[0], rtol=0, atol=0)
    if with_entropy:
        torch.testing.assert_close(chunked[1], full[1], rtol=0, atol=0)
    else:
        assert chunked[1] is None and full[1] is None


def test_entropy_bounds_and_temperature_monotonicity():
    logits, _ = _random(V=17)
    ent = entropy_from_logits(logits)
    assert (ent >= -1e-6).all() and (ent <= math.log(17) + 1e-5).all()
    # a higher temperature flattens the distribution: entropy grows
    assert (entropy_from_logits(logits, 2.0) > ent).all()
    assert (entropy_from_logits(logits, 0.5) < ent).all()


def test_bad_arguments():
    logits, tokens = _random()
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="shape"):
        logprobs_from_logits(logits, tokens[:, :-1])
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_and_entropy(logits, tokens, chunk_size=0)
