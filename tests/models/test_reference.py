"""The frozen reference of full fine-tuning equals the starting policy bit for bit, in fp32 and in
bf16 (where the copy stores its linear weights in bf16 and runs under the same autocast as the
fp32 policy), with a tied or a separate output layer, with and without the shared prompt prefix."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models.policy import ActorCritic, Reference, ValueHead, store_linear_weights
from rlhfkit.rollout import SamplingParams, generate, logprob_pass

from tiny_lm import build_tokenizer

PROMPTS = ["<|im_start|>user\nWrite a review of the cafe.<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nContinue this story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"]


def tiny(tok, tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # norms off 1.0 so that a bf16 rounding of them would show
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def autocast(dtype: str):
    import contextlib

    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


@pytest.mark.parametrize("share_prefix", [True, False], ids=["shared-prefix", "plain"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_frozen_reference_equals_the_starting_policy(dtype, tied, share_prefix):
    tok = build_tokenizer()
    tok.padding_side = "left"
    actor = ActorCritic(tiny(tok, tied), ValueHead(32), share_prefix=share_prefix)
    ref = Reference(actor, use_adapter_off=False, dtype=torch.bfloat16 if dtype == "bf16" else None)
    torch.manual_seed(0)
    rollout = generate(actor.policy, tok, PROMPTS * 2, SamplingParams(max_new_tokens=8, stop_ids=(2,)))
    with autocast(dtype):
        rollout = logprob_pass(actor, ref, rollout, 0.7, micro_batch_size=4)
    assert rollout.response_mask.sum() > 8
    assert torch.equal(rollout.ref_logprobs, rollout.logprobs)


def test_store_linear_weights_keeps_embeddings_norms_and_the_output_layer():
    tok = build_tokenizer()
    model = store_linear_weights(tiny(tok, tied=False), torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
    assert dtypes["model.layers.1.mlp.down_proj.weight"] == torch.bfloat16
    assert dtypes["model.embed_tokens.weight"] == dtypes["lm_head.weight"] == torch.float32
    assert dtypes["model.norm.weight"] == dtypes["model.layers.0.input_layernorm.weight"] == torch.float32
    tied = store_linear_weights(tiny(tok, tied=True), torch.bfloat16)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and tied.lm_head.weight.dtype == torch.float32


def test_a_bf16_reference_runs_outside_the_trainers_autocast():
    """Its own forward enters autocast, so a caller without one still gets the same log-probs."""
    tok = build_tokenizer()
    tok.padding_side = "left"
    actor = ActorCritic(tiny(tok, True), None)
    ref = Reference(actor, use_adapter_off=False, dtype=torch.bfloat16)
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    response = ids[:, -3:]
    plain = ref.logprobs(ids, mask, response)
    with autocast("bf16"):
        assert torch.equal(ref.logprobs(ids, mask, response), plain)


def test_value_head_starts_at_zero_for_any_hidden_state():
    """A zero-initialised critic: V = 0 everywhere at the start (docs/pitfalls.md#value-head-init)."""
    from rlhfkit.models.policy import ValueHead

    head = ValueHead(8)
    hidden = torch.randn(3, 5, 8) * 100
    assert torch.equal(head(hidden), torch.zeros(3, 5))
    assert head(hidden).dtype == torch.float32
