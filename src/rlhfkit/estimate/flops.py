"""Model FLOPs of a Llama-style decoder's forward, backward and decode steps, for utilisation figures
(bench/utilisation.py). Pure arithmetic on the config's sizes; nothing is run.

Counting rules (a multiply-add is 2 FLOPs; `n` tokens through a layer):
- projection (in, out): forward 2 n in out. Backward: the input gradient, 2 n in out, when something
  trainable lies below it in the graph; the weight gradient, 2 n in out, when the weight trains. So a
  trained projection's backward is 2x its forward, a frozen LoRA base weight's 1x, and a layer below
  every trainable weight (the frozen trunk of `lora_layers`) costs no backward at all.
- attention per layer: the scores Q K^T and the weighted sum P V, 2 x heads x d per (query, key) pair
  each, so 4 heads d per pair. A causal sequence of s tokens has s (s + 1) / 2 pairs (the keys each
  query may see: the model's work); `causal=False` counts s^2, what a kernel without causal skipping
  computes (and what torch's FlopCounterMode reports). Backward 2x (dQ, dK from the scores, dP, dV).
- LoRA rank r on (in, out): A (in -> r) then B (r -> out), forward 2 n r (in + out); backward: both
  weight gradients, the gradient into A's output, and A's input gradient when the input needs one.
- output layer: 2 H V per position whose logits are taken (rlhfkit's passes take them at response
  positions only); LoRA leaves it frozen (input gradient only), full fine-tuning trains it (tied or not).
- not counted: embeddings (a lookup), norms, activations, rotary, softmax: O(n H + n V) element-wise
  work, under 1% here. The entropy bonus's gradient through the head is not counted either.

Notation: H hidden, V vocabulary, L layers, r LoRA rank, S tokens of a sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlhfkit.estimate.shape import LORA_TARGETS, ModelShape

__all__ = ["shape_of", "attention_pairs", "forward_flops", "backward_flops", "train_flops", "sampling_flops",
           "decode_step_bytes"]


def shape_of(config) -> ModelShape:
    """The sizes of a transformers config (a PretrainedConfig or its dict), a ModelShape unchanged."""
    if isinstance(config, ModelShape):
        return config
    return ModelShape.from_config(config if isinstance(config, dict) else config.to_dict())


def attention_pairs(seq_lens: Iterable[int], causal: bool = True) -> int:
    """(query, key) pairs of full-sequence attention over sequences of these lengths."""
    return sum(s * (s + 1) // 2 if causal else s * s for s in seq_lens)


def _proj(shape: ModelShape, targets) -> list[tuple[str, int, int, bool]]:
    """(name, in, out, adapted) of one layer's projections."""
    return [(name, i, o, name in targets) for name, (i, o) in shape.linear_shapes().items()]


def _attn_per_pair(shape: ModelShape) -> int:
    return 4 * shape.heads * shape.d


def forward_flops(config, seq_lens: Sequence[int], head_positions: int, layers: int | None = None,
                  lora_r: int = 0, lora_layers: int | None = None, targets=LORA_TARGETS, causal: bool = True) -> int:
    """FLOPs of one forward over sequences of `seq_lens` tokens (padded widths as computed), through
    the top `layers` layers (None: all; fewer when the frozen trunk's output is reused), with the
    output layer at `head_positions` positions in all and LoRA rank `lora_r` on the top
    `lora_layers` layers (0: no adapters, or merged ones)."""
    s = shape_of(config)
    n, run = sum(seq_lens), s.layers if layers is None else layers
    adapted = 0 if not lora_r else min(run, s.layers if lora_layers is None else lora_layers)
    per_layer = sum(2 * n * i * o for _, i, o, _ in _proj(s, targets)) + _attn_per_pair(s) * attention_pairs(seq_lens, causal)
    lora = sum(2 * n * lora_r * (i + o) for _, i, o, a in _proj(s, targets) if a)
    return run * per_layer + adapted * lora + 2 * head_positions * s.hidden * s.vocab


def backward_flops(config, seq_lens: Sequence[int], head_positions: int, lora_r: int | None = None,
                   lora_layers: int | None = None, targets=LORA_TARGETS, causal: bool = True) -> int:
    """FLOPs of the backward of that forward for a loss on the `head_positions` log-probs.

    `lora_r=None`: full fine-tuning (every weight trains, the embeddings too, so every layer's input
    needs a gradient). Else LoRA of rank r on `targets` of the top `lora_layers` layers (None: all):
    the backward goes down to the lowest adapted layer only, and there a projection needs an input
    gradient only when an adapted projection of that layer lies upstream of it (`UPSTREAM`)."""
    s = shape_of(config)
    n, pairs = sum(seq_lens), attention_pairs(seq_lens, causal)
    H, V = s.hidden, s.vocab
    if lora_r is None:  # full: input and weight gradients everywhere, head included
        per_layer = sum(4 * n * i * o for _, i, o, _ in _proj(s, targets)) + 2 * _attn_per_pair(s) * pairs
        return s.layers * per_layer + 4 * head_positions * H * V
    k = s.layers if lora_layers is None else min(lora_layers, s.layers)
    total = 2 * head_positions * H * V  # frozen head: input gradient only
    for depth in range(k):  # depth 0 = the lowest adapted layer: its input carries no gradient
        lowest = depth == 0
        for name, i, o, adapted in _proj(s, targets):
            input_grad = not lowest or any(t in targets for t in UPSTREAM.get(name, ()))
            total += 2 * n * i * o * input_grad  # base weight: input gradient only
            if adapted:  # dB, d(Ax), dA, and dx through A when the input needs it
                total += 2 * n * lora_r * (2 * o + i) + 2 * n * lora_r * i * input_grad
        attn_grad = not lowest or any(t in targets for t in ("q_proj", "k_proj", "v_proj"))
        total += 2 * _attn_per_pair(s) * pairs * attn_grad
    return total


# Within one layer, the projections upstream of each projection's input (q, k, v read the layer input).
UPSTREAM = {"o_proj": ("q_proj", "k_proj", "v_proj"),
            "gate_proj": ("q_proj", "k_proj", "v_proj", "o_proj"),
            "up_proj": ("q_proj", "k_proj", "v_proj", "o_proj"),
            "down_proj": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")}


def train_flops(config, seq_lens: Sequence[int], head_positions: int, lora_r: int | None = None,
                lora_layers: int | None = None, forward_layers: int | None = None, targets=LORA_TARGETS,
                causal: bool = True) -> dict[str, int]:
    """{'forward', 'backward', 'total'} of one training forward + backward (see the two functions)."""
    fwd = forward_flops(config, seq_lens, head_positions, layers=forward_layers, lora_r=lora_r or 0,
                        lora_layers=lora_layers, targets=targets, causal=causal)
    bwd = backward_flops(config, seq_lens, head_positions, lora_r, lora_layers, targets, causal)
    return {"forward": fwd, "backward": bwd, "total": fwd + bwd}


def sampling_flops(config, prompt_lens: Sequence[int], new_tokens: int, lora_r: int = 0,
                   lora_layers: int | None = None, targets=LORA_TARGETS) -> dict[str, int]:
    """FLOPs of sampling `new_tokens` per prompt with a KV cache: {'prefill', 'decode', 'total'}.

    Prefill: a causal forward over each prompt, logits at its last position only (the first new
    token). Then new_tokens - 1 decode steps, one token per row each: the projections and the output
    layer for that token, and attention of its query to the p + t cached keys (its own included),
    4 heads d (p + t) per layer. Every row runs every step (a batch does not stop early)."""
    s = shape_of(config)
    prefill = forward_flops(s, prompt_lens, len(prompt_lens), lora_r=lora_r, lora_layers=lora_layers,
                            targets=targets)
    steps = max(new_tokens - 1, 0)
    per_token = forward_flops(s, [1], 1, lora_r=lora_r, lora_layers=lora_layers, targets=targets)
    per_token -= s.layers * _attn_per_pair(s) * 1  # the [1]-token forward counted its one pair; re-added below
    keys = sum(steps * p + steps * (steps + 1) // 2 for p in prompt_lens)  # sum over t = 1..steps of p + t
    decode = len(prompt_lens) * steps * per_token + s.layers * _attn_per_pair(s) * keys
    return {"prefill": prefill, "decode": decode, "total": prefill + decode}


def decode_step_bytes(config, rows: int, context: int, weight_bytes: int, kv_bytes: int) -> int:
    """Bytes one decode step must read at least: every weight once (embedding row reads aside, the
    tied head reads the whole matrix) and the K and V caches of `rows` rows of `context` tokens."""
    s = shape_of(config)
    kv = 2 * s.layers * s.kv_heads * s.d * rows * context * kv_bytes
    return s.param_count() * weight_bytes + kv
