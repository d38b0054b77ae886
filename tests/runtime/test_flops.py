"""Model FLOP counts (rlhfkit.estimate.flops): a 1-layer config counted by hand, and the counts of a
tiny Llama against torch's FlopCounterMode (forward and backward, LoRA and full fine-tuning)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rlhfkit.estimate.flops import (
    attention_pairs,
    backward_flops,
    decode_step_bytes,
    forward_flops,
    sampling_flops,
    shape_of,
    train_flops,
)
from rlhfkit.estimate.shape import ModelShape

# H 4, intermediate 8, 2 heads of d 2, 1 kv head, V 10, tied. One layer's projections (in x out):
# q 4x4=16, k 4x2=8, v 4x2=8, o 4x4=16, gate 4x8=32, up 4x8=32, down 8x4=32: 144 weights.
ONE = ModelShape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, vocab=10, tied=True)


def test_attention_pairs_by_hand():
    assert attention_pairs([3, 1]) == 6 + 1  # causal: 1+2+3, and 1
    assert attention_pairs([3, 1], causal=False) == 9 + 1


def test_one_layer_forward_by_hand():
    # 3 tokens, logits at 2 positions: projections 2*3*144 = 864; attention 6 causal pairs x
    # 4 heads d (= 4*2*2 = 16) = 96; head 2*2*4*10 = 160.
    assert forward_flops(ONE, [3], 2) == 864 + 96 + 160
    assert forward_flops(ONE, [3], 2, causal=False) == 864 + 9 * 16 + 160
    # LoRA r=1 on all seven: 2*3*1*(in+out) summed = 6 * (8+6+6+8+12+12+12) = 384
    assert forward_flops(ONE, [3], 2, lora_r=1) == 864 + 96 + 160 + 384


def test_one_layer_backward_by_hand():
    # Full fine-tuning: input + weight gradient of every projection and of the head, attention 2x.
    assert backward_flops(ONE, [3], 2) == 4 * 3 * 144 + 2 * 96 + 4 * 2 * 4 * 10
    # LoRA r=1, the only layer is the lowest adapted one: its input carries no gradient.
    head = 2 * 2 * 4 * 10  # frozen head: input gradient only
    # q, k, v read the layer input: no base backward; LoRA dB (2 n r out), d(Ax) (2 n r out), dA (2 n r in)
    q = 2 * 3 * (2 * 4 + 4)
    k = v = 2 * 3 * (2 * 2 + 4)
    # o, gate, up, down: trainable weights upstream, so base input gradient + LoRA with dx (2 n r in) too
    o = 2 * 3 * 16 + 2 * 3 * (2 * 4 + 4) + 2 * 3 * 4
    gate = up = 2 * 3 * 32 + 2 * 3 * (2 * 8 + 4) + 2 * 3 * 4
    down = 2 * 3 * 32 + 2 * 3 * (2 * 4 + 8) + 2 * 3 * 8
    attn = 2 * 96
    assert backward_flops(ONE, [3], 2, lora_r=1) == head + q + k + v + o + gate + up + down + attn
    t = train_flops(ONE, [3], 2, lora_r=1)
    assert t["total"] == t["forward"] + t["backward"] == 864 + 96 + 160 + 384 + 1720


def test_sampling_by_hand():
    # Prompt of 3, 3 new tokens: prefill = forward over 3 tokens with logits at 1 position:
    # 864 + 96 + 2*4*10 = 1040. Then 2 decode steps of 1 token: projections 2*144 = 288, head 80,
    # attention to 4 then 5 cached keys: 16 * (4 + 5) = 144.
    f = sampling_flops(ONE, [3], 3)
    assert f["prefill"] == 864 + 96 + 80
    assert f["decode"] == 2 * (288 + 80) + 16 * (4 + 5)
    assert f["total"] == f["prefill"] + f["decode"]


def test_decode_bytes_by_hand():
    # Parameters: embedding 10*4 (tied) + 144 + 2 norms of 4 + final norm 4 = 196. KV: 2 (K and V)
    # x 1 layer x 1 kv head x d 2 x 3 rows x 5 tokens = 60 values.
    assert decode_step_bytes(ONE, rows=3, context=5, weight_bytes=2, kv_bytes=4) == 196 * 2 + 60 * 4


def _tiny(layers: int = 3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, attn_implementation="eager")
    return LlamaForCausalLM(cfg)


def _counted(model, ids: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) FLOPs torch counts for a log-prob loss on every position."""
    with FlopCounterMode(display=False) as fc:
        logits = model(input_ids=ids).logits
    fwd = fc.get_total_flops()
    loss = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).sum()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    return fwd, fc.get_total_flops()


# Both sides count the same matmuls in integers (FlopCounterMode counts matmuls only, so the
# element-wise work the model count leaves out is absent there too): they must agree exactly; the
# 1e-9 relative tolerance only guards the comparison of large integers.
RTOL = 1e-9


@pytest.mark.parametrize("lora_layers", [None, 2])
def test_lora_counts_match_flop_counter(lora_layers):
    from peft import LoraConfig, get_peft_model

    model = _tiny()
    layers = None if lora_layers is None else list(range(3 - lora_layers, 3))
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                               "gate_proj", "up_proj", "down_proj"],
                                             layers_to_transform=layers, lora_dropout=0.0))
    B, S = 2, 7
    ids = torch.randint(0, 96, (B, S))
    fwd, bwd = _counted(model, ids)
    shape = shape_of(model.config)
    want_f = forward_flops(shape, [S] * B, B * S, lora_r=4, lora_layers=lora_layers, causal=False)
    want_b = backward_flops(shape, [S] * B, B * S, lora_r=4, lora_layers=lora_layers, causal=False)
    assert fwd == pytest.approx(want_f, rel=RTOL)
    assert bwd == pytest.approx(want_b, rel=RTOL)
    assert want_b < 2 * want_f  # frozen base weights: backward well under twice the forward


def test_full_finetuning_counts_match_flop_counter():
    model = _tiny()
    B, S = 3, 5
    ids = torch.randint(0, 96, (B, S))
    fwd, bwd = _counted(model, ids)
    shape = shape_of(model.config)
    want_f = forward_flops(shape, [S] * B, B * S, causal=False)
    assert fwd == pytest.approx(want_f, rel=RTOL)
    assert bwd == pytest.approx(backward_flops(shape, [S] * B, B * S, causal=False), rel=RTOL)
    assert backward_flops(shape, [S] * B, B * S) == 2 * forward_flops(shape, [S] * B, B * S)


def test_sampling_counts_match_flop_counter_with_a_kv_cache():
    model = _tiny(layers=2).eval()
    B, P, new = 2, 4, 3
    ids = torch.randint(0, 96, (B, P))
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new - 1):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    # eager attention over a cache multiplies by every cached key: exactly the p + t keys counted
    want = sampling_flops(shape_of(model.config), [P] * B, new)["total"]
    prefill_square = 4 * 4 * 8 * 2 * B * (P * P - P * (P + 1) // 2)  # the prefill's masked upper triangle
    assert fc.get_total_flops() == pytest.approx(want + prefill_square, rel=RTOL)
