"""Exercise: per-token rewards with a KL penalty (docs/learn: where per-token rewards come from).

Write `kl_reward` below, then run:  rlhfkit selfcheck --exercise kl-reward THIS_FILE

    KL_t = logp_t - ref_logp_t                (the k1 estimate of KL(pi || pi_ref) at token t)
    r_t  = -kl_coef * KL_t                    on every valid token
    r_L += score                              at L, the row's LAST VALID token

Rows are right-padded (mask True then False); the rewards are 0 on padding, where logp and
ref_logp are garbage.
"""

import torch


def kl_reward(scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
              kl_coef: float) -> torch.Tensor:
    """scores: (B,); logp, ref_logp: (B, T) float; mask: (B, T) bool, right-padded. Returns rewards (B, T)."""
    raise NotImplementedError("write the shaped rewards")
