"""Run a decoder's frozen bottom layers once and reuse their output ("the trunk").

With LoRA on the top N layers only (`lora_layers`, the PPO demo's default: 12 of 30), the layers
below hold no adapter and no trainable weight. Their output depends on the tokens alone: it is the
same for the policy and for the adapter-disabled reference, and the same in every update epoch. So
the scoring pass runs them once per micro-batch for both, and the rollout keeps their output for the
update, which then runs only the adapted layers (its backward stopped there already).

The split reuses the model's own forward: the decoder runs with its layer list cut to the bottom
part (and no final norm), then again from `inputs_embeds` = the trunk states with the top part.
Masks and rotary positions are rebuilt from the same attention mask and position ids, so the result
equals the plain forward up to float rounding. Only for decoders whose forward is known to treat
`inputs_embeds` as the first layer's input (no scaling), in single-process runs.

Notation: B rows, L = P + R columns, H hidden size, D the frozen depth.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

# Decoders whose forward feeds `inputs_embeds` unchanged to the first layer and loops over
# `self.layers` (Gemma, for one, rescales inputs_embeds and is left out).
SPLITTABLE = ("llama", "mistral", "qwen2", "qwen3")


def frozen_depth(decoder: nn.Module) -> int:
    """D: how many bottom layers (with the token embedding) hold no trainable weight and no LoRA
    layer, so that their output is fixed during training. 0 when the split is not supported."""
    from peft.tuners.lora import LoraLayer

    layers = getattr(decoder, "layers", None)
    embed = getattr(decoder, "embed_tokens", None)
    model_type = getattr(getattr(decoder, "config", None), "model_type", None)
    if model_type not in SPLITTABLE or not isinstance(layers, nn.ModuleList) or embed is None:
        return 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return 0  # sharding engines (FSDP, ZeRO-3) wrap layers; they keep the plain forward

    def frozen(module: nn.Module) -> bool:
        return not any(p.requires_grad for p in module.parameters()) and not any(
            isinstance(m, LoraLayer) for m in module.modules())

    if not frozen(embed):
        return 0
    depth = 0
    while depth < len(layers) - 1 and frozen(layers[depth]):  # at least one layer stays on top
        depth += 1
    return depth


@contextlib.contextmanager
def _only(decoder: nn.Module, part: slice, norm: bool):
    """The decoder with its layer list cut to `layers[part]` (and its final norm off unless `norm`).
    `config.layer_types` is cut alike: the forward picks layer i's mask (full or sliding window)
    by its index in the list, so a Qwen2 with sliding-window top layers would otherwise give them
    the bottom layers' mask."""
    full, final = decoder.layers, decoder.norm
    config = decoder.config
    types = getattr(config, "layer_types", None)
    decoder.layers = nn.ModuleList(list(full)[part])
    if types is not None:
        config.layer_types = list(types)[part]
    if not norm:
        decoder.norm = nn.Identity()
    try:
        yield decoder
    finally:
        decoder.layers, decoder.norm = full, final
        if types is not None:
            config.layer_types = types


@torch.no_grad()
def trunk_states(decoder: nn.Module, depth: int, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor) -> torch.Tensor:
    """Output of the embedding and the bottom `depth` layers, before any norm: (B, L, H)."""
    with _only(decoder, slice(None, depth), norm=False):
        return decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).last_hidden_state


def top_states(decoder: nn.Module, depth: int, trunk: torch.Tensor, attention_mask: torch.Tensor,
               position_ids: torch.Tensor) -> torch.Tensor:
    """The decoder's final hidden states (B, L, H) computed from the trunk: layers depth.. and the norm."""
    with _only(decoder, slice(depth, None), norm=True):
        return decoder(inputs_embeds=trunk, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).last_hidden_state


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding (docs/pitfalls.md#padding-and-positions): cumsum(mask) - 1,
    clamped at 0. (B, L)"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
