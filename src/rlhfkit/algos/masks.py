"""Masked reductions, whitening and response masks.

Notation: B batch, T response length, V vocab.

Masks are *binary*: ``bool`` or a float/int tensor of 0/1 (any non-zero counts as valid).
Every reduction here selects with ``torch.where`` rather than multiplying by the mask, so
that whatever sits at a masked position (garbage, ``inf``, ``NaN``) can change neither the
result nor its gradient.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "explained_variance",
    "response_mask",
    "last_valid_index",
]


def _valid(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast ``x`` and a bool view of ``mask`` to a common shape."""
    m = mask if mask.dtype == torch.bool else mask != 0
    return torch.broadcast_tensors(x, m)


def _zero_masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with masked positions replaced by 0 (selection, not multiplication: 0 * inf = NaN)."""
    x, m = _valid(x, mask)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``x`` over the valid positions of ``mask``.

    x: any shape (typically (B, T)); mask: broadcastable to x, bool or 0/1 float.
    Returns a scalar (``dim=None``) or ``x`` reduced over ``dim``.
    """
    picked = _zero_masked(x, mask)
    return picked.sum() if dim is None else picked.sum(dim=dim)


def _count(x: torch.Tensor, mask: torch.Tensor, dim) -> torch.Tensor:
    x, m = _valid(x, mask)
    n = m.sum() if dim is None else m.sum(dim=dim)
    return n.to(x.dtype if x.is_floating_point() else torch.float32)


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``x`` over valid positions; exactly 0 (never NaN) where the mask is empty.

    x: any shape; mask: broadcastable to x. Returns a scalar or ``x`` reduced over ``dim``.
    """
    n = _count(x, mask, dim)
    # clamp(min=1) only matters when n == 0, where the sum is 0 too -> 0/1 = 0.
    return masked_sum(x, mask, dim) / n.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """Variance of the valid elements of ``x`` (all of them pooled), a scalar.

    Biased/population variance ``sum (x - mean)^2 / n`` by default. ``unbiased=True`` uses
    Bessel's correction ``/(n - 1)``; it is undefined for n <= 1, where this returns 0
    instead of dividing by zero. Two-pass (centre first) for numerical stability.
    """
    x = _zero_masked(x, mask)  # first, so garbage there cannot reach the gradient either
    mean = masked_mean(x, mask)
    n = _count(x, mask, None)
    ss = masked_sum((x - mean) ** 2, mask)
    if unbiased:
        return torch.where(n > 1, ss / (n - 1).clamp(min=1), torch.zeros_like(ss))
    return ss / n.clamp(min=1)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How much of the returns' variance the critic explains: 1 - Var(returns - values) / Var(returns),
    both population variances pooled over the valid positions.

    1: the values predict the returns exactly; 0: no better than predicting their mean (a
    zero-initialised value head gives exactly 0); below 0: worse than that. NaN when the returns
    do not vary (nothing to explain) or no position is valid.

    values, returns, mask: (B, T). Returns a 0-d tensor (float32 or wider).
    """
    dtype = torch.promote_types(torch.result_type(values, returns), torch.float32)
    ret = returns.to(dtype)
    var_ret = masked_var(ret, mask)
    var_err = masked_var(ret - values.to(dtype), mask)
    return torch.where(var_ret > 0, 1.0 - var_err / var_ret.clamp(min=torch.finfo(dtype).tiny),
                       torch.full_like(var_ret, float("nan")))


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    unbiased: bool = False,
    mean: torch.Tensor | float | None = None,
    var: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Normalise ``x`` to mean 0 / variance 1 over the valid positions.

    ``(x - mean) / sqrt(var + eps)``, with mean and (population, unless ``unbiased``)
    variance pooled over *all* valid elements of the given tensor: the scope is whatever the
    caller passes (one mini-batch on one rank). For rank- or batch-global statistics, reduce
    sums across ranks yourself and pass ``mean=`` and ``var=``.
    ``shift_mean=False`` adds the mean back, i.e. only rescales (the usual choice for
    rewards, whose sign carries meaning). Masked positions are 0 in the output. With 0 valid
    elements the output is all 0; with 1 valid element var = 0, so that element becomes 0
    (or its own value when ``shift_mean=False``, since eps keeps the scale finite).

    x, mask: (B, T) (any broadcastable shapes). Returns x's shape.
    """
    x = _zero_masked(x, mask)  # first, so garbage there cannot reach the gradient either
    if mean is None:
        mean = masked_mean(x, mask)
    if var is None:
        var = masked_var(x, mask, unbiased=unbiased)
    var_t = torch.as_tensor(var, dtype=x.dtype, device=x.device)
    out = (x - mean) * torch.rsqrt(var_t + eps)
    if not shift_mean:
        out = out + mean
    return _zero_masked(out, mask)


def response_mask(
    tokens: torch.Tensor,
    stop_ids: Iterable[int] | int,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of the real response: every token up to AND including the first stop token.

    Works when pad == eos (docs/pitfalls.md#pad-equals-eos): only the *first* stop token counts, so trailing
    pad/eos tokens after it are excluded, while a response that never emits a stop token
    keeps all T positions. ``stop_ids`` are all configured stop ids (docs/pitfalls.md#eos-policy), not only
    the tokenizer's eos. If ``attention_mask`` is given it is ANDed in, and stop tokens at
    unattended positions do not count as stops.

    tokens: (B, T) long, the generated response tokens.
    Returns ``(mask, stopped)``: mask (B, T) float 1.0/0.0; stopped (B,) bool.
    """
    ids = [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)
    stop_t = torch.tensor(ids, dtype=tokens.dtype, device=tokens.device)
    is_stop = torch.isin(tokens, stop_t)  # (B, T)
    attn = None
    if attention_mask is not None:
        attn = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
        is_stop = is_stop & attn
    # Number of stop tokens strictly before t; a position is valid while that is 0.
    stops_before = is_stop.long().cumsum(dim=1) - is_stop.long()
    valid = stops_before == 0
    if attn is not None:
        valid = valid & attn
    return valid.to(torch.float32), is_stop.any(dim=1)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid position of each row; 0 for a row with no valid position.

    mask: (B, T) bool or 0/1 float. Returns (B,) long. Works for left- and right-padding.
    """
    m = mask if mask.dtype == torch.bool else mask != 0
    if m.shape[-1] == 0:
        return torch.zeros(m.shape[:-1], dtype=torch.long, device=m.device)
    pos = torch.arange(m.shape[-1], device=m.device).expand_as(m)
    return torch.where(m, pos, torch.full_like(pos, -1)).amax(dim=-1).clamp(min=0)
