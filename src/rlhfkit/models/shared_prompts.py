"""Compute each distinct prompt once when several rows of a batch share it (GRPO/RLOO groups,
a DPO pair's chosen and rejected rows), and the prompt prefix that every row shares (a chat
template's system header) once per batch.

A causal decoder's states at the prompt positions depend only on the prompt, so G rows with the
same prompt can run the prompt through the model once and attend to one copy of its keys and
values, expanded to the G rows. The result equals the plain forward up to float rounding, and
gradients flow back through the shared keys and values into the prompt pass. With G = 8 and
prompts longer than the responses (the arithmetic demo: 62 prompt tokens, <= 16 response
tokens) this removes most of the work of sampling, scoring and the update.

The shared prefix works the same way one level up: with a chat template every prompt starts with
the same header (SmolLM2's default system prompt and `<|im_start|>user\n`: 24 tokens of prompts of
39-54 tokens). Each row's first S tokens are moved to the front and its left padding right after
them (`prefix_first`; positions from the mask are unchanged, and padding is masked wherever it
sits), the S columns run once for the batch, and every row continues from their keys and values.
With shared prompts too, the two levels stack when the prefix is long enough to pay for a third
decoder call (`MIN_PREFIX_SAVING`, a long system prompt): the prefix once, each distinct prompt's
rest once against it, then every row's response (`distinct_prompt_cache`).

Notation: B rows, U distinct prompts, P prompt width (left padded), R response width, H hidden,
S shared prefix length.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit.models.hf_compat import cache_kwargs, is_checkpointing, returned_cache
from rlhfkit.models.trunk import position_ids_from_mask


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct prompt (U,), row -> its distinct prompt (B,)), or None when
    every row's prompt is different (nothing to share). Rows are equal when their left-padded
    tokens and masks are equal; distinct prompts keep the order of their first row."""
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    if int(inverse.max()) + 1 == key.shape[0]:
        return None
    # Renumber in order of first appearance so U is ordered like the batch (deterministic layout).
    first = torch.full((int(inverse.max()) + 1,), key.shape[0], dtype=torch.long, device=key.device)
    first.scatter_reduce_(0, inverse, torch.arange(key.shape[0], device=key.device), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=key.device)
    return first[order], rank[inverse]


def prompt_cache(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, position_ids: torch.Tensor,
                 rows: torch.Tensor, inverse: torch.Tensor):
    """Keys and values of the prompt rows `rows` (U of them), run once, then expanded to every row
    (`inverse`, (B,)) as a transformers cache. `model` is a decoder or a causal LM (its
    `use_cache` output); the expansion is an index_select, so gradients reach the prompt pass."""
    out = model(input_ids=prompt_ids[rows], attention_mask=prompt_mask[rows], position_ids=position_ids[rows],
                use_cache=True)
    cache = returned_cache(out)
    cache.reorder_cache(inverse.to(prompt_ids.device))  # (U, ...) -> (B, ...)
    return cache


def response_hidden(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, num_response: int, share_prefix: bool = False) -> torch.Tensor | None:
    """Final hidden states of the positions that predict the R response tokens, (B, R, H):
    positions [L-R-1, L-1), as the plain forward's `last_hidden_state[:, -R-1:-1]`.

    The prompt minus its last column runs once per distinct prompt; the last prompt token and the
    first R-1 response tokens then run for every row against the shared cache. `share_prefix`: the
    prefix all distinct prompts share runs once before them (`distinct_prompt_cache`). Returns None
    when no two rows share a prompt (the caller runs the plain forward).
    """
    L = input_ids.shape[1]
    P = L - num_response  # prompt width
    if P < 2 or input_ids.shape[0] < 2:
        return None
    if decoder.training and is_checkpointing(decoder):
        return None  # checkpointed layers drop the cache (transformers' GradientCheckpointingLayer)
    shared = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
    if shared is None:
        return None
    rows, inverse = shared
    S = common_prefix_length(input_ids[rows, :P], attention_mask[rows, :P]) if share_prefix else 0
    if S >= MIN_PREFIX and (len(rows) - 1) * S >= MIN_PREFIX_SAVING and not sliding_window_bites(decoder.config, L):
        input_ids, attention_mask = prefix_first(input_ids, attention_mask, P, S)
        position_ids = position_ids_from_mask(attention_mask)
        cache = distinct_prompt_cache(decoder, input_ids[:, : P - 1], attention_mask[:, : P - 1],
                                      position_ids[:, : P - 1], rows, inverse, S)
    else:
        cache = prompt_cache(decoder, input_ids[:, : P - 1], attention_mask[:, : P - 1], position_ids[:, : P - 1],
                             rows, inverse)
    return decoder(
        input_ids=input_ids[:, P - 1 : L - 1],
        attention_mask=attention_mask[:, : L - 1],
        position_ids=position_ids[:, P - 1 : L - 1],
        **cache_kwargs(cache),
        use_cache=True,
    ).last_hidden_state


def shared_prompt_cache(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """For generation: the cache of every row's prompt minus its last token, each distinct prompt
    computed once (`generate(..., cache=cache)` then runs only the last prompt token per
    row), or None when no two rows share a prompt."""
    if input_ids.shape[1] < 2 or input_ids.shape[0] < 2:
        return None
    shared = distinct_prompts(input_ids, attention_mask)
    if shared is None:
        return None
    rows, inverse = shared
    pos = position_ids_from_mask(attention_mask)
    return prompt_cache(model, input_ids[:, :-1], attention_mask[:, :-1], pos[:, :-1], rows, inverse)


# ----------------------------------------------------------------------------- shared prefix

MIN_PREFIX = 4  # below this the extra forward call costs more than the prefix saves
# Under shared prompts the prefix stage is a third decoder call, which on a CPU costs about what ~100 positions
# do (every weight read once, ~90 ops a layer dispatched): a DPO step of SmolLM2 (chunks of 4 pairs sharing
# a 24-token header: 72 positions saved per chunk) ran 5% faster on one thread and 4.5% slower on two; with
# a 128-token system prompt (chunks of 2 pairs: 128 saved) 8% faster on two. So the stage runs only when it
# saves at least this many positions.
MIN_PREFIX_SAVING = 128


def sliding_window_bites(config, length: int | None = None) -> bool:
    """Some layer attends through a sliding window narrower than `length` columns (None: any
    window). Such a window counts columns, padding included, so moving a row's left padding
    between the shared prefix and the rest (`prefix_first`) would hide real tokens from it
    (Mistral, Phi-3, Gemma 2/3, Qwen2 with use_sliding_window)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    sliding = "sliding_attention" in types if types is not None else getattr(config, "use_sliding_window", True)
    return bool(window) and bool(sliding) and (length is None or length > window)


def common_prefix_length(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> int:
    """S: how many leading real tokens every row's left-padded prompt (B, P) starts with, at most
    the shortest prompt minus one (each row's last prompt token must run for that row: it predicts
    the first response token). 0 with one row, or when the mask is not left padding."""
    B, P = prompt_ids.shape
    lengths = prompt_mask.long().sum(1)
    n = int(lengths.min()) - 1 if B > 1 else 0
    if n < 1:
        return 0
    start = P - lengths  # (B,) first real column of each row
    if not torch.equal(prompt_mask.bool(), torch.arange(P, device=start.device)[None, :] >= start[:, None]):
        return 0
    heads = prompt_ids.gather(1, start[:, None] + torch.arange(n, device=start.device))  # (B, n)
    return int((heads == heads[:1]).all(0).long().cumprod(0).sum())


def prefix_first(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                 prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (B, L) with each row's first `prefix` prompt tokens moved to columns [0, S) and
    its left padding to just after them. Positions from the new mask (cumsum - 1) are the same for
    every real token, and causal attention sees the same tokens, so the forward is unchanged."""
    L = input_ids.shape[1]
    pads = prompt_width - attention_mask[:, :prompt_width].long().sum(1, keepdim=True)  # (B, 1)
    col = torch.arange(L, device=input_ids.device)[None, :]
    src = torch.where(col < prefix, pads + col, torch.where(col < prefix + pads, col - prefix, col))
    return input_ids.gather(1, src), attention_mask.gather(1, src)


def prefix_cache(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, prefix: int):
    """Keys and values of the first `prefix` columns of row 0 (the same in every row after
    `prefix_first`), run once and expanded to all B rows: `prompt_cache` with one distinct prompt."""
    one, every = (torch.zeros(n, dtype=torch.long, device=ids.device) for n in (1, ids.shape[0]))
    return prompt_cache(model, ids[:, :prefix], mask[:, :prefix], position_ids[:, :prefix], one, every)


def distinct_prompt_cache(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                          rows: torch.Tensor, inverse: torch.Tensor, prefix: int):
    """`prompt_cache` in two levels, for (B, W) prompt columns laid out by `prefix_first`: the `prefix`
    columns every row shares run once, then each distinct prompt's remaining columns (`rows`, U of
    them) against that, and the U rows' keys and values are expanded to every row (`inverse`). So a
    micro-batch of U prompts with a chat header of S tokens runs (U - 1) S fewer positions."""
    cache = prefix_cache(model, ids[rows], mask[rows], position_ids[rows], prefix)  # (U, ...), one forward of S
    if ids.shape[1] > prefix:
        cache = returned_cache(model(input_ids=ids[rows, prefix:], attention_mask=mask[rows],
                                     position_ids=position_ids[rows, prefix:], **cache_kwargs(cache), use_cache=True))
    cache.reorder_cache(inverse.to(ids.device))  # (U, ...) -> (B, ...)
    return cache


def shared_prefix_hidden(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         num_response: int) -> torch.Tensor | None:
    """Final hidden states (B, R, H) of the positions predicting the R response tokens, as
    `response_hidden`, with the prompt prefix all rows share run once. None when there is no
    prefix of at least MIN_PREFIX tokens, or a sliding window narrower than the rows (the caller
    runs the plain forward)."""
    L = input_ids.shape[1]
    P = L - num_response
    if (decoder.training and is_checkpointing(decoder)) or sliding_window_bites(decoder.config, L):
        return None
    S = common_prefix_length(input_ids[:, :P], attention_mask[:, :P])
    if S < MIN_PREFIX:
        return None
    ids, mask = prefix_first(input_ids, attention_mask, P, S)
    pos = position_ids_from_mask(mask)
    cache = prefix_cache(decoder, ids, mask, pos, S)
    hidden = decoder(input_ids=ids[:, S : L - 1], attention_mask=mask[:, : L - 1], position_ids=pos[:, S : L - 1],
                     **cache_kwargs(cache), use_cache=True).last_hidden_state
    return hidden[:, -num_response:]


def shared_prefix_prompts(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """For generation: (ids, mask, cache) with the shared prefix moved to the front and its cache
    computed once (`generate(ids, mask, cache=cache)` then prefills the rest per row),
    or None without a prefix of at least MIN_PREFIX tokens or with sliding-window attention."""
    if sliding_window_bites(model.config):  # the response length is not known here
        return None
    S = common_prefix_length(input_ids, attention_mask)
    if S < MIN_PREFIX:
        return None
    ids, mask = prefix_first(input_ids, attention_mask, input_ids.shape[1], S)
    return ids, mask, prefix_cache(model, ids, mask, position_ids_from_mask(mask), S)
