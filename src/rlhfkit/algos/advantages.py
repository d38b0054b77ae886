"""Advantage estimators: GAE (PPO) and group baselines (GRPO, RLOO).

Notation: B batch, T response length, G group size.

GAE, Schulman et al. 2016 ("High-Dimensional Continuous Control Using GAE"), eq. 16:
    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
    A_t     = sum_{l >= 0} (gamma * lam)^l * delta_{t+l}  =  delta_t + gamma * lam * A_{t+1}
    R_t     = A_t + V(s_t)            (the value target; taken BEFORE any whitening)

Masking (docs/pitfalls.md#masked-gae). The valid tokens of a row are the row's trajectory; masked positions do
not exist as far as the maths is concerned: the recursion is carried *through* them, so
"next" always means the next valid position. After the last valid token the state is
terminal (V = 0) unless ``bootstrap_value`` V(s_{n+1}) is given for a truncated segment.
Rewards and values at masked positions therefore never change any output, whatever the
mask pattern (right-, left-padded or with holes), and outputs are 0 there.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "gae",
    "gae_reference",
    "discounted_reverse_cumsum",
    "group_advantages",
    "leave_one_out_advantages",
]


def _bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _check_gae_args(rewards, values, mask, gamma, lam, bootstrap_value) -> None:
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(
            "rewards, values and mask must all be (B, T); got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}"
        )
    for name, x in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {x}")
    if bootstrap_value is not None and tuple(bootstrap_value.shape) != (rewards.shape[0],):
        raise ValueError(
            f"bootstrap_value must be (B,) = ({rewards.shape[0]},), got {tuple(bootstrap_value.shape)}"
        )


def gae_reference(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_value: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Readable reverse-time loop for GAE (the specification ``gae`` is tested against).

    Same contract as :func:`gae`. One Python iteration per time step, vectorised over B.
    """
    _check_gae_args(rewards, values, mask, gamma, lam, bootstrap_value)
    m = _bool(mask)
    dtype = torch.promote_types(torch.result_type(rewards, values), torch.float32)
    B, T = rewards.shape
    next_value = torch.zeros(B, dtype=dtype, device=rewards.device)  # terminal: V = 0
    if bootstrap_value is not None:
        next_value = bootstrap_value.to(dtype)  # truncated segment: V(s_{n+1})
    next_adv = torch.zeros(B, dtype=dtype, device=rewards.device)
    adv = torch.zeros(B, T, dtype=dtype, device=rewards.device)
    for t in reversed(range(T)):
        r_t, v_t, m_t = rewards[:, t].to(dtype), values[:, t].to(dtype), m[:, t]
        delta = r_t + gamma * next_value - v_t
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m_t, a_t, torch.zeros_like(a_t))
        # A masked step is skipped: the "next" value/advantage carry over unchanged.
        next_value = torch.where(m_t, v_t, next_value)
        next_adv = torch.where(m_t, a_t, next_adv)
    returns = torch.where(m, adv + values.to(dtype), torch.zeros_like(adv))
    return adv, returns


def discounted_reverse_cumsum(x: torch.Tensor, discount: float, chunk_size: int = 32) -> torch.Tensor:
    """y_t = sum_{k >= t} discount^(k - t) * x_k along the last dim, without a time loop.

    Two-level blocked scan: inside each chunk of C steps a (C, C) discount matrix matmul,
    then across the n = ceil(T / C) chunks an (n, n) one carries each chunk's start value
    backwards. O(B*T*(C + n)) work instead of O(B*T^2) for one (T, T) matmul, no Python
    loop, and every weight is discount^k <= 1 (no growing 1/discount^t factors that make
    the closed-form cumsum overflow; powers underflow to 0 only where they are negligible).

    x: (B, T) float. Returns (B, T), same dtype.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    B, T = x.shape
    if T == 0 or discount == 0.0:
        return x.clone()
    C = max(1, min(chunk_size, T))
    n = math.ceil(T / C)
    xp = F.pad(x, (0, n * C - T)).view(B, n, C)  # zero padding contributes nothing
    kw = {"dtype": torch.float64, "device": x.device}
    c = torch.tensor(discount, **kw)
    idx = torch.arange(C, **kw)
    lag = idx[None, :] - idx[:, None]  # lag[t, k] = k - t
    w = torch.where(lag >= 0, c ** lag.clamp(min=0), torch.zeros((), **kw)).to(x.dtype)  # (C, C)
    with torch.autocast(x.device.type, enabled=False):  # autocast would round these matmuls to bf16
        local = xp @ w.T  # (B, n, C): the in-chunk part of y
        if n == 1:
            return local.view(B, C)[:, :T]
        jdx = torch.arange(n, **kw)
        jlag = jdx[None, :] - jdx[:, None]
        wn = torch.where(jlag >= 0, c ** (C * jlag.clamp(min=0)), torch.zeros((), **kw)).to(x.dtype)  # (n, n)
        start = local[:, :, 0] @ wn.T  # (B, n): y at each chunk's first step
    start_next = F.pad(start[:, 1:], (0, 1))  # (B, n): y at the next chunk's first step (0 past the end)
    tail = (c ** (C - idx)).to(x.dtype)  # (C,): discount from step t to the next chunk's start
    y = local + start_next[:, :, None] * tail
    return y.reshape(B, n * C)[:, :T]


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_value: torch.Tensor | None = None,
    chunk_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation, Schulman et al. 2016, eq. 16 (see module docstring).

    rewards, values: (B, T) per-token rewards r_t and values V(s_t); mask: (B, T) response
    mask (bool or 0/1 float), any pattern. bootstrap_value: (B,) V(s_{n+1}) after each row's
    last valid token for truncated segments, else that state is terminal (V = 0).
    Returns ``(advantages, returns)``, both (B, T), 0 at masked positions, with
    returns = advantages + values computed before any whitening (whitening is the
    caller's job, docs/pitfalls.md#whitening). dtype: float32 or wider. Differentiable, but trainers call it
    under ``torch.no_grad()`` because advantages and returns are targets.

    Vectorised: deltas in one shot, then the reverse recursion as a blocked discounted
    cumsum (``discounted_reverse_cumsum``); rows whose valid tokens are not one leading run
    are first compacted (stable sort of valid positions to the front) and scattered back.
    """
    _check_gae_args(rewards, values, mask, gamma, lam, bootstrap_value)
    m = _bool(mask)
    dtype = torch.promote_types(torch.result_type(rewards, values), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=rewards.device)
    r = torch.where(m, rewards.to(dtype), zero)  # select, so inf/NaN at masked steps cannot leak
    v = torch.where(m, values.to(dtype), zero)
    B, T = r.shape
    leading_run = T <= 1 or bool((m[:, 1:] <= m[:, :-1]).all())  # every row: valid..valid, pad..pad
    order = None
    if not leading_run:
        order = torch.argsort((~m).to(torch.int8), dim=1, stable=True)  # valid positions first, in order
        r, v, mc = r.gather(1, order), v.gather(1, order), m.gather(1, order)
    else:
        mc = m
    boot = torch.zeros(B, 1, dtype=dtype, device=r.device)
    if bootstrap_value is not None:
        boot = bootstrap_value.to(dtype).unsqueeze(1)
    # V(s_{t+1}): the next step's value while it is valid, else the terminal/bootstrap value.
    v_next = torch.where(F.pad(mc[:, 1:], (0, 1)), F.pad(v[:, 1:], (0, 1)), boot)
    delta = torch.where(mc, r + gamma * v_next - v, zero)  # (B, T) TD errors, 0 on padding
    adv = torch.where(mc, discounted_reverse_cumsum(delta, gamma * lam, chunk_size), zero)
    if order is not None:
        adv = torch.zeros_like(adv).scatter(1, order, adv)
        v = torch.where(m, values.to(dtype), zero)
    return adv, torch.where(m, adv + v, zero)


def _grouped(scores: torch.Tensor, group_size: int, min_size: int) -> torch.Tensor:
    if scores.dim() != 1:
        raise ValueError(f"scores must be (B,), got {tuple(scores.shape)}")
    if group_size < min_size:
        raise ValueError(f"group_size must be >= {min_size}, got {group_size}")
    if scores.shape[0] % group_size != 0:
        raise ValueError(f"batch size ({scores.shape[0]}) must be divisible by group_size ({group_size})")
    return scores.to(torch.promote_types(scores.dtype, torch.float32)).view(-1, group_size)  # (B/G, G)


def group_advantages(
    scores: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantages, Shao et al. 2024 (DeepSeekMath), sec. 4.1.2.

    A_i = (s_i - mean_group) / (std_group + eps), or s_i - mean_group with
    ``scale_by_std=False`` (Dr. GRPO, Liu et al. 2025). std is the *unbiased* (Bessel,
    /(G - 1)) sample std, as in the DeepSeekMath/TRL reference code; for G = 1 it is taken
    as 0 (the advantage is 0 anyway). A group with identical scores gets A = 0.

    scores: (B,) laid out as consecutive groups [g0 x G, g1 x G, ...]. Returns (B,).
    """
    g = _grouped(scores, group_size, 1)
    centred = g - g.mean(dim=1, keepdim=True)
    if scale_by_std:
        std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    return centred.reshape(-1)


def leave_one_out_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO advantages, Ahmadian et al. 2024 (Kool et al. 2019 baseline).

    A_i = s_i - (1 / (G - 1)) * sum_{j != i} s_j  (= G / (G - 1) * (s_i - mean_group)).
    scores: (B,) in consecutive groups of G >= 2. Returns (B,).
    """
    g = _grouped(scores, group_size, 2)
    others_mean = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    return (g - others_mean).reshape(-1)
