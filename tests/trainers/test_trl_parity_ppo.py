"""Parity with trl 1.12's PPOTrainer (the last TRL with PPO: 1.13+ removed it; the `bench` extra pins
trl==1.12.0, which cannot be installed beside the `dev` extra's 1.16). These tests run only where trl < 1.13
is importable and skip otherwise, e.g. with `pip install --target DIR trl==1.12.0 --no-deps` and DIR first on
PYTHONPATH.

TRL 1.12 computes PPO's rewards, GAE, whitening and losses inline in PPOTrainer.train(), not in functions
of their own: each test runs TRL's own source lines, taken from the installed PPOTrainer.train between two
of its statements, on the given tensors (names as TRL's), and rlhfkit's trainer functions on the same
tensors (trainers/advantages.py compute_advantages, trainers/ppo.py micro_batch_loss): loss and gradients
to round-off. Each known difference is a named test that shows it.
"""

from __future__ import annotations

import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
_major_minor = tuple(int(x) for x in trl.__version__.split(".")[:2])
pytestmark = pytest.mark.skipif(
    _major_minor >= (1, 13),
    reason=f"PPO parity needs trl < 1.13 (the last PPOTrainer; trl {trl.__version__} is installed, 1.13 removed it): "
           "pip install --target DIR trl==1.12.0 --no-deps, then put DIR first on PYTHONPATH")

B, Q, R = 4, 3, 6  # rows, query tokens, response tokens
PAD = 0


def _trl_lines(first: str, last: str, **names) -> dict:
    """Run trl 1.12's PPOTrainer.train source from the statement starting with `first` to the one starting
    with `last` (inclusive, one indentation level) with the module's globals and `names`; its namespace."""
    from trl.experimental.ppo import ppo_trainer as mod

    src = inspect.getsource(mod.PPOTrainer.train).splitlines()
    i = next(k for k, line in enumerate(src) if line.strip().startswith(first))
    j = next(k for k in range(i, len(src)) if src[k].strip().startswith(last))
    ns = {**vars(mod), **names}
    exec(compile(textwrap.dedent("\n".join(src[i : j + 1])), mod.__file__, "exec"), ns)  # noqa: S102 (TRL's own lines)
    return ns


def _rollout(lengths: list[int], seed: int = 0, dtype=torch.float32):
    """Sampled log-probs, reference log-probs, values (B, R), scores (B,) and responses (B, R) whose row i has
    lengths[i] tokens then padding (PAD), as TRL's rollout holds them."""
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(3, 50, (B, R), generator=g)
    for i, n in enumerate(lengths):
        responses[i, n:] = PAD
    logprobs = -torch.rand(B, R, generator=g, dtype=dtype) * 2
    ref = logprobs + (torch.rand(B, R, generator=g, dtype=dtype) - 0.5)
    values = torch.randn(B, R, generator=g, dtype=dtype)
    scores = torch.randn(B, generator=g, dtype=dtype) * 2
    return responses, logprobs, ref, values, scores


def _trl_advantages(responses, logprobs, ref, values, scores, kl_coef=0.05, gamma=0.99, lam=0.95, estimator="k1"):
    """trl 1.12's steps: padding masks from the first pad, rewards (-kl_coef x KL, + the score), GAE,
    returns, whitened advantages."""
    from trl.experimental.utils import first_true_indices

    sequence_lengths = first_true_indices(responses == PAD) - 1
    args = SimpleNamespace(kl_estimator=estimator, kl_coef=kl_coef, whiten_rewards=False, gamma=gamma, lam=lam)
    return _trl_lines("response_idxs = torch.arange(responses.shape[1]",
                      "advantages = torch.masked_fill(advantages, padding_mask, 0)",
                      responses=responses, logprobs=logprobs.clone(), ref_logprobs=ref.clone(), values=values.clone(),
                      scores=scores, sequence_lengths=sequence_lengths, args=args)


def _ppo_cfg(**kw):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo_config import PPOConfig

    return build_config(PPOConfig, {"model": "unused", "prompts": "p.jsonl", "rollout_batch_size": B,
                                    "mini_batch_size": B, "micro_batch_size": B, "max_new_tokens": R,
                                    "dtype": "fp32", **kw})


def _our_advantages(responses, logprobs, ref, values, scores, **kw):
    from rlhfkit.rollout import Rollout
    from rlhfkit.trainers.advantages import compute_advantages

    mask = (responses != PAD).to(logprobs.dtype)
    ro = Rollout(query_ids=torch.ones(B, Q, dtype=torch.long), query_mask=torch.ones(B, Q, dtype=torch.long),
                 response_ids=responses, response_mask=mask, stopped=torch.ones(B, dtype=torch.bool),
                 logprobs=logprobs * mask, ref_logprobs=ref * mask, values=values * mask, scores=scores)
    cfg = _ppo_cfg(**kw)
    out, _ = compute_advantages(ro, cfg, cfg.kl_coef)
    return out


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_ppo_rewards_gae_and_returns_match_trl_112(estimator):
    """Full-length responses (no padding): TRL's rewards, GAE returns and its whitened advantages are
    rlhfkit's (rlhfkit's raw GAE whitened by TRL's own masked_whiten: the variance is the one difference)."""
    from trl.experimental.ppo.ppo_trainer import masked_whiten

    data = _rollout([R] * B)
    ns = _trl_advantages(*data, estimator=estimator)
    raw = _our_advantages(*data, kl_coef=0.05, gamma=0.99, lam=0.95, kl_estimator=estimator,
                          whiten_advantages=False)
    torch.testing.assert_close(raw.rewards, ns["rewards"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(raw.returns, ns["returns"], rtol=1e-5, atol=1e-6)
    mask = torch.ones(B, R, dtype=torch.bool)
    torch.testing.assert_close(masked_whiten(raw.advantages, mask), ns["advantages"], rtol=1e-5, atol=1e-6)


def test_known_difference_unbiased_whitening_in_trl_112():
    """TRL whitens the advantages with the unbiased variance (n / (n - 1)), rlhfkit with the population
    variance: rlhfkit's whitened advantages are TRL's times sqrt(n / (n - 1)), n the valid tokens (24)."""
    data = _rollout([R] * B, seed=1)
    ns = _trl_advantages(*data)
    ours = _our_advantages(*data, kl_coef=0.05, gamma=0.99, lam=0.95).advantages
    n = B * R
    torch.testing.assert_close(ours, ns["advantages"] * (n / (n - 1)) ** 0.5, rtol=1e-4, atol=1e-6)
    assert (ours - ns["advantages"]).abs().max() > 1e-3


def test_known_difference_score_at_the_first_pad_in_trl_112():
    """With a response shorter than the width, TRL adds the score at the first PAD position (index
    sequence_length + 1) and keeps that position's value in GAE (padding_mask_p1); rlhfkit adds it on the
    last generated token (docs/pitfalls.md#score-placement) and masks everything after it."""
    lengths = [6, 4, 3, 5]
    data = _rollout(lengths, seed=2)
    scores = data[4]
    ns = _trl_advantages(*data, kl_coef=0.0)
    ours = _our_advantages(*data, kl_coef=0.0, gamma=0.99, lam=0.95)
    for i, n in enumerate(lengths):
        at = n if n < R else R - 1  # TRL: one past the last token, unless the row is full
        assert ns["rewards"][i, at].item() == pytest.approx(scores[i].item(), rel=1e-6)
        assert ours.rewards[i, n - 1].item() == pytest.approx(scores[i].item(), rel=1e-6)
        if n < R:
            assert ns["rewards"][i, n - 1].item() == 0.0 and ours.rewards[i, n:].abs().sum() == 0
    short = torch.tensor(lengths) < R
    assert (ours.returns[short, 0] - ns["returns"][short, 0]).abs().max() > 1e-3


def _trl_losses(new_logprobs, vpred, mb_logprobs, mb_values, mb_return, mb_advantage, padding_mask, padding_mask_p1,
                cliprange=0.2, cliprange_value=0.2, vf_coef=0.1):
    """trl 1.12's clipped policy and value losses (PPOTrainer.train) on one micro-batch of every row."""
    context_length = Q
    vpred_temp = torch.cat([torch.zeros(B, Q - 1, dtype=vpred.dtype), vpred, torch.zeros(B, 1, dtype=vpred.dtype)],
                           1)[..., None]  # (B, Q + R, 1): the value model's output over query + response
    args = SimpleNamespace(cliprange=cliprange, cliprange_value=cliprange_value, vf_coef=vf_coef)
    return _trl_lines("new_logprobs = torch.masked_fill(", "loss = pg_loss + args.vf_coef * vf_loss",
                      new_logprobs=new_logprobs, vpred_temp=vpred_temp, context_length=context_length,
                      padding_mask=padding_mask, padding_mask_p1=padding_mask_p1,
                      micro_batch_inds=torch.arange(B), mb_values=mb_values, mb_return=mb_return,
                      mb_logprobs=mb_logprobs, mb_advantage=mb_advantage, args=args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ppo_clipped_policy_and_value_losses_match_trl_112(monkeypatch, dtype):
    """Full-length responses (TRL's two masks are then the same): trl 1.12's pg_loss + vf_coef x vf_loss and
    rlhfkit's PPO micro-batch loss (token-mean, clip 0.2, value clip 0.2), loss and gradients w.r.t. the new
    log-probs and values; old log-probs off by up to +-0.4 so that both clips act."""
    import rlhfkit.trainers.ppo as ppo
    from rlhfkit.rollout import Rollout

    g = torch.Generator().manual_seed(3)
    new_lp = (-torch.rand(B, R, generator=g, dtype=dtype) * 2).requires_grad_(True)
    vpred = torch.randn(B, R, generator=g, dtype=dtype).requires_grad_(True)
    old_lp = new_lp.detach() + (torch.rand(B, R, generator=g, dtype=dtype) - 0.5) * 0.8
    old_v = vpred.detach() + (torch.rand(B, R, generator=g, dtype=dtype) - 0.5)
    ret = torch.randn(B, R, generator=g, dtype=dtype)
    adv = torch.randn(B, R, generator=g, dtype=dtype)
    none = torch.zeros(B, R, dtype=torch.bool)
    theirs = _trl_losses(new_lp, vpred, old_lp, old_v, ret, adv, none, none)["loss"]

    monkeypatch.setattr(ppo, "forward_logprobs", lambda actor, mb, temperature, **kw: (
        new_lp, vpred, torch.zeros(B, R, dtype=dtype)))
    mb = Rollout(query_ids=torch.ones(B, Q, dtype=torch.long), query_mask=torch.ones(B, Q, dtype=torch.long),
                 response_ids=torch.ones(B, R, dtype=torch.long), response_mask=torch.ones(B, R, dtype=dtype),
                 stopped=torch.ones(B, dtype=torch.bool), logprobs=old_lp, values=old_v, returns=ret,
                 advantages=adv)
    ours, _ = ppo.micro_batch_loss(None, mb, _ppo_cfg(), 0.05, float(B * R), torch.device("cpu"))
    g_t = torch.autograd.grad(theirs, [new_lp, vpred], retain_graph=True)
    g_o = torch.autograd.grad(ours, [new_lp, vpred])
    eps = torch.finfo(dtype).eps
    assert ours.item() == pytest.approx(theirs.item(), rel=64 * eps)
    for a, b in zip(g_o, g_t):
        scale = b.abs().max().item()
        assert scale > 0
        torch.testing.assert_close(a, b, rtol=64 * eps, atol=64 * eps * scale)
