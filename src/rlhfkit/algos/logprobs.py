"""Token log-probabilities and entropies from logits.

Notation: B batch, T response length, V vocab.

Temperature (docs/pitfalls.md#temperature): rollouts sampled at temperature tau must have their policy,
reference and entropy terms recomputed from ``logits / tau``; every function here takes the
same ``temperature`` argument. The computation runs in float32 even for bf16 logits (a bf16
logsumexp over V ~ 5e4 loses ~2-3 significant digits), and ``logits`` is never modified in
place.
"""

from __future__ import annotations

import torch

__all__ = ["logprobs_from_logits", "entropy_from_logits", "logprobs_and_entropy"]


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _scaled_f32(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 ``logits / temperature``: always a new tensor or the caller's, never mutated."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


def _chunk(
    logits: torch.Tensor, tokens: torch.Tensor | None, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """log p(token) and entropy for rows of ``logits`` (N, V) / ``tokens`` (N,)."""
    z = _scaled_f32(logits, temperature)  # (N, V)
    lse = torch.logsumexp(z, dim=-1)  # (N,)
    logp = None
    if tokens is not None:
        # log softmax(z)[tok] = z[tok] - logsumexp(z): no (N, V) log-softmax copy needed.
        logp = z.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        # H = -sum p log p. Clamp -inf log-probs (banned tokens) to a finite floor so that
        # p * log p is 0 * finite = 0 and its gradient stays finite, instead of 0 * -inf = NaN.
        log_p = (z - lse.unsqueeze(-1)).clamp(min=torch.finfo(z.dtype).min)
        ent = -(log_p.exp() * log_p).sum(dim=-1)
    return logp, ent


def logprobs_and_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor | None,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Log-probs of ``tokens`` and the entropy of softmax(logits / temperature), in one pass.

    log pi(a_t | s_t) = z_t[a_t] - logsumexp(z_t), z_t = logits_t / temperature;
    H_t = -sum_v p_v log p_v (Shannon entropy of the temperature-scaled distribution).

    logits: (B, T, V) any float dtype; tokens: (B, T) ids in [0, V) (or None for entropy only).
    Returns ``(logp, entropy)``, each (B, T) float32 or None (``tokens=None`` /
    ``with_entropy=False``). ``chunk_size`` processes that many (b, t) rows at a time,
    bounding the float32 (rows, V) temporaries; without autograd (rollout scoring) this
    bounds peak memory, with autograd the graph keeps every chunk's inputs anyway.
    """
    _check_temperature(temperature)
    if tokens is None and not with_entropy:
        raise ValueError("nothing to compute: tokens is None and with_entropy is False")
    if tokens is not None and tokens.shape != logits.shape[:-1]:
        raise ValueError(
            f"tokens shape {tuple(tokens.shape)} != logits shape[:-1] {tuple(logits.shape[:-1])}"
        )
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # (B*T, V), a view for contiguous logits
    flat_tok = None if tokens is None else tokens.reshape(-1)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    n = flat.shape[0]
    step = max(1, n if chunk_size is None else min(int(chunk_size), n))
    logps, ents = [], []
    for start in range(0, max(n, 1), step):
        sl = slice(start, start + step)
        lp, en = _chunk(flat[sl], None if flat_tok is None else flat_tok[sl], temperature, with_entropy)
        logps.append(lp)
        ents.append(en)
    logp = None if tokens is None else torch.cat(logps).reshape(lead)
    ent = torch.cat(ents).reshape(lead) if with_entropy else None
    return logp, ent


def logprobs_from_logits(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature) gathered at ``tokens``.

    Computed as gathered logit minus logsumexp, in float32, without modifying ``logits``.
    logits: (B, T, V); tokens: (B, T). Returns (B, T) float32.
    """
    logp, _ = logprobs_and_entropy(logits, tokens, temperature, with_entropy=False)
    return logp


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy H = -sum_v p_v log p_v of p = softmax(logits / temperature), in nats.

    logits: (B, T, V). Returns (B, T) float32.
    """
    _, ent = logprobs_and_entropy(logits, None, temperature, with_entropy=True)
    return ent
