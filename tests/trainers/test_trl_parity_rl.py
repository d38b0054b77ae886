"""Parity with TRL 1.16 for the RL losses (the `dev` extra installs trl==1.16.0): GRPO's aggregations
(loss_type grpo / dapo / bnpo / dr_grpo) with and without the KL term, GRPO's and RLOO's advantages and
RLOO's loss, each computed by TRL's own trainer code on a stand-in trainer (object.__new__ of TRL's class
plus the attributes its method reads) and by rlhfkit's trainer functions on the same tensors: loss and
gradients to round-off. Each known difference is a named test that shows it numerically.

The per-token log-probs of micro-batch rows come from one leaf tensor: the stand-in model of each side
looks its rows up by the row index written in the first prompt column.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.skipif(not trl.__version__.startswith("1.16."), reason="parity pinned to trl 1.16")

B, G, P, T = 4, 2, 2, 5  # completions, group size, prompt tokens, completion tokens
LENGTHS = [5, 3, 2, 4]


def _accelerator():
    return SimpleNamespace(device=torch.device("cpu"), num_processes=1, process_index=0, sync_gradients=True,
                           gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x)


def _metrics():
    return defaultdict(lambda: defaultdict(list))


def _standin(cls, **attrs):
    """An instance of TRL's trainer class without its __init__: the attributes its method reads."""
    me = object.__new__(cls)
    me.__dict__.update(attrs)
    return me


def _close(ours: torch.Tensor, theirs: torch.Tensor, leaf: torch.Tensor) -> None:
    """Loss to round-off relative to its size; gradient to round-off relative to its largest entry."""
    (g_theirs,) = torch.autograd.grad(theirs, leaf, retain_graph=True)
    (g_ours,) = torch.autograd.grad(ours, leaf, retain_graph=True)
    eps = torch.finfo(theirs.dtype).eps
    assert abs(ours.item() - theirs.item()) <= 64 * eps * max(abs(theirs.item()), 1e-2), (ours.item(), theirs.item())
    scale = g_theirs.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(g_ours, g_theirs, rtol=64 * eps, atol=64 * eps * scale)


def _rollout(seed: int = 0, dtype=torch.float32, on_policy: bool = False):
    """(logps leaf (B, T), old (B, T), ref (B, T), mask (B, T), advantages (B,)): old log-probs off by up to
    +-0.4 so that ratios leave the clip range (equal to logps with `on_policy`)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    logps = (-torch.rand(B, T, generator=g, dtype=dtype) * 2 - 0.1).requires_grad_(True)
    old = logps.detach() if on_policy else logps.detach() + (torch.rand(B, T, generator=g, dtype=dtype) - 0.5) * 0.8
    ref = logps.detach() + (torch.rand(B, T, generator=g, dtype=dtype) - 0.5)
    adv = torch.randn(B, generator=g, dtype=dtype)
    return logps, old * mask, ref * mask, mask, adv


def _trl_grpo(loss_type, rows, data, beta, eps_high=0.2, bias_correction=False, accumulation=1):
    """TRL 1.16's GRPOTrainer._compute_loss on the completions `rows` (one micro-batch of `accumulation`)."""
    from trl import GRPOTrainer

    logps, old, ref, mask, adv = data
    me = _standin(
        GRPOTrainer, model=SimpleNamespace(training=True), accelerator=_accelerator(), _metrics=_metrics(),
        _get_per_token_logps_and_entropies=lambda model, ids, attn, keep, **kw: (
            logps[ids[:, 0]], torch.zeros(len(ids), T, dtype=logps.dtype), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=beta,
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=eps_high, use_vllm=False,
        vllm_importance_sampling_correction=False, current_gradient_accumulation_steps=accumulation,
        max_completion_length=T, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        args=SimpleNamespace(use_bias_correction_kl=bias_correction, delta=None, steps_per_generation=accumulation))
    prompt_ids = torch.zeros(len(rows), P, dtype=torch.long)
    prompt_ids[:, 0] = rows
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(len(rows), P, dtype=torch.long),
              "completion_ids": torch.ones(len(rows), T, dtype=torch.long), "completion_mask": mask[rows],
              "advantages": adv[rows], "old_per_token_logps": old[rows], "ref_per_token_logps": ref[rows],
              "num_items_in_batch": mask.sum().to(logps.dtype)}  # the generation batch's tokens
    return GRPOTrainer._compute_loss(me, None, inputs)


def _grpo_cfg(**kw):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.grpo_config import GRPOConfig

    return build_config(GRPOConfig, {"model": "unused", "prompts": "p.jsonl", "rollout_batch_size": B,
                                     "group_size": G, "mini_batch_size": B, "micro_batch_size": B, "max_new_tokens": T, "dtype": "fp32",
                                     "clip_eps": 0.2, **kw})


def _our_grpo(monkeypatch, cfg, rows, data):
    """rlhfkit's GRPO loss of the micro-batch `rows` (trainers/grpo.py micro_batch_loss: the policy loss and
    the beta x KL term, aggregated by loss_agg with the optimiser batch's global counts)."""
    import rlhfkit.trainers.grpo as grpo
    from rlhfkit.rollout import Rollout

    logps, old, ref, mask, adv = data
    monkeypatch.setattr(grpo, "forward_logprobs", lambda model, mb, temperature, with_values, **kw: (
        logps[mb.query_ids[:, 0]], None, None))
    query = torch.zeros(len(rows), P, dtype=torch.long)
    query[:, 0] = rows
    m = mask[rows].to(logps.dtype)
    mb = Rollout(query_ids=query, query_mask=torch.ones(len(rows), P, dtype=torch.long),
                 response_ids=torch.ones(len(rows), T, dtype=torch.long), response_mask=m,
                 stopped=torch.ones(len(rows), dtype=torch.bool), logprobs=old[rows], ref_logprobs=ref[rows],
                 advantages=adv[rows, None] * m)
    loss, _ = grpo.micro_batch_loss(None, mb, cfg, float(mask.sum()), float(B), torch.device("cpu"))
    return loss


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grpo_aggregations_with_and_without_kl_match_trl(monkeypatch, loss_type, beta, dtype):
    """One micro-batch (gradient_accumulation_steps 1): rlhfkit's `loss_type=` (TRL's name, mapped to
    loss_agg) gives TRL's loss and gradient, with the k3 KL term (TRL's use_bias_correction_kl=False)."""
    data = _rollout(1, dtype)
    rows = torch.arange(B)
    theirs = _trl_grpo(loss_type, rows, data, beta)
    ours = _our_grpo(monkeypatch, _grpo_cfg(loss_type=loss_type, beta=beta), rows, data)
    _close(ours, theirs, data[0])


def test_grpo_clip_higher_matches_trls_epsilon_high(monkeypatch):
    data = _rollout(2)
    rows = torch.arange(B)
    theirs = _trl_grpo("dapo", rows, data, 0.0, eps_high=0.28)
    ours = _our_grpo(monkeypatch, _grpo_cfg(loss_type="dapo", clip_eps_high=0.28), rows, data)
    _close(ours, theirs, data[0])


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_grpo_aggregations_over_two_micro_batches_match_trl(monkeypatch, loss_type):
    """Two micro-batches of 2 (TRL: gradient_accumulation_steps = steps_per_generation = 2): the summed
    micro-batch losses agree; the micro-batches hold different token counts (5 + 3 and 2 + 4)."""
    data = _rollout(3)
    halves = (torch.tensor([0, 1]), torch.tensor([2, 3]))
    theirs = sum(_trl_grpo(loss_type, r, data, 0.04, accumulation=2) for r in halves)
    cfg = _grpo_cfg(loss_type=loss_type, beta=0.04, micro_batch_size=2)
    ours = sum(_our_grpo(monkeypatch, cfg, r, data) for r in halves)
    _close(ours, theirs, data[0])


def test_known_difference_bnpo_normalises_each_micro_batch_in_trl(monkeypatch):
    """TRL's bnpo divides each micro-batch by its own token count (then by the accumulation steps);
    rlhfkit's loss_type=bnpo is token-mean over the optimiser batch's tokens (as dapo). Equal with one
    micro-batch (above); with micro-batches of 8 and 6 tokens they differ."""
    data = _rollout(3)
    halves = (torch.tensor([0, 1]), torch.tensor([2, 3]))
    theirs = sum(_trl_grpo("bnpo", r, data, 0.0, accumulation=2) for r in halves)
    dapo = sum(_trl_grpo("dapo", r, data, 0.0, accumulation=2) for r in halves)
    cfg = _grpo_cfg(loss_type="bnpo", micro_batch_size=2)
    ours = sum(_our_grpo(monkeypatch, cfg, r, data) for r in halves)
    assert ours.item() == pytest.approx(dapo.item(), rel=1e-6)
    assert abs(ours.item() - theirs.item()) > 1e-3 * abs(theirs.item())


def test_known_difference_trls_kl_bias_correction_default(monkeypatch):
    """TRL 1.16 multiplies the KL term by the importance ratio by default (use_bias_correction_kl=True,
    DeepSeek-V3.2's unbiased reverse-KL gradient): on-policy the ratio is 1 so the loss is unchanged, but its
    gradient adds beta x k3 x grad log pi. rlhfkit's beta term is the plain k3 (TRL with the option off)."""
    data = _rollout(4, on_policy=True)
    rows = torch.arange(B)
    corrected = _trl_grpo("grpo", rows, data, 0.1, bias_correction=True)
    plain = _trl_grpo("grpo", rows, data, 0.1, bias_correction=False)
    ours = _our_grpo(monkeypatch, _grpo_cfg(loss_type="grpo", beta=0.1), rows, data)
    _close(ours, plain, data[0])
    assert corrected.item() == pytest.approx(ours.item(), rel=1e-6)
    (g_c,) = torch.autograd.grad(corrected, data[0])
    (g_o,) = torch.autograd.grad(ours, data[0])
    logps, _, ref, mask, _ = data
    d = (ref - logps).detach()
    k3 = torch.expm1(d) - d
    per_row = mask / mask.sum(1, keepdim=True) / B  # grpo: the mean over rows of each row's token mean
    torch.testing.assert_close(g_c - g_o, 0.1 * k3 * per_row, rtol=1e-4, atol=1e-7)
    assert (g_c - g_o).abs().max() > 1e-3


# ----------------------------------------------------------------------------- advantages (generation step)


REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, -1.0, 0.25, 0.75])  # 4 groups of 2


def _generation_standin(cls, rewards, **attrs):
    """TRL's trainer stand-in for _generate_and_score_completions: prompts and completions of fixed token
    ids, every reward from `rewards` (one reward function), log-probs zero (no reference: beta 0)."""
    n = len(rewards)
    plain = dict(
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False), accelerator=_accelerator(),
        _metrics=_metrics(), _tokenizer=SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None,
        mask_truncated_completions=False, args=SimpleNamespace(per_device_train_batch_size=n,
                                                               gradient_checkpointing_kwargs=None),
        _generate=lambda prompts: ([[5, 6]] * n, [[7, 8, 9]] * n, ["c"] * n),
        _get_per_token_logps_and_entropies=lambda *a, **k: (torch.zeros(n, 3), None, None),
        _calculate_rewards=lambda inputs, prompts, completions, ids: rewards[:, None].clone(),
        beta=0.0, ref_model=None, reward_weights=torch.ones(1), reward_clip_range=None,
        reward_func_names=["r"], reward_funcs=[None], _logs={"prompt": [], "completion": [],
                                                             "rewards": defaultdict(list), "advantages": [],
                                                             "extra": defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False, num_iterations=1,
    )
    return _standin(cls, **{**plain, **attrs})


def _our_advantages(cfg_cls, rewards, **kw):
    """rlhfkit's advantages (B,) of these rewards: trainers/grpo.py compute_advantages on a rollout whose
    scores are `rewards` (its advantage on the completion's tokens)."""
    from rlhfkit.core.config import build_config
    from rlhfkit.rollout import Rollout
    from rlhfkit.trainers.grpo import compute_advantages

    n = len(rewards)
    cfg = build_config(cfg_cls, {"model": "unused", "prompts": "p.jsonl", "rollout_batch_size": n,
                                 "group_size": G, "mini_batch_size": n, "micro_batch_size": 2, "max_new_tokens": 3,
                                 **kw})
    ro = Rollout(query_ids=torch.ones(n, 2, dtype=torch.long), query_mask=torch.ones(n, 2, dtype=torch.long),
                 response_ids=torch.ones(n, 3, dtype=torch.long), response_mask=torch.ones(n, 3),
                 stopped=torch.ones(n, dtype=torch.bool), scores=rewards.clone())
    out, _ = compute_advantages(ro, cfg)
    return out.advantages[:, 0]


def _trl_grpo_advantages(rewards, scale_rewards):
    from trl import GRPOTrainer

    me = _generation_standin(
        GRPOTrainer, rewards, environment_factories=None, environments=None, tools=None, _is_vlm=False, use_vllm=False,
        num_generations=G, scale_rewards=scale_rewards, multi_objective_aggregation="sum_then_normalize",
        processing_class=None, chat_template_kwargs={}, eos_token_ids=[2])
    n = len(rewards)  # GRPO's _generate also returns tool masks, sampler log-probs, extra fields and images
    me._generate = lambda prompts: ([[5, 6]] * n, [[7, 8, 9]] * n, None, ["c"] * n, None, {}, None, None)
    me.args = SimpleNamespace(per_device_train_batch_size=n, gradient_checkpointing_kwargs=None,
                              steps_per_generation=1, gradient_accumulation_steps=1)
    return me._generate_and_score_completions([{"prompt": "p"}] * len(rewards))["advantages"]


def _trl_rloo_advantages(rewards, normalize=False):
    from trl import RLOOTrainer

    me = _generation_standin(RLOOTrainer, rewards, num_generations=G, normalize_advantages=normalize)
    return me._generate_and_score_completions([{"prompt": "p"}] * len(rewards))["advantages"]


def test_rloo_advantages_match_trl():
    """TRL's leave-one-out baseline (beta 0: no KL in the reward) is rlhfkit's advantage=rloo."""
    from rlhfkit.trainers.grpo_config import RLOOConfig

    torch.testing.assert_close(_our_advantages(RLOOConfig, REWARDS), _trl_rloo_advantages(REWARDS),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scale", ["none", "group", "batch"])
def test_grpo_advantages_match_trl_up_to_the_std_epsilon(scale):
    """TRL: (r - group mean) / (std + 1e-4), std unbiased, of the group (group) or the whole batch (batch);
    rlhfkit the same with 1e-6: equal to (1e-4 - 1e-6) / std relative, under 4e-4 with these rewards (the
    smallest std is 0.35: 2.8e-4), exactly with scale_rewards=none."""
    from rlhfkit.trainers.grpo_config import GRPOConfig

    ours = _our_advantages(GRPOConfig, REWARDS, scale_rewards=scale)
    theirs = _trl_grpo_advantages(REWARDS, scale)
    tol = 1e-6 if scale == "none" else 4e-4
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=1e-7)


def test_known_difference_std_epsilon():
    """The std epsilon: TRL divides by std + 1e-4, rlhfkit by std + 1e-6. With a group whose rewards differ
    by 2e-4 (std 1.41e-4) TRL's advantages are +-0.41, rlhfkit's +-0.70 (both: +-(1e-4) / (std + eps))."""
    from rlhfkit.trainers.grpo_config import GRPOConfig

    rewards = torch.tensor([1.0, 1.0002, 0.0, 1.0])
    ours = _our_advantages(GRPOConfig, rewards, scale_rewards="group")[:2]
    theirs = _trl_grpo_advantages(rewards, "group")[:2]
    half, std = 1e-4, 2e-4 / 2**0.5  # each reward's distance to the mean; unbiased std of two values
    torch.testing.assert_close(theirs, torch.tensor([-half, half]) / (std + 1e-4), rtol=1e-3, atol=0)
    torch.testing.assert_close(ours, torch.tensor([-half, half]) / (std + 1e-6), rtol=1e-3, atol=0)
    assert abs(ours[1].item() - theirs[1].item()) > 0.2


# ----------------------------------------------------------------------------- RLOO's loss


def _trl_rloo_loss(data):
    from trl import RLOOTrainer

    logps, old, _, mask, adv = data
    me = _standin(
        RLOOTrainer, model=SimpleNamespace(training=True), accelerator=_accelerator(), _metrics=_metrics(),
        _get_per_token_logps_and_entropies=lambda model, ids, attn, keep, **kw: (
            logps[ids[:, 0]], torch.zeros(len(ids), T, dtype=logps.dtype), None),
        epsilon_low=0.2, epsilon_high=0.2, aux_loss_enabled=False)
    prompt_ids = torch.zeros(B, P, dtype=torch.long)
    prompt_ids[:, 0] = torch.arange(B)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(B, P, dtype=torch.long),
              "completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": mask,
              "old_logps": (old * mask).sum(1), "advantages": adv}
    return RLOOTrainer._compute_loss(me, None, inputs)


def _rloo_cfg(**kw):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.grpo_config import RLOOConfig

    return build_config(RLOOConfig, {"model": "unused", "prompts": "p.jsonl", "rollout_batch_size": B,
                                     "group_size": G, "max_new_tokens": T, "dtype": "fp32", "micro_batch_size": B,
                                     **kw})


def test_rloo_gradient_matches_trl_with_a_per_sequence_normaliser(monkeypatch):
    """`rlhfkit rloo` is on-policy (update_epochs 1: rho = 1). TRL's loss is the mean over completions of
    -A_i x (its sequence ratio); rlhfkit's with loss_agg=constant and loss_agg_constant = B has the same
    gradient, -(1/B) sum_i A_i sum_t grad log pi(y_it). The values differ by design: TRL's is -mean_i A_i,
    rlhfkit's -(1/B) sum_i A_i |y_i| (a sum over tokens)."""
    data = _rollout(5, on_policy=True)
    adv, mask = data[4], data[3]
    theirs = _trl_rloo_loss(data)
    ours = _our_grpo(monkeypatch, _rloo_cfg(loss_agg="constant", loss_agg_constant=float(B)), torch.arange(B), data)
    (g_t,) = torch.autograd.grad(theirs, data[0], retain_graph=True)
    (g_o,) = torch.autograd.grad(ours, data[0], retain_graph=True)
    torch.testing.assert_close(g_o, g_t, rtol=1e-6, atol=1e-6 * g_t.abs().max().item())
    assert theirs.item() == pytest.approx(-adv.mean().item(), rel=1e-6)
    assert ours.item() == pytest.approx(-(adv * mask.sum(1)).sum().item() / B, rel=1e-6)


def test_known_difference_rloo_token_mean_normaliser(monkeypatch):
    """rlhfkit rloo's default loss_agg=token-mean divides the summed loss by the batch's N tokens, TRL by the
    B completions: the same direction, the gradient scaled by B / N (4 / 14 here)."""
    data = _rollout(5, on_policy=True)
    theirs = _trl_rloo_loss(data)
    ours = _our_grpo(monkeypatch, _rloo_cfg(), torch.arange(B), data)
    (g_t,) = torch.autograd.grad(theirs, data[0])
    (g_o,) = torch.autograd.grad(ours, data[0])
    n = float(sum(LENGTHS))
    torch.testing.assert_close(g_o, g_t * B / n, rtol=1e-5, atol=1e-7)
