"""Memory knobs on a tiny Llama: gradient checkpointing (same gradients, layers recomputed), the
offloaded reference (moved once per scoring pass), micro-batched scoring (bounded rows per forward)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rlhfkit.models.loading import set_gradient_checkpointing
from rlhfkit.models.lora import add_lora
from rlhfkit.models.policy import ActorCritic, Reference, ValueHead
from rlhfkit.rollout import Rollout, logprob_pass

from tiny_lm import build_tiny_model, build_tokenizer


def tiny_rollout(vocab: int, rows: int = 6) -> Rollout:
    g = torch.Generator().manual_seed(1)
    r_mask = (torch.arange(7)[None] < torch.tensor([7, 3, 5, 1, 6, 2])[:rows, None]).float()
    return Rollout(query_ids=torch.randint(3, vocab, (rows, 5), generator=g), query_mask=torch.ones(rows, 5).long(),
                   response_ids=torch.randint(3, vocab, (rows, 7), generator=g), response_mask=r_mask,
                   stopped=torch.zeros(rows, dtype=torch.bool))


def grads_and_recomputes(actor: ActorCritic, layer) -> tuple[dict, int]:
    """Gradients of a fixed loss, and how often `layer`'s MLP ran (2 = recomputed in backward)."""
    calls = []
    handle = layer.mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    actor.train()
    actor.zero_grad(set_to_none=True)
    ids = torch.randint(3, 300, (3, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding in one row
    logits, values = actor.logits(ids, mask, 6, with_values=True)
    (logits.float().log_softmax(-1)[..., 5].sum() + values.sum()).backward()
    handle.remove()
    grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
    return grads, len(calls)


@pytest.mark.parametrize("lora", [True, False])
def test_gradient_checkpointing_gives_the_same_gradients(lora):
    tok = build_tokenizer()
    policy = build_tiny_model(len(tok))
    if lora:
        torch.manual_seed(0)
        policy = add_lora(policy, 4, 8, 0.0, None)
    actor = ActorCritic(policy, ValueHead(32))
    with torch.no_grad():
        actor.value_head.summary.weight.normal_()
    layer = (policy.get_base_model() if lora else policy).model.layers[0]
    plain, runs_plain = grads_and_recomputes(actor, layer)
    set_gradient_checkpointing(policy)
    ckpt, runs_ckpt = grads_and_recomputes(actor, layer)
    assert (runs_plain, runs_ckpt) == (1, 2)  # the layer really was recomputed in the backward pass
    assert plain.keys() == ckpt.keys() and (any("lora_B" in n for n in plain) or not lora)
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-6, atol=1e-8, msg=name)
    set_gradient_checkpointing(policy, False)
    assert grads_and_recomputes(actor, layer)[1] == 1


def test_gradient_checkpointing_option_trains_ppo(tmp_path, tiny_model_dir):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(8)))
    cfg = build_config(PPOConfig, dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length:3",
                                       iterations=1, rollout_batch_size=4, mini_batch_size=4, micro_batch_size=2,
                                       max_new_tokens=6, num_eval_prompts=0, dtype="fp32", quiet=True,
                                       tensorboard=False, output_dir=str(tmp_path / "runs"), run_name="t",
                                       gradient_checkpointing=True, lora=False, lr=1e-5))
    train(cfg)
    row = json.loads((tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["params/ratio_first_microbatch_maxdev"] == 0.0 and row["params/grad_norm"] > 0


def test_offloaded_reference_moves_once_per_scoring_pass_and_gives_the_same_log_probs(monkeypatch):
    tok = build_tokenizer()
    actor = ActorCritic(build_tiny_model(len(tok)), ValueHead(32))
    rollout = tiny_rollout(len(tok))
    plain = logprob_pass(actor, Reference(actor, use_adapter_off=False), rollout, 1.0, 2).ref_logprobs.clone()
    reference = Reference(actor, use_adapter_off=False, offload=True)
    moves = []
    real_to = reference.frozen.to
    monkeypatch.setattr(reference.frozen, "to", lambda device: (moves.append(str(device)), real_to(device))[1])
    reference.to("cpu")  # what the trainer does after `prepare`: an offloaded copy stays in CPU memory
    assert moves == ["cpu"]
    moves.clear()
    rollout = dataclasses.replace(rollout, ref_logprobs=None)
    offloaded = logprob_pass(actor, reference, rollout, 1.0, 2).ref_logprobs
    assert moves == ["cpu", "cpu"]  # in to the actor's device (cpu here), then back: once for 3 micro-batches
    torch.testing.assert_close(offloaded, plain)
    # With LoRA the reference is the adapter-disabled policy: nothing to offload.
    lora_actor = ActorCritic(add_lora(build_tiny_model(len(tok)), 4, 8, 0.0, None), ValueHead(32))
    assert Reference(lora_actor, use_adapter_off=True, offload=True).offload is False


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_scoring_forwards_at_most_micro_batch_size_rows(micro):
    tok = build_tokenizer()
    actor = ActorCritic(build_tiny_model(len(tok)), ValueHead(32))
    rows_seen = []
    actor.register_forward_pre_hook(lambda mod, args: rows_seen.append(args[0].shape[0]))
    rollout = tiny_rollout(len(tok))
    rollout = logprob_pass(actor, Reference(actor, use_adapter_off=False), rollout, 1.0, micro)
    assert max(rows_seen) == micro and sum(rows_seen) == 6  # peak activations do not grow with the rollout
