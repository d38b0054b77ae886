"""Per-token KL estimators and KL-coefficient controllers.

Notation: B batch, T response length.

We estimate KL(pi || pi_ref) = E_{a ~ pi}[log pi(a) - log pi_ref(a)] from tokens sampled
from pi (docs/pitfalls.md#kl-estimators). Let d = ref_logp - logp = log r with r = pi_ref / pi. Following
Schulman 2020, "Approximating KL divergence" (http://joschu.net/blog/kl-approx.html):

======  =====================  ===========================================================
kind    per-token estimate     bias / variance (tokens sampled from pi)
======  =====================  ===========================================================
k1      -d = logp - ref_logp   unbiased; high variance; single samples can be negative
k2      0.5 * d^2              biased (exact to 2nd order as pi_ref -> pi); low variance,
                               never negative
k3      exp(d) - 1 - d         unbiased (E[r] = 1) and never negative; low variance when
                               pi_ref ~ pi, heavy-tailed when pi_ref >> pi on a token
abs     |d|                    biased upward (E|d| >= |E d| = KL); never negative
======  =====================  ===========================================================

These are *value* estimates. Using one *as a loss* gives a biased gradient of
KL(pi || pi_ref) in general. In expectation over on-policy samples (a ~ pi, weights
detached): grad k1 = E[grad log pi] = 0; grad k3 = E[(1 - r) grad log pi] = grad
KL(pi_ref || pi), the *other* direction, which agrees with grad KL(pi || pi_ref) only to
first order; only grad k2 = E[-d grad log pi] equals grad KL(pi || pi_ref), and only
on-policy (after the first PPO epoch samples come from pi_old, which biases it too).
rlhfkit's PPO uses k1 as a *reward penalty* (``shape_rewards``; no gradient flows through it,
the policy gradient then optimises the KL-regularised return), as in Ziegler et al. 2019 /
InstructGPT; k3 is offered for GRPO-style loss terms with the caveat above.
(``tests/algos/test_algos_kl.py`` pins each of these expectations exactly.)

``clamp``: if given, d is clamped to [-clamp, clamp] *before* the estimator is applied. This
bounds k3 <= exp(clamp) - 1 - clamp, keeps exp() from overflowing, and zeroes the gradient
where the clamp is active. Off (None) by default.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "KL_ESTIMATORS",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_abs",
    "kl_estimate",
    "FixedKLController",
    "AdaptiveKLController",
]


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """d = ref_logp - logp = log(pi_ref / pi), optionally clamped to [-clamp, clamp]."""
    d = ref_logp - logp
    return d if clamp is None else d.clamp(-clamp, clamp)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """k1 = logp - ref_logp = -d (Schulman 2020). Unbiased, can be negative. (B, T) -> (B, T)."""
    return -_log_ratio(logp, ref_logp, clamp)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """k2 = 0.5 * d^2 (Schulman 2020). Biased, low variance, >= 0. (B, T) -> (B, T)."""
    return 0.5 * _log_ratio(logp, ref_logp, clamp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """k3 = exp(d) - 1 - d (Schulman 2020). Unbiased and >= 0. (B, T) -> (B, T).

    Written as expm1(d) - d: for small |d| exp(d) - 1 cancels catastrophically in float32.
    """
    d = _log_ratio(logp, ref_logp, clamp)
    # exp(d) >= 1 + d holds exactly, but rounding can give -1e-8; pin it at the true bound.
    return (torch.expm1(d) - d).clamp(min=0)


def kl_abs(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """|logp - ref_logp| = |d|. Biased upward, >= 0. (B, T) -> (B, T)."""
    return _log_ratio(logp, ref_logp, clamp).abs()


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs}


def kl_estimate(
    logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1", clamp: float | None = None
) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate of the given ``kind`` (see the module docstring).

    logp, ref_logp: (B, T) log-probs of the sampled tokens under pi and pi_ref.
    Returns (B, T). Raises ValueError for an unknown kind.
    """
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {sorted(KL_ESTIMATORS)}") from None
    return fn(logp, ref_logp, clamp=clamp)


class FixedKLController:
    """Constant KL coefficient: ``.value`` never changes; ``update`` is a no-op."""

    def __init__(self, coef: float):
        if coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {coef}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers share one interface)."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, d: dict) -> None:
        self.value = float(d["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient, Ziegler et al. 2019 ("Fine-Tuning LMs from Human Preferences").

    After each batch: err = clip(current_kl / target - 1, -0.2, 0.2);
    value *= 1 + err * n_steps / horizon. The coefficient grows when the measured KL
    exceeds the target and shrinks when below, by at most 20% per ``horizon`` steps.
    ``current_kl`` is the per-sequence KL (e.g. ``shape_rewards`` metric ``kl``), ``n_steps``
    the number of samples (sequences) the measurement covered.
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if init_coef < 0:
            raise ValueError(f"init_coef must be >= 0, got {init_coef}")
        if not target > 0:
            raise ValueError(f"target KL must be > 0, got {target}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        current_kl = float(current_kl)
        if not math.isfinite(current_kl):
            raise ValueError(f"current_kl must be finite, got {current_kl}")
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, d: dict) -> None:
        self.value = float(d["value"])
        self.target = float(d.get("target", self.target))
        self.horizon = float(d.get("horizon", self.horizon))
