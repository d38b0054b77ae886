"""The learning path's entries 27-29 (DPO's derivation, LoRA's start, the per-token KL), each checked
against arithmetic written here. Entries 24-26 (GRPO, RLOO, Bradley-Terry) are pinned by the golden
tests of rlhfkit.algos they name."""

from __future__ import annotations

import itertools
import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit.algos import dpo_loss, kl_k1, shape_rewards
from rlhfkit.models.lora import add_lora


def test_the_optimal_policys_implicit_reward_is_the_reward_up_to_beta_log_z():
    """pi* = pi_ref exp(r / beta) / Z: beta log(pi* / pi_ref) = r - beta log Z for every answer, so DPO's loss
    at pi* on any pair is -log sigmoid(r_w - r_l), the Bradley-Terry loss of the true rewards (Z cancels)."""
    beta = 0.5
    ref = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    r = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    z = float((ref * torch.exp(r / beta)).sum())  # 0.5 e^2 + 0.3 + 0.2 e^4 = 14.915...
    assert z == math.fsum([0.5 * math.exp(2), 0.3, 0.2 * math.exp(4)])
    opt = ref * torch.exp(r / beta) / z
    implicit = beta * torch.log(opt / ref)
    torch.testing.assert_close(implicit, r - beta * math.log(z), rtol=0, atol=1e-12)
    for won, lost in itertools.permutations(range(3), 2):
        w, lo = slice(won, won + 1), slice(lost, lost + 1)
        loss, m = dpo_loss(opt.log()[w], opt.log()[lo], ref.log()[w], ref.log()[lo], beta=beta)
        margin = (r[won] - r[lost]).item()
        by_hand = math.log1p(math.exp(-margin))  # -log sigmoid(r_w - r_l)
        assert abs(loss.item() - by_hand) <= 1e-12 * max(1.0, by_hand)
        assert abs(m["rewards/margin"] - margin) <= 1e-12


def test_a_new_lora_adapter_is_the_base_model_and_its_first_gradient_reaches_b_only():
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1))
    ids = torch.tensor([[1, 5, 9, 3]])
    before = lm(ids).logits.detach()
    model = add_lora(lm, r=4, alpha=8, dropout=0.0, targets=["q_proj", "v_proj"])
    layers = [model.base_model.model.model.layers[0].self_attn.q_proj, model.base_model.model.model.layers[0].self_attn.v_proj]
    assert torch.equal(model(ids).logits, before)  # B A = 0: exactly the base model
    model(ids).logits.logsumexp(-1).sum().backward()
    for layer in layers:
        A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        assert A.shape[0] == 4 and B.shape[1] == 4 and layer.scaling["default"] == 8 / 4
        assert A.abs().sum() > 0 and B.abs().sum() == 0  # A random, B zero
        assert A.grad.abs().sum() == 0 and B.grad.abs().sum() > 0  # dL/dA = (alpha/r) B^T (...) = 0 while B = 0
    # r (in + out) per matrix: q 16 -> 16 and v 16 -> 8 (one key/value head of 8)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 4 * (16 + 16) + 4 * (16 + 8)


def test_per_token_kls_add_up_to_the_sequence_kl():
    """Chain rule of the KL on 2 tokens over {0, 1}: the KL between sequence distributions (4 sequences
    enumerated) equals E[sum_t KL_t]; and shape_rewards charges a sampled sequence its summed k1, which is
    log pi(y) - log pi_ref(y) of the whole sequence."""
    pi_first, ref_first = [0.7, 0.3], [0.5, 0.5]
    pi_next, ref_next = {0: [0.9, 0.1], 1: [0.4, 0.6]}, {0: [0.6, 0.4], 1: [0.5, 0.5]}

    def kl(p, q):
        return sum(a * math.log(a / b) for a, b in zip(p, q))

    seq = math.fsum(pi_first[a] * pi_next[a][b] * math.log(pi_first[a] * pi_next[a][b] / (ref_first[a] * ref_next[a][b]))
                    for a, b in itertools.product((0, 1), repeat=2))
    tok = kl(pi_first, ref_first) + sum(pi_first[a] * kl(pi_next[a], ref_next[a]) for a in (0, 1))
    assert abs(seq - tok) <= 1e-12 * seq and seq > 0.2
    # the sampled sequence (0, 1): per-token log-probs of policy and reference
    logp = torch.tensor([[math.log(0.7), math.log(0.1)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.5), math.log(0.4)]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    rewards, m = shape_rewards(torch.tensor([0.0], dtype=torch.float64), logp, ref, mask, kl_coef=1.0)
    whole = math.log(0.7 * 0.1) - math.log(0.5 * 0.4)
    assert abs(kl_k1(logp, ref).sum().item() - whole) <= 1e-12 and abs(rewards.sum().item() + whole) <= 1e-12
    assert abs(m["kl"] - whole) <= 1e-12


def test_the_value_loss_reaches_the_policy_only_through_a_shared_trunk():
    """Entry 31: shared trunk, zero head -> no gradient below the head; a non-zero head -> the policy's
    weights get one; separate critic -> the policy's never do, the critic's do."""
    from rlhfkit.models.policy import ActorCritic, ValueHead

    def tiny(seed):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1))

    def grad_norm(model):
        return sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)

    ids, R = torch.tensor([[1, 5, 9, 3, 7, 2]]), 3
    for separate in (False, True):
        for zero_head in (True, False):
            policy, head, critic = tiny(0), ValueHead(16), tiny(1) if separate else None
            assert head.summary.weight.abs().sum() == 0 and head.summary.bias.abs().sum() == 0
            if not zero_head:
                torch.nn.init.normal_(head.summary.weight, std=0.5)
            _, values, _ = ActorCritic(policy, head, critic)(ids, torch.ones_like(ids), R, True, response_ids=ids[:, -R:])
            (0.5 * (values - 1.0) ** 2).mean().backward()
            assert grad_norm(head) > 0
            reaches_policy = not separate and not zero_head
            assert (grad_norm(policy) > 0) == reaches_policy, (separate, zero_head)
            if separate:
                assert (grad_norm(critic) > 0) == (not zero_head)


def test_greedy_rollouts_give_no_gradient_and_truncation_is_warned():
    """Entry 32: a batch of one repeated action has advantages r - mean(r) summing to 0, so the REINFORCE
    step is exactly 0; and SamplingParams warns when top_k or top_p truncate the distribution."""
    import pytest

    from rlhfkit.learn import bandit
    from rlhfkit.rollout import SamplingParams

    theta = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    actions = theta.argmax().repeat(32)
    rewards = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert bandit.reinforce_gradient(theta, actions, rewards).abs().max() <= 1e-15
    with pytest.warns(UserWarning, match="truncate the sampling distribution"):
        SamplingParams(top_k=2)
    with pytest.warns(UserWarning, match="truncate the sampling distribution"):
        SamplingParams(top_p=0.9)


def test_an_action_never_sampled_gets_no_gradient_on_its_logit():
    """Entry 33: with the batch-mean baseline, d/d theta_k of the REINFORCE estimate for an arm k absent
    from the batch is -pi_k * mean(r - mean(r)) = 0 exactly."""
    from rlhfkit.learn import bandit

    theta = torch.tensor([0.0, 0.0, -9.2, 0.0, 0.0], dtype=torch.float64)
    actions = torch.tensor([0, 1, 1, 3, 4, 0, 3, 1])
    rewards = torch.randn(8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grad = bandit.reinforce_gradient(theta, actions, rewards)
    assert abs(float(grad[2])) <= 1e-17 and float(grad.abs().max()) > 1e-2
    no_baseline = bandit.reinforce_gradient(theta, actions, rewards, baseline=False)
    assert float(no_baseline[2]) != 0.0  # without the baseline only the normalisation term moves it
