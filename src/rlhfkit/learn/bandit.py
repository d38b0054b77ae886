"""Policy gradients from scratch on a categorical bandit (docs/learn/02-policy-gradients.md).

One state, K actions ("arms"); arm k pays a reward drawn from N(means_k, noise^2). The policy is
pi = softmax(theta) with theta (K,) its logits: an episode is one action, the smallest case of a
language model's response (one token, scored at once). Everything runs in float64 in milliseconds.

    J(theta)        = E_{a ~ pi}[R(a)] = sum_k pi_k means_k
    grad J          = E_{a ~ pi}[(R(a) - b) grad log pi(a)]      (log-derivative trick; any b)
    grad log pi(a)  = onehot(a) - pi                              (softmax logits)

`reinforce_step` takes one step of that estimate per batch; `ppo_step` takes `epochs` steps on
the same batch with the clipped surrogate of `rlhfkit.algos.ppo_policy_loss`, the importance ratio
pi(a) / pi_old(a) correcting for the batch having been drawn from the policy before the first of
them. `train` runs either and records the expected reward and how far each iteration moved the
policy (KL(pi_old || pi_new), exact over the K arms).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfkit import algos
from rlhfkit.core.devices import HOST

MEANS = (0.2, 0.5, 0.8, 0.4, 0.1)  # the arms' mean rewards: arm 2 is best
NOISE = 1.0  # sd of a reward around its arm's mean: a draw says little, many draws say more


def expected_reward(theta: torch.Tensor, means: torch.Tensor) -> float:
    """J(theta) = sum_k softmax(theta)_k means_k, exactly. theta, means: (K,)."""
    return float((theta.softmax(-1) * means).sum())


def kl(old_theta: torch.Tensor, theta: torch.Tensor) -> float:
    """KL(pi_old || pi) over the K arms, exactly (nats). old_theta, theta: (K,)."""
    old, new = old_theta.log_softmax(-1), theta.log_softmax(-1)
    return float((old.exp() * (old - new)).sum())


def sample(theta: torch.Tensor, n: int, means: torch.Tensor, noise: float,
           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n actions a ~ softmax(theta) and their rewards means[a] + noise * N(0, 1): (n,) long, (n,) float64."""
    actions = torch.multinomial(theta.softmax(-1), n, replacement=True, generator=generator)
    rewards = means[actions] + noise * torch.randn(n, generator=generator, dtype=means.dtype, device=means.device)
    return actions, rewards


def reinforce_gradient(theta: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                       baseline: bool = True) -> torch.Tensor:
    """Sample estimate of grad J: mean_i (r_i - b) (onehot(a_i) - pi), b = the batch's mean reward
    (or 0 without a baseline). theta: (K,); actions, rewards: (n,). Returns (K,).
    (With b the batch mean the estimate is biased by a factor (n - 1) / n, negligible here; a
    leave-one-out mean, RLOO's, removes even that.)"""
    pi = theta.softmax(-1)
    b = rewards.mean() if baseline else 0.0
    score = torch.nn.functional.one_hot(actions, theta.shape[0]).to(theta.dtype) - pi  # (n, K) grad log pi(a_i)
    return ((rewards - b)[:, None] * score).mean(0)


def reinforce_step(theta: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, lr: float,
                   baseline: bool = True) -> torch.Tensor:
    """One gradient-ascent step theta + lr * grad J estimate. Returns the new theta (K,)."""
    return theta + lr * reinforce_gradient(theta, actions, rewards, baseline)


def ppo_step(theta: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, lr: float, epochs: int,
             clip_eps: float | None, whiten: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """`epochs` gradient steps on one batch with PPO's clipped surrogate (clip_eps None: unclipped,
    the plain importance-sampled surrogate). Advantages: rewards minus their batch mean (divided by
    their std too with `whiten`, as the trainer's whiten_advantages does), constants.
    Returns (new theta (K,), `ppo_policy_loss`'s metrics averaged over the epochs)."""
    old_logp = theta.log_softmax(-1)[actions][None].detach()  # (1, n) log pi_old(a_i): kept, no gradient
    mask = torch.ones(1, len(actions), dtype=torch.bool, device=actions.device)
    adv = algos.masked_whiten(rewards[None], mask) if whiten else (rewards - rewards.mean())[None]  # (1, n)
    theta = theta.clone().requires_grad_(True)
    sums: dict[str, float] = {}
    for _ in range(epochs):
        logp = theta.log_softmax(-1)[actions][None]  # (1, n) log pi(a_i), recomputed with gradient
        loss, m = algos.ppo_policy_loss(logp, old_logp, adv, mask, clip_eps=1e9 if clip_eps is None else clip_eps)
        (grad,) = torch.autograd.grad(loss, theta)
        theta = (theta - lr * grad).detach().requires_grad_(True)  # descend the loss = ascend the surrogate
        sums = {k: sums.get(k, 0.0) + v / epochs for k, v in m.items()}
    return theta.detach(), sums


@dataclass
class Trace:
    """What `train` records per iteration: J after the update, KL(pi_before || pi_after), and for
    PPO the update's metrics under the trainer's names (params/approx_kl, params/policy_clip_frac)."""

    reward: list[float]
    step_kl: list[float]
    metrics: list[dict[str, float]]


def train(method: str, iterations: int = 40, batch: int = 32, lr: float = 1.0, epochs: int = 4,
          clip_eps: float | None = 0.2, seed: int = 0, means: tuple[float, ...] = MEANS,
          noise: float = NOISE, whiten: bool = False) -> Trace:
    """Run "reinforce" (one step per batch), "reinforce-no-baseline" or "ppo" (`epochs` steps per
    batch, clipped unless clip_eps is None) from uniform logits; the same seed draws the same first batch."""
    if method not in ("reinforce", "reinforce-no-baseline", "ppo"):
        raise ValueError(f"method must be reinforce, reinforce-no-baseline or ppo, got {method!r}")
    g = torch.Generator(device=HOST).manual_seed(seed)
    mu = torch.tensor(means, dtype=torch.float64, device=HOST)
    theta = torch.zeros(len(means), dtype=torch.float64, device=HOST)
    trace = Trace([], [], [])
    for _ in range(iterations):
        actions, rewards = sample(theta, batch, mu, noise, g)
        if method == "ppo":
            new, m = ppo_step(theta, actions, rewards, lr, epochs, clip_eps, whiten)
            trace.metrics.append({"params/approx_kl": m["approx_kl"], "params/policy_clip_frac": m["policy_clip_frac"]})
        else:
            new = reinforce_step(theta, actions, rewards, lr, baseline=method == "reinforce")
        trace.step_kl.append(kl(theta, new))
        trace.reward.append(expected_reward(new, mu))
        theta = new
    return trace
