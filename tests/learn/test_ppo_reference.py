"""rlhfkit.learn.ppo_reference, the learning path's entry 1: the readable PPO iteration built on
rlhfkit.algos computes what the trainer computes (trainers/ppo.py and trainers/rl_update.py), from
the same rollout and the same weights: old log-probs and values, advantages and returns, and the
weights after two epochs of two mini-batches each."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from accelerate import Accelerator

from rlhfkit.core.config import build_config
from rlhfkit.learn import ppo_reference as ref
from rlhfkit.models.policy import ActorCritic, ValueHead
from rlhfkit.rollout import Rollout, SamplingParams, generate, logprob_pass
from rlhfkit.runtime.optim import make_optimizer
from rlhfkit.trainers.ppo import compute_advantages, micro_batch_loss
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.rl_update import update_policy

from tiny_lm import build_tiny_model, build_tokenizer

SETTINGS = {"rollout_batch_size": 8, "mini_batch_size": 4, "micro_batch_size": 4, "ppo_epochs": 2, "dtype": "fp32",
            "temperature": 0.7, "gamma": 1.0, "lam": 0.95, "kl_coef": 0.1, "clip_eps": 0.1, "value_clip_eps": 0.05,
            "vf_coef": 0.5, "max_grad_norm": 0.5, "lr": 0.02, "warmup_steps": 2}


def as_model(actor: ActorCritic):
    """The trainer's actor-critic as the reference's `model(ids, mask) -> (logits, values)`: position
    ids from the mask (left padding), the value head on the last hidden states."""
    def model(input_ids, attention_mask):
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = actor.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                           output_hidden_states=True)
        return out.logits, actor.value_head(out.hidden_states[-1])
    return model


@pytest.fixture()
def start():
    """A tiny actor-critic with a non-zero value head, 8 sampled responses of different lengths with
    scores, and a reference model that differs from the policy."""
    tok = build_tokenizer()
    tok.padding_side = "left"
    actor = ActorCritic(build_tiny_model(len(tok), seed=3), ValueHead(32))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        actor.value_head.summary.weight.copy_(0.3 * torch.randn(actor.value_head.summary.weight.shape, generator=g))
    torch.manual_seed(0)
    ro = generate(actor.policy, tok, ["Hi", "Write a review", "What is 3 + 4?", "Go"] * 2,
                  SamplingParams(max_new_tokens=8, temperature=0.7, stop_ids=(2,)))
    ro = dataclasses.replace(ro, scores=torch.tensor([1.0, -0.5, 0.2, 2.0, 0.0, -1.0, 0.7, 0.3]))
    reference = ActorCritic(build_tiny_model(len(tok), seed=4), ValueHead(32))
    return actor, reference, ro


def trainer_iteration(actor, ro, ref_logprobs, cfg: PPOConfig, seed: int) -> Rollout:
    """What `rlhfkit ppo`'s `train` runs for one iteration after sampling: steps 3-6; returns the rollout."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randperm(cfg.rollout_batch_size, generator=g)
    ro = logprob_pass(actor, None, ro, cfg.temperature, cfg.micro_batch_size, order=first)
    ro = dataclasses.replace(ro, ref_logprobs=ref_logprobs)
    ro, _ = compute_advantages(ro, cfg, cfg.kl_coef)
    opt, sched = make_optimizer(actor.parameters(), cfg.lr, cfg.warmup_steps)

    def loss_fn(mb, n_tokens, n_seqs):
        return micro_batch_loss(actor, mb, cfg, cfg.kl_coef, n_tokens, torch.device("cpu"), n_seqs)

    update_policy(actor, opt, sched, Accelerator(cpu=True), ro, loss_fn, epochs=cfg.ppo_epochs,
                  mini_batch_size=cfg.mini_batch_size, micro_batch_size=cfg.micro_batch_size,
                  max_grad_norm=cfg.max_grad_norm, ratio_check_tol=cfg.ratio_check_tol, generator=g, first_perm=first)
    return ro


def test_the_reference_iteration_computes_what_the_trainer_computes(start):
    actor, reference, ro = start
    cfg = build_config(PPOConfig, SETTINGS)
    mine, my_ro = copy.deepcopy(actor), copy.deepcopy(ro)
    before = [p.detach().clone() for p in actor.parameters()]

    opt, sched = make_optimizer(mine.parameters(), cfg.lr, cfg.warmup_steps)
    my_ro, metrics = ref.ppo_iteration(as_model(mine), as_model(reference), opt, my_ro, temperature=cfg.temperature,
                                kl_coef=cfg.kl_coef, gamma=cfg.gamma, lam=cfg.lam, epochs=cfg.ppo_epochs,
                                mini_batch_size=cfg.mini_batch_size, clip_eps=cfg.clip_eps,
                                value_clip_eps=cfg.value_clip_eps, vf_coef=cfg.vf_coef,
                                max_grad_norm=cfg.max_grad_norm, generator=torch.Generator().manual_seed(7),
                                scheduler=sched)
    ro = trainer_iteration(actor, ro, my_ro.ref_logprobs.clone(), cfg, seed=7)

    mask = ro.response_mask.bool()
    assert my_ro.ref_logprobs[mask].sub(my_ro.logprobs[mask]).abs().max() > 0.1  # the KL term matters
    for name in ("logprobs", "values", "rewards", "advantages", "returns"):
        got, want = getattr(my_ro, name)[mask], getattr(ro, name)[mask]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(want.abs().max())), msg=name)
    assert metrics["policy_clip_frac"] > 0 and metrics["value_clip_frac"] > 0  # both clips act
    moved = max(float((a.detach() - b).abs().max()) for a, b in zip(actor.parameters(), before))
    assert moved > 1e-3
    # The same weights up to float32 sums in another order, which Adam amplifies where a gradient is
    # nearly 0 (it divides by its own running size): one such element may differ by a good part of its own
    # tiny step (seen: 1.6e-3 of the largest move on an Intel AVX-512 FP16 CPU, below 1e-3 on an AMD one).
    # So the check is on the whole update: the two differ by under 0.1% of its norm; a wrong loss moves
    # every weight differently and differs by a large share of it.
    update = torch.cat([(b.detach() - a0).flatten() for b, a0 in zip(actor.parameters(), before)])
    diff = torch.cat([(a.detach() - b.detach()).flatten() for a, b in zip(mine.parameters(), actor.parameters())])
    assert float(diff.norm()) <= 1e-3 * float(update.norm()), (float(diff.norm()), float(update.norm()))


def test_the_response_positions_are_the_ones_before_each_response_token():
    """L = 5, R = 2: the outputs at positions 2 and 3 predict tokens 3 and 4."""
    x = torch.arange(5).view(1, 5)
    assert ref.response_positions(x, 2).tolist() == [[2, 3]]
