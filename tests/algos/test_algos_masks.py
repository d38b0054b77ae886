"""Masked reductions, whitening, response masks (pitfalls docs/pitfalls.md#pad-equals-eos, docs/pitfalls.md#whitening)."""

import math

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from rlhfkit.algos import (
    last_valid_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    response_mask,
)

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


@st.composite
def masked_batch(draw, min_valid=0):
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 8))
    vals = draw(st.lists(st.floats(-100, 100, width=32), min_size=b * t, max_size=b * t))
    bits = draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))
    assume(sum(bits) >= min_valid)
    return torch.tensor(vals).view(b, t), torch.tensor(bits).view(b, t)


# ---------------------------------------------------------------- sums and means
def test_masked_sum_and_mean_golden():
    # valid: 1 and 2 (row 0 only) -> sum 3, mean 3 / 2 = 1.5
    assert masked_sum(X, M).item() == 3.0
    assert masked_mean(X, M).item() == 1.5
    # per row: row 0 -> (1 + 2) / 2 = 1.5; row 1 is empty -> 0, not NaN
    torch.testing.assert_close(masked_mean(X, M, dim=1), torch.tensor([1.5, 0.0]))
    torch.testing.assert_close(masked_sum(X, M, dim=1), torch.tensor([3.0, 0.0]))


def test_empty_mask_gives_zero_never_nan():
    empty = torch.zeros(2, 3)
    assert masked_mean(X, empty).item() == 0.0
    assert masked_var(X, empty).item() == 0.0
    assert masked_var(X, empty, unbiased=True).item() == 0.0
    assert torch.equal(masked_whiten(X, empty), torch.zeros(2, 3))


def test_bool_and_float_masks_agree():
    assert masked_mean(X, M) == masked_mean(X, M.bool())
    assert masked_var(X, M) == masked_var(X, M.bool())
    assert torch.equal(masked_whiten(X, M), masked_whiten(X, M.bool()))


@settings(max_examples=60, deadline=None)
@given(masked_batch(min_valid=1))
@example((torch.tensor([[6.0, 57.0, -25.0, -100.0, 1.5864, 62.0, 1.9631]]), torch.ones(1, 7, dtype=torch.bool)))
def test_masked_mean_matches_boolean_indexing(batch):  # the example: terms of ~100 cancel to ~3.5
    x, m = batch
    # Summation order differs, and with cancellation the result can be far smaller than its terms:
    # the rounding scale is the sum of |terms| (> 0 whenever a term is nonzero), not the result.
    scale = float(x[m].abs().sum()) + 1e-30
    torch.testing.assert_close(masked_sum(x, m), x[m].sum(), rtol=0, atol=1e-6 * scale)
    torch.testing.assert_close(masked_mean(x, m), x[m].mean(), rtol=0, atol=1e-6 * scale / int(m.sum()))


@settings(max_examples=60, deadline=None)
@given(masked_batch(), st.sampled_from([math.inf, -math.inf, math.nan, 1e30]))
def test_garbage_at_masked_positions_changes_nothing_incl_gradient(batch, junk):
    x, m = batch
    dirty = torch.where(m, x, torch.full_like(x, junk)).requires_grad_(True)
    clean = torch.where(m, x, torch.zeros_like(x))
    for fn in (masked_sum, masked_mean, masked_var, lambda a, b: masked_whiten(a, b).sum()):
        out = fn(dirty, m)
        torch.testing.assert_close(out, fn(clean, m))
        (g,) = torch.autograd.grad(out, dirty)
        assert torch.isfinite(g).all()
        assert (g[~m] == 0).all()


# ---------------------------------------------------------------- variance
def test_masked_var_golden():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 99.0]])
    m = torch.tensor([[1, 1, 1, 1, 0]])
    # mean = 10 / 4 = 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
    assert masked_var(x, m).item() == pytest.approx(5 / 4)  # population (default)
    assert masked_var(x, m, unbiased=True).item() == pytest.approx(5 / 3)  # Bessel


def test_masked_var_guards_single_element():
    x = torch.tensor([[7.0, 3.0]])
    one = torch.tensor([[1, 0]])
    assert masked_var(x, one).item() == 0.0
    assert masked_var(x, one, unbiased=True).item() == 0.0  # n - 1 = 0: guarded, not inf/NaN


@settings(max_examples=60, deadline=None)
@given(masked_batch(min_valid=2))
def test_masked_var_matches_torch_var(batch):
    x, m = batch
    sel = x[m].double()
    torch.testing.assert_close(masked_var(x, m).double(), sel.var(unbiased=False), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(
        masked_var(x, m, unbiased=True).double(), sel.var(unbiased=True), rtol=1e-4, atol=1e-3
    )


# ---------------------------------------------------------------- whitening
def test_whiten_golden():
    x = torch.tensor([[1.0, 3.0, 50.0]])
    m = torch.tensor([[1, 1, 0]])
    # mean 2, population var ((1-2)^2 + (3-2)^2) / 2 = 1 -> (x - 2) / sqrt(1 + eps)
    out = masked_whiten(x, m, eps=0.0)
    torch.testing.assert_close(out, torch.tensor([[-1.0, 1.0, 0.0]]))
    # shift_mean=False: only scaled, mean added back: (x - 2) / 1 + 2
    torch.testing.assert_close(
        masked_whiten(x, m, shift_mean=False, eps=0.0), torch.tensor([[1.0, 3.0, 0.0]])
    )
    # explicit (e.g. all-reduced) statistics override the local ones: (x - 0) / sqrt(4)
    torch.testing.assert_close(
        masked_whiten(x, m, mean=0.0, var=4.0, eps=0.0), torch.tensor([[0.5, 1.5, 0.0]])
    )


def test_whiten_one_valid_element():
    x = torch.tensor([[5.0, 9.0]])
    one = torch.tensor([[0, 1]])
    torch.testing.assert_close(masked_whiten(x, one), torch.tensor([[0.0, 0.0]]))
    torch.testing.assert_close(masked_whiten(x, one, shift_mean=False), torch.tensor([[0.0, 9.0]]))


@settings(max_examples=80, deadline=None)
@given(masked_batch(min_valid=2))
def test_whitened_mean_zero_std_one_over_mask(batch):
    x, m = batch
    sel = x[m].double()
    assume(sel.var(unbiased=False) > 1e-2)  # >= 2 distinct values, variance well above eps
    out = masked_whiten(x.double(), m)
    assert (out[~m] == 0).all()
    assert abs(masked_mean(out, m).item()) < 1e-6
    assert masked_var(out, m).item() == pytest.approx(1.0, rel=1e-5)
    scaled = masked_whiten(x.double(), m, shift_mean=False)
    assert masked_mean(scaled, m).item() == pytest.approx(sel.mean().item(), rel=1e-6, abs=1e-6)
    assert masked_var(scaled, m).item() == pytest.approx(1.0, rel=1e-5)


def test_whiten_does_not_modify_input():
    x = torch.tensor([[1.0, 3.0, 50.0]])
    before = x.clone()
    masked_whiten(x, torch.tensor([[1, 1, 0]]))
    assert torch.equal(x, before)


# ---------------------------------------------------------------- response masks
def _response_mask_loop(tokens, stop_ids, attn=None):
    """Per-row, per-token reference: valid up to and including the first stop token."""
    B, T = tokens.shape
    mask = torch.zeros(B, T)
    stopped = torch.zeros(B, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            if attn is not None and not attn[b, t]:
                continue
            mask[b, t] = 1.0
            if int(tokens[b, t]) in stop_ids:
                stopped[b] = True
                break
    return mask, stopped


def test_response_mask_pad_equals_eos():
    eos = pad = 2  # SmolLM2: eos == pad == 2
    tokens = torch.tensor(
        [
            [5, 6, eos, pad, pad],  # stops at t=2; trailing pads are excluded
            [7, eos, pad, pad, pad],  # stops at t=1
            [5, 6, 7, 8, 9],  # never stops: all positions valid
            [eos, pad, pad, pad, pad],  # stops at once: only the eos is valid
        ]
    )
    mask, stopped = response_mask(tokens, [eos])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert mask.dtype == torch.float32
    assert torch.equal(mask, expected.float())
    assert stopped.tolist() == [True, True, False, True]
    # the naive `tokens != pad` rule is wrong here: it would drop the eos and keep nothing of row 3
    assert not torch.equal((tokens != pad).float(), expected.float())


def test_response_mask_several_stop_ids_first_one_wins():
    tokens = torch.tensor([[4, 13, 5, 2, 2], [4, 5, 2, 13, 13], [4, 5, 6, 7, 8]])
    mask, stopped = response_mask(tokens, {2, 13})
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert stopped.tolist() == [True, True, False]
    # a single int is accepted too, and only that id stops
    mask13, stopped13 = response_mask(tokens, 13)
    assert mask13.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert stopped13.tolist() == [True, True, False]


def test_response_mask_attention_mask_is_anded_and_unattended_stops_ignored():
    tokens = torch.tensor([[2, 5, 6, 2, 2]])
    attn = torch.tensor([[0, 1, 1, 1, 1]])  # the leading eos is not attended: not a stop
    mask, stopped = response_mask(tokens, [2], attention_mask=attn)
    assert mask.tolist() == [[0, 1, 1, 1, 0]]
    assert stopped.tolist() == [True]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda b: st.tuples(
            st.lists(st.lists(st.integers(0, 5), min_size=6, max_size=6), min_size=b, max_size=b),
            st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=b, max_size=b),
        )
    ),
    st.sets(st.integers(0, 5), max_size=3),
    st.booleans(),
)
def test_response_mask_matches_loop(data, stop_ids, use_attn):
    tokens, attn = torch.tensor(data[0]), torch.tensor(data[1])
    attn = attn if use_attn else None
    mask, stopped = response_mask(tokens, stop_ids, attention_mask=attn)
    ref_mask, ref_stopped = _response_mask_loop(tokens, stop_ids, attn)
    assert torch.equal(mask, ref_mask)
    assert torch.equal(stopped, ref_stopped)


# ---------------------------------------------------------------- last valid index
def test_last_valid_index_golden():
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0],  # right-padded -> 2
            [0, 0, 1, 1, 1],  # left-padded -> 4
            [0, 0, 0, 0, 0],  # empty -> 0
            [1, 0, 1, 0, 0],  # hole -> 2
        ]
    )
    idx = last_valid_index(mask)
    assert idx.dtype == torch.long
    assert idx.tolist() == [2, 4, 0, 2]
    assert torch.equal(idx, last_valid_index(mask.bool()))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=7, max_size=7), min_size=1, max_size=5))
def test_last_valid_index_matches_loop(rows):
    mask = torch.tensor(rows)
    expected = [max([t for t, v in enumerate(r) if v], default=0) for r in rows]
    assert last_valid_index(mask).tolist() == expected


def test_explained_variance_golden():
    # valid returns R = (1, 2, 3, 6) (mean 3, population var (4 + 1 + 0 + 9) / 4 = 3.5), values V = (1, 1, 4, 5):
    # R - V = (0, 1, -1, 1), mean 0.25, var (0.0625 + 0.5625 + 1.5625 + 0.5625) / 4 = 0.6875; EV = 1 - 0.6875 / 3.5
    from rlhfkit.algos import explained_variance

    returns = torch.tensor([[1.0, 2.0, 99.0], [3.0, 6.0, -7.0]])
    values = torch.tensor([[1.0, 1.0, 50.0], [4.0, 5.0, 8.0]])  # the third column is padding, garbage
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    ev = explained_variance(values, returns, mask)
    assert ev.dim() == 0 and abs(ev.item() - (1 - 0.6875 / 3.5)) <= 1e-6
    assert explained_variance(returns, returns, mask).item() == 1.0  # a perfect critic
    assert explained_variance(torch.zeros_like(returns), returns, mask).item() == 0.0  # a zero value head
    # a critic off by a constant explains all the variance; one that predicts -R explains less than nothing
    assert abs(explained_variance(returns + 5.0, returns, mask).item() - 1.0) <= 1e-6
    assert abs(explained_variance(-returns, returns, mask).item() - (1 - 4.0)) <= 1e-5  # Var(2R) = 4 Var(R)
    assert explained_variance(values, torch.full_like(returns, 2.0), mask).isnan()  # constant returns
    assert explained_variance(values, returns, torch.zeros_like(mask)).isnan()  # no valid position
