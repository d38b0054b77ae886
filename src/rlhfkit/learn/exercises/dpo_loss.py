"""Exercise: the DPO loss (docs/learn: DPO).

Write `dpo_loss` below, then run:  rlhfkit selfcheck --exercise dpo-loss THIS_FILE

    h       = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
    loss_i  = -log sigmoid(beta * h_i)

y_w is the chosen answer, y_l the rejected one; each input is one summed log-prob per pair.
Return one loss per pair (the caller takes the mean). The policy log-probs carry the gradient
(the checker compares it too); some pairs have |beta * h| in the hundreds.
"""

import torch


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """Each input: (B,) float sequence log-probs. Returns losses (B,)."""
    raise NotImplementedError("write -log sigmoid(beta * h)")
