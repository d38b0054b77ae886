"""PPO's own maths through the trainer's functions, against arithmetic written here:
`compute_advantages` (KL shaping -> GAE -> whitening with the statistics of every process),
`kl_penalty="loss"`, and the update's gradient, which must not depend on how a mini-batch is split
into micro-batches (GRPO, DPO and SFT have the same test)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlhfkit.core.config import build_config
from rlhfkit.models.policy import ActorCritic, ValueHead
from rlhfkit.rollout import Rollout, SamplingParams, forward_logprobs, generate, logprob_pass
from rlhfkit.rollout.core import trim_rows
from rlhfkit.trainers.ppo import compute_advantages, micro_batch_loss
from rlhfkit.trainers.ppo_config import PPOConfig

from tiny_lm import build_tiny_model, build_tokenizer

JUNK = 9.0  # at padding: must change nothing


def cfg_with(**kw) -> PPOConfig:
    base = {"rollout_batch_size": 8, "mini_batch_size": 8, "micro_batch_size": 1, "dtype": "fp32", "gamma": 1.0,
            "lam": 0.5, "kl_estimator": "k1", "whiten_advantages": True}
    return build_config(PPOConfig, {**base, **kw})


def two_rows() -> Rollout:
    """Row 0: 3 valid tokens, row 1: 2 (its third position is padding, filled with junk)."""
    return Rollout(
        query_ids=torch.zeros(2, 1, dtype=torch.long), query_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.zeros(2, 3, dtype=torch.long), response_mask=torch.tensor([[1.0, 1, 1], [1, 1, 0]]),
        stopped=torch.tensor([True, True]),
        logprobs=torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, JUNK]]),
        ref_logprobs=torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -0.9, JUNK]]),
        values=torch.tensor([[0.5, 0.2, -0.1], [0.1, 0.4, JUNK]]),
        scores=torch.tensor([1.0, -2.0]))


def test_compute_advantages_golden_shaping_gae_whitening():
    """beta = 0.1, k1 = logp - ref: row 0 [0.5, -1, 0], row 1 [-0.1, 0.2].
    rewards = -beta k1, the score added on the last valid token:
      row 0 [-0.05, 0.1, 0 + 1] ; row 1 [0.01, -0.02 - 2].
    GAE, gamma = 1, lambda = 0.5, V = 0 after the last valid token:
      row 0: d2 = 1 - (-0.1) = 1.1, d1 = 0.1 - 0.1 - 0.2 = -0.2, d0 = -0.05 + 0.2 - 0.5 = -0.35
             A = [-0.35 + 0.5 * 0.35, -0.2 + 0.5 * 1.1, 1.1] = [-0.175, 0.35, 1.1]
      row 1: d1 = -2.02 - 0.4 = -2.42, d0 = 0.01 + 0.4 - 0.1 = 0.31; A = [0.31 - 1.21, -2.42] = [-0.9, -2.42]
    returns = A + V (before whitening) = [0.325, 0.55, 1.0], [-0.8, -2.02];
    advantages whitened over the 5 valid tokens with the population variance."""
    ro = two_rows()
    ro, m = compute_advantages(ro, cfg_with(), kl_coef=0.1)
    mask = ro.response_mask.bool()
    torch.testing.assert_close(ro.rewards[mask], torch.tensor([-0.05, 0.1, 1.0, 0.01, -2.02]))
    torch.testing.assert_close(ro.returns[mask], torch.tensor([0.325, 0.55, 1.0, -0.8, -2.02]))
    raw = [-0.175, 0.35, 1.1, -0.9, -2.42]
    mean = sum(raw) / 5  # -0.409
    var = sum((a - mean) ** 2 for a in raw) / 5
    torch.testing.assert_close(ro.advantages[mask], torch.tensor([(a - mean) / math.sqrt(var + 1e-8) for a in raw]))
    assert ro.advantages[1, 2] == 0 and ro.returns[1, 2] == 0 and ro.rewards[1, 2] == 0
    assert m["rollout/kl"] == pytest.approx((-0.5 + 0.1) / 2)  # summed k1 per sequence, mean over rows
    assert m["rollout/non_score_reward"] == pytest.approx((0.05 - 0.01) / 2)
    assert m["rollout/advantage_mean_raw"] == pytest.approx(mean)
    assert m["rollout/return_mean"] == pytest.approx((0.325 + 0.55 + 1.0 - 0.8 - 2.02) / 5)
    assert m["rollout/value_mean"] == pytest.approx((0.5 + 0.2 - 0.1 + 0.1 + 0.4) / 5)
    # explained variance: R - V = A = raw; 1 - Var(raw) / Var(R), population variances over the 5 valid tokens
    ret = [0.325, 0.55, 1.0, -0.8, -2.02]
    var_ret = sum((r - sum(ret) / 5) ** 2 for r in ret) / 5
    assert m["rollout/explained_variance"] == pytest.approx(1 - var / var_ret, rel=1e-5)


class OtherProcess:
    """An accelerator of 2 processes whose other process holds valid advantages `other`: `reduce`
    adds that process's (sum, sum of squares, count), as an all-reduce would."""

    num_processes = 2
    device = torch.device("cpu")

    def __init__(self, other: list[float]):
        o = torch.tensor(other, dtype=torch.float64)
        self.theirs = torch.stack([o.sum(), (o * o).sum(), torch.tensor(float(len(other)), dtype=torch.float64)])

    def reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        assert op == "sum"
        return t + self.theirs


def test_advantages_are_whitened_with_the_statistics_of_every_process():
    """The same two rows, and another process with valid raw advantages [3, -1, 0.5]: mean and
    population variance over all 8 valid advantages, not this process's 5."""
    ro = two_rows()
    ro, _ = compute_advantages(ro, cfg_with(), kl_coef=0.1, accelerator=OtherProcess([3.0, -1.0, 0.5]))
    raw = [-0.175, 0.35, 1.1, -0.9, -2.42]
    every = raw + [3.0, -1.0, 0.5]
    mean = sum(every) / 8  # 0.0569 (local mean: -0.409)
    var = sum((a - mean) ** 2 for a in every) / 8
    expected = torch.tensor([(a - mean) / math.sqrt(var + 1e-8) for a in raw])
    torch.testing.assert_close(ro.advantages[ro.response_mask.bool()], expected)


def test_kl_penalty_in_the_loss_leaves_the_rewards_without_kl():
    """kl_penalty="loss": the rewards hold the score alone (the KL goes to the loss as beta * k3);
    rollout/kl is still the summed k1 and GAE runs on the score-only rewards."""
    ro = two_rows()
    ro, m = compute_advantages(ro, cfg_with(kl_penalty="loss"), kl_coef=0.1)
    torch.testing.assert_close(ro.rewards, torch.tensor([[0.0, 0.0, 1.0], [0.0, -2.0, 0.0]]))
    assert m["rollout/kl"] == pytest.approx(-0.2) and m["rollout/non_score_reward"] == 0.0
    # row 1: d1 = -2 - 0.4 = -2.4, d0 = 0.4 - 0.1 = 0.3, A0 = 0.3 + 0.5 * -2.4 = -0.9; returns = A + V
    torch.testing.assert_close(ro.returns[1, :2], torch.tensor([-0.9 + 0.1, -2.4 + 0.4]))


# ----------------------------------------------------------------------------- the update's loss


@pytest.fixture()
def scored():
    """A tiny actor-critic and a scored rollout of 8 responses of different lengths, the policy and
    value head then moved away from the rollout's so that the ratio and value clips both act."""
    tok = build_tokenizer()
    tok.padding_side = "left"
    actor = ActorCritic(build_tiny_model(len(tok), seed=3), ValueHead(32))
    torch.manual_seed(0)
    ro = generate(actor.policy, tok, ["Hi", "Write a review", "What is 3 + 4?", "Go"] * 2,
                  SamplingParams(max_new_tokens=8, stop_ids=(2,)))
    ro.response_mask[0, 3:] = 0
    ro.response_mask[5, 5:] = 0
    ro = logprob_pass(actor, None, ro, 1.0, micro_batch_size=8)
    g = torch.Generator().manual_seed(1)
    ro = dataclasses.replace(ro, ref_logprobs=ro.logprobs + 0.3 * torch.randn(ro.logprobs.shape, generator=g) * ro.response_mask)
    ro = dataclasses.replace(ro, advantages=torch.randn(ro.logprobs.shape, generator=g) * ro.response_mask)
    ro = dataclasses.replace(ro, returns=torch.randn(ro.logprobs.shape, generator=g) * ro.response_mask)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return actor, ro


def assert_grads_close(got: list[torch.Tensor], expected: list[torch.Tensor], scale_of=None) -> None:
    """Equal up to float32 sums in another order: 1e-5 of each tensor's largest entry, and at least
    1e-8 of the largest entry of all (`scale_of`, default `expected`): a tensor whose exact
    gradient is 0 holds only rounding noise of the terms summed, which is no scale."""
    largest = max(float(t.abs().max()) for t in (scale_of or expected))
    assert largest > 0
    for g, f in zip(got, expected):
        torch.testing.assert_close(g, f, rtol=1e-4, atol=1e-5 * max(float(f.abs().max()), 1e-3 * largest))


def loss_and_grads(actor, ro: Rollout, cfg: PPOConfig, splits: list[int], kl_coef: float = 0.2,
                   local_normalisers: bool = False) -> tuple[float, list[torch.Tensor], float]:
    """Sum of micro-batch losses and the accumulated gradient for one split of the 8 rows."""
    actor.zero_grad()
    n_tok, total, clip, start = ro.response_mask.sum().item(), 0.0, 0.0, 0
    for size in splits:
        mb = trim_rows(ro, torch.arange(start, start + size))
        nt, ns = (mb.response_mask.sum().item(), float(size)) if local_normalisers else (n_tok, 8.0)
        loss, st = micro_batch_loss(actor, mb, cfg, kl_coef, nt, torch.device("cpu"), ns)
        loss.backward()
        total += loss.item()
        clip += st["policy_clip_frac"] + st["value_clip_frac"]
        start += size
    return total, [p.grad.clone() for p in actor.parameters()], clip


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_loss_and_gradient_do_not_depend_on_the_micro_batch_split(scored, agg):
    """Policy, value (clipped), entropy and in-loss KL terms: every split of the mini-batch gives the
    loss and gradient of one micro-batch of 8 rows (float32 sums in another order: 1e-5 of the
    gradient's own largest entry); per-micro-batch normalisers would not."""
    actor, ro = scored
    cfg = cfg_with(loss_agg=agg, ent_coef=0.01, kl_penalty="loss", clip_eps=0.05, value_clip_eps=0.05)
    full_loss, full_grad, clip = loss_and_grads(actor, ro, cfg, [8])
    assert clip > 0, "the clipped branches must be exercised"
    for splits in ([4, 4], [2, 2, 2, 2], [1, 3, 4], [1] * 8):
        loss, grad, _ = loss_and_grads(actor, ro, cfg, splits)
        assert loss == pytest.approx(full_loss, rel=1e-5), splits
        assert_grads_close(grad, full_grad)
    loss, _, _ = loss_and_grads(actor, ro, cfg, [1, 3, 4], local_normalisers=True)
    assert abs(loss / 3 - full_loss) > 1e-3 * abs(full_loss)  # the check can fail


BY_HAND = {"k3": lambda d: d.exp() - 1 - d, "k2": lambda d: 0.5 * d * d}


def test_kl_penalty_in_the_loss_adds_beta_times_the_token_mean_of_k3(scored):
    """loss(kl_penalty="loss") - loss(kl_penalty="reward") = beta * sum(k3 * mask) / N, in value and
    in gradient, with k3 = exp(d) - 1 - d and d = ref_logp - logp under the current policy."""
    assert_kl_term_in_the_loss(*scored, "k3")


def test_kl_loss_estimator_k2_adds_beta_times_the_token_mean_of_half_d_squared(scored):
    """kl_loss_estimator="k2": the term is beta * sum(d^2 / 2 * mask) / N, whose on-policy gradient is
    that of KL(pi || pi_ref) itself (docs/learn/14-the-update.md, entry 17)."""
    assert_kl_term_in_the_loss(*scored, "k2")


def assert_kl_term_in_the_loss(actor, ro: Rollout, estimator: str) -> None:
    beta, n_tok = 0.2, ro.response_mask.sum().item()
    with_kl, g_kl, _ = loss_and_grads(actor, ro, cfg_with(kl_penalty="loss", kl_loss_estimator=estimator), [8], beta)
    without, g0, _ = loss_and_grads(actor, ro, cfg_with(kl_penalty="reward"), [8], beta)
    actor.zero_grad()
    logp, _, _ = forward_logprobs(actor, ro, 1.0, with_values=False)
    d = (ro.ref_logprobs - logp)[ro.response_mask.bool()]
    kl_term = beta * BY_HAND[estimator](d).sum() / n_tok
    kl_term.backward()
    assert with_kl - without == pytest.approx(kl_term.item(), rel=1e-4)
    assert kl_term.item() > 1e-4
    got = [a - b for a, b in zip(g_kl, g0)]
    assert_grads_close(got, [p.grad if p.grad is not None else torch.zeros_like(p) for p in actor.parameters()],
                       scale_of=g0)
