"""The frozen trunk (models/trunk.py): with LoRA on the top layers only, the layers below run once
for the policy and the reference and once per rollout for the update; every result equals the
plain forward's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.models.lora import add_lora
from rlhfkit.models.policy import ActorCritic, Reference, ValueHead, response_hidden_states
from rlhfkit.models.trunk import frozen_depth
from rlhfkit.rollout import Rollout, forward_logprobs, logprob_pass
from rlhfkit.rollout.core import trim_rows

from tiny_lm import build_tiny_model, build_tokenizer

PAD = 2
LAYERS = 4


def _lora_actor(top: int | None = 2, seed: int = 0) -> ActorCritic:
    """A 4-layer tiny Llama, LoRA on the top `top` layers with a non-zero B (so the adapter matters)."""
    tok = build_tokenizer()
    policy = add_lora(build_tiny_model(len(tok), seed=seed, layers=LAYERS), r=4, alpha=8, dropout=0.0, targets=None,
                      top_layers=top)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    head = ValueHead(policy.config.hidden_size)
    torch.nn.init.normal_(head.summary.weight, 0, 0.3)
    return ActorCritic(policy.eval(), head)


def _rollout(B: int, P: int, R: int, vocab: int, seed: int) -> Rollout:
    """Left-padded prompts and right-padded responses of varying lengths (pad == eos)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(3, vocab, (B, P), generator=g)
    r = torch.randint(3, vocab, (B, R), generator=g)
    qm, rm = torch.ones(B, P, dtype=torch.long), torch.zeros(B, R)
    for i in range(B):
        pad = int(torch.randint(0, P - 1, (1,), generator=g))
        q[i, :pad], qm[i, :pad] = PAD, 0
        n = int(torch.randint(1, R + 1, (1,), generator=g))
        rm[i, :n] = 1
        r[i, n:] = PAD
    return Rollout(query_ids=q, query_mask=qm, response_ids=r, response_mask=rm, stopped=torch.ones(B, dtype=torch.bool))


def test_frozen_depth_counts_the_layers_below_the_adapters():
    assert _lora_actor(top=2).trunk_depth == 2
    assert _lora_actor(top=1).trunk_depth == 3
    assert _lora_actor(top=None).trunk_depth == 0  # LoRA on every layer: nothing is frozen
    full = build_tiny_model(len(build_tokenizer()), layers=LAYERS)
    assert frozen_depth(full.get_decoder()) == 0  # full fine-tuning: the embedding trains
    full.requires_grad_(False)
    assert frozen_depth(full.get_decoder()) == LAYERS - 1  # all frozen: one layer still runs on top
    full.model.layers[1].mlp.up_proj.weight.requires_grad_(True)
    assert frozen_depth(full.get_decoder()) == 1  # stops at the first layer with a trainable weight
    shared = ActorCritic(_lora_actor(top=2).policy, None, share_prompts=True)
    assert shared.trunk_depth == 0  # prompt sharing takes precedence


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), top=st.sampled_from([1, 2, 3]))
def test_hidden_states_and_lora_gradients_equal_the_plain_forward(seed, top):
    actor = _lora_actor(top=top, seed=seed % 3)
    ro = _rollout(B=5, P=6, R=5, vocab=actor.config.vocab_size, seed=seed)
    decoder = actor.policy.get_base_model().get_decoder()
    ids, mask, R = ro.input_ids, ro.attention_mask, ro.response_ids.shape[1]
    lora = [p for n, p in actor.named_parameters() if "lora_" in n]

    def hidden_and_grads(trunk):
        actor.zero_grad()
        h = response_hidden_states(decoder, ids, mask, R, trunk=trunk)
        (h * ro.response_mask[..., None]).pow(2).sum().backward()
        return h.detach(), [p.grad.clone() for p in lora]

    plain, g_plain = hidden_and_grads(None)
    split, g_split = hidden_and_grads((actor.trunk_depth, actor.trunk(ids, mask)))
    valid = ro.response_mask.bool()
    torch.testing.assert_close(split[valid], plain[valid], atol=1e-5, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in g_plain)  # the adapters do get gradients, so the check bites
    # atol from the gradients' own scale: a fixed 1e-5 exceeded every entry of the smaller tensors (3e-6)
    scale = max(float(g.abs().max()) for g in g_plain)
    for a, b in zip(g_split, g_plain):
        torch.testing.assert_close(a, b, atol=1e-5 * max(float(b.abs().max()), 1e-3 * scale), rtol=1e-4)


def test_the_adapter_disabled_reference_shares_the_trunk():
    actor = _lora_actor(top=2)
    ro = _rollout(B=4, P=5, R=6, vocab=actor.config.vocab_size, seed=1)
    ref = Reference(actor, use_adapter_off=True)
    ids, mask = ro.input_ids, ro.attention_mask
    plain = ref.logprobs(ids, mask, ro.response_ids, ro.response_mask)
    shared = ref.logprobs(ids, mask, ro.response_ids, ro.response_mask, trunk=actor.trunk(ids, mask))
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        policy_lp, _, _ = forward_logprobs(actor, ro, 1.0)
    assert (policy_lp - plain).abs().max() > 1e-2  # the adapters change the log-probs: the reference is not the policy


def test_logprob_pass_keeps_the_trunk_and_the_update_reuses_it():
    actor = _lora_actor(top=2)
    ref = Reference(actor, use_adapter_off=True)
    B, P, R = 8, 6, 5
    ro = _rollout(B, P, R, actor.config.vocab_size, seed=2)
    order = torch.randperm(B, generator=torch.Generator().manual_seed(0))
    kept = logprob_pass(actor, ref, _rollout(B, P, R, actor.config.vocab_size, seed=2), 0.7, 3, order,
                         keep_trunk_mb=1.0)
    assert kept.trunk is not None and kept.trunk.shape == (B, P + R, actor.config.hidden_size)
    depth, actor.trunk_depth = actor.trunk_depth, 0  # the plain forward, for comparison
    plain = logprob_pass(actor, ref, ro, 0.7, 3, order)
    actor.trunk_depth = depth
    assert plain.trunk is None
    for name in ("logprobs", "values", "entropy", "ref_logprobs"):
        torch.testing.assert_close(getattr(kept, name), getattr(plain, name), atol=1e-5, rtol=1e-5)
    # The first update micro-batch (same rows as scoring's first) repeats scoring bit for bit: ratio == 1.
    first = trim_rows(kept, order[:3])
    with torch.no_grad():
        lp, v, _ = forward_logprobs(actor, first, 0.7)
    assert torch.equal(lp, first.logprobs[:, : lp.shape[1]])
    # Another grouping (another epoch's shuffle, other padding widths) from the kept trunk: the plain values.
    other = trim_rows(kept, torch.tensor([5, 0, 6, 2]))
    assert other.trunk.shape[1] == other.query_ids.shape[1] + other.response_ids.shape[1]
    with torch.no_grad():
        lp, v, _ = forward_logprobs(actor, other, 0.7)
        depth, actor.trunk_depth = actor.trunk_depth, 0
        other = dataclasses.replace(other, trunk=None)
        lp_plain, v_plain, _ = forward_logprobs(actor, other, 0.7)
        actor.trunk_depth = depth
    torch.testing.assert_close(lp, lp_plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, v_plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("limit_mb", [0.0, 1e-3])
def test_a_trunk_over_the_memory_limit_is_not_kept(limit_mb):
    actor = _lora_actor(top=2)
    ro = logprob_pass(actor, Reference(actor, use_adapter_off=True), _rollout(8, 6, 5, actor.config.vocab_size, 3),
                       1.0, 4, keep_trunk_mb=limit_mb)  # 8 x 11 x 32 x 4 bytes = 11 KB > 1 KB
    assert ro.trunk is None and ro.ref_logprobs is not None


def test_a_ppo_run_computes_the_trunk_once_per_scoring_micro_batch(tmp_path, monkeypatch):
    """End to end: the ratio check passes (the update's first micro-batch repeats scoring bit for
    bit from the kept trunk) and the frozen layers run in scoring only, never in the update."""
    import rlhfkit.models.policy as policy_mod
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    tok = build_tokenizer()
    build_tiny_model(len(tok), layers=LAYERS).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "p.txt").write_text("\n".join(f"Write a review of thing number {i}." for i in range(16)))
    calls = []
    real = policy_mod.trunk_states
    monkeypatch.setattr(policy_mod, "trunk_states", lambda *a, **k: calls.append(a[2].shape[0]) or real(*a, **k))
    cfg = build_config(PPOConfig, dict(
        model=str(tmp_path / "m"), prompts=str(tmp_path / "p.txt"), reward="length:3", iterations=2,
        rollout_batch_size=8, mini_batch_size=4, micro_batch_size=2, ppo_epochs=2, max_new_tokens=6, lora_layers=2,
        num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
        tensorboard=False, lr=1e-2))
    train(cfg)
    assert calls == [2] * 8  # 2 iterations x 4 scoring micro-batches; the 2 x 2 x 2 update micro-batches reuse them
    lines = (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
