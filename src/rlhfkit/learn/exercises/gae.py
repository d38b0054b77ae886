"""Exercise: Generalised Advantage Estimation (docs/learn: what is GAE).

Write `gae` below, then run:  rlhfkit selfcheck --exercise gae THIS_FILE

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lam * A_{t+1}          (computed from the last token backwards)
    R_t     = A_t + V(s_t)                              (the value target)

Rows are right-padded: row b's valid tokens are t = 0 .. n_b - 1 (mask True), then padding
(mask False) whose rewards and values are garbage. The state after a row's last valid token is
terminal: V = 0 there, and A after it is 0. Return 0 for both outputs at padding.
"""

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """rewards, values: (B, T) float; mask: (B, T) bool, right-padded. Returns (advantages, returns), (B, T) each."""
    raise NotImplementedError("write gae: loop t from T-1 down to 0")
