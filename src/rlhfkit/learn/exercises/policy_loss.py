"""Exercise: PPO's clipped policy loss (docs/learn: the max of negatives).

Write `policy_loss` below, then run:  rlhfkit selfcheck --exercise policy-loss THIS_FILE

    ratio_t = exp(logp_t - old_logp_t)
    l_t     = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - clip_eps, 1 + clip_eps))
    loss    = sum over valid tokens of l_t / number of valid tokens      (the token mean)

logp carries the gradient (the checker compares d loss / d logp too); old_logp and the
advantages are constants. mask: True on the answer's tokens, False on padding, where every
input is garbage.
"""

import torch


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_eps: float) -> torch.Tensor:
    """logp, old_logp, advantages: (B, T) float; mask: (B, T) bool. Returns a scalar tensor."""
    raise NotImplementedError("write the clipped surrogate as a loss to minimise")
