"""Compute each distinct prompt once when several rows of a batch share it (GRPO/RLOO groups,
a DPO pair's chosen and rejected rows).

A causal decoder's states at the prompt positions depend only on the prompt, so G rows with the
same prompt can run the prompt through the model once and attend to one copy of its keys and
values, expanded to the G rows. The result equals the plain forward up to float rounding, and
gradients flow back through the shared keys and values into the prompt pass. With G = 8 and
prompts longer than the responses (the arithmetic demo: 62 prompt tokens, <= 16 response
tokens) this removes most of the work of sampling, scoring and the update.

Notation: B rows, U distinct prompts, P prompt width (left padded), R response width, H hidden.
"""

from __future__ import annotations

import torch
from torch import nn


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct prompt (U,), row -> its distinct prompt (B,)), or None when
    every row's prompt is different (nothing to share). Rows are equal when their left-padded
    tokens and masks are equal; distinct prompts keep the order of their first row."""
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    if int(inverse.max()) + 1 == key.shape[0]:
        return None
    # Renumber in order of first appearance so U is ordered like the batch (deterministic layout).
    first = torch.full((int(inverse.max()) + 1,), key.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(key.shape[0]), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return first[order], rank[inverse]


def prompt_cache(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, position_ids: torch.Tensor,
                 rows: torch.Tensor, inverse: torch.Tensor):
    """Keys and values of the prompt rows `rows` (U of them), run once, then expanded to every row
    (`inverse`, (B,)) as a transformers cache. `model` is a decoder or a causal LM (its
    `use_cache` output); the expansion is an index_select, so gradients reach the prompt pass."""
    out = model(input_ids=prompt_ids[rows], attention_mask=prompt_mask[rows], position_ids=position_ids[rows],
                use_cache=True)
    cache = out.past_key_values
    cache.reorder_cache(inverse.to(prompt_ids.device))  # (U, ...) -> (B, ...)
    return cache


def response_hidden(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, num_response: int) -> torch.Tensor | None:
    """Final hidden states of the positions that predict the R response tokens, (B, R, H):
    positions [L-R-1, L-1), as the plain forward's `last_hidden_state[:, -R-1:-1]`.

    The prompt minus its last column runs once per distinct prompt; the last prompt token and the
    first R-1 response tokens then run for every row against the shared cache. Returns None when
    no two rows share a prompt (the caller runs the plain forward).
    """
    L = input_ids.shape[1]
    P = L - num_response  # prompt width
    if P < 2 or input_ids.shape[0] < 2:
        return None
    if decoder.training and _checkpointed(decoder):
        return None  # checkpointed layers drop the cache (transformers' GradientCheckpointingLayer)
    shared = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
    if shared is None:
        return None
    rows, inverse = shared
    cache = prompt_cache(decoder, input_ids[:, : P - 1], attention_mask[:, : P - 1], position_ids[:, : P - 1],
                         rows, inverse)
    return decoder(
        input_ids=input_ids[:, P - 1 : L - 1],
        attention_mask=attention_mask[:, : L - 1],
        position_ids=position_ids[:, P - 1 : L - 1],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state


def _checkpointed(model: nn.Module) -> bool:
    """Activation checkpointing is on (transformers >= 5 renamed the property)."""
    flag = getattr(type(model), "is_activation_checkpointing", None)
    return bool(model.is_activation_checkpointing if flag is not None else getattr(model, "is_gradient_checkpointing", False))


def shared_prompt_cache(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """For generation: the cache of every row's prompt minus its last token, each distinct prompt
    computed once (`generate(..., past_key_values=cache)` then runs only the last prompt token per
    row), or None when no two rows share a prompt."""
    if input_ids.shape[1] < 2 or input_ids.shape[0] < 2:
        return None
    shared = distinct_prompts(input_ids, attention_mask)
    if shared is None:
        return None
    from rlhfkit.models.policy import position_ids_from_mask  # policy imports this module

    rows, inverse = shared
    pos = position_ids_from_mask(attention_mask)
    return prompt_cache(model, input_ids[:, :-1], attention_mask[:, :-1], pos[:, :-1], rows, inverse)
