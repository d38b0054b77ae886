"""A lean decode loop for rollouts: prefill once, then one forward of the new token per step.

HF `generate` (rollout/core.py, the reference path) wraps every decoding step in its own
machinery: input preparation, the logits-processor list, stopping criteria, and it keeps computing
every row until the last one stops. This loop calls the model's forward directly with the KV cache
and the new token only, draws with the same exponential race (rollout/sampling.py: exactly
softmax(z / T) over the full vocabulary; argmax at T = 0) and drops a row from the batch (its
cache rows included) as soon as it emits a stop token, so finished rows cost nothing afterwards.

Positions come from the attention mask, as in every teacher-forced pass
(docs/pitfalls.md#padding-and-positions): a left-padded row's first real token has position 0.
Truncated sampling (top_k / top_p) and a model's own generation settings go to HF generate.

Notation: B rows, P padded prompt width, C cached prompt columns (shared prompt or prefix), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhfkit.core.devices import HOST
from rlhfkit.models.attention import native_attention
from rlhfkit.models.hf_compat import cache_kwargs, dynamic_cache
from rlhfkit.models.lora import merged_lora
from rlhfkit.models.shared_prompts import shared_prefix_prompts, shared_prompt_cache
from rlhfkit.models.trunk import position_ids_from_mask
from rlhfkit.rollout.core import Rollout, SamplingParams, generate_ids, rollout_from_tokens, rows_per_call
from rlhfkit.rollout.prompt_fit import encode_prompts
from rlhfkit.rollout.sampling import exponential_race


def draw(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """One token per row of `logits` (B, V): from softmax(logits / T) by an exponential race, the
    argmax at T = 0. The same computation (float32) as generate() with ExponentialRaceSampler."""
    scores = logits.float()
    if temperature == 0:
        return scores.argmax(dim=-1)
    return exponential_race(torch.softmax(scores if temperature == 1.0 else scores / temperature, dim=-1))


def lean_supported(params: SamplingParams) -> bool:
    """True when the lean loop samples what `params` ask: the full vocabulary (or greedy)."""
    return params.temperature == 0 or (params.top_k in (0, None) and params.top_p >= 1.0)


def check_temperature(temperature: float) -> None:
    if not temperature >= 0:  # as ExponentialRaceSampler: a negative T would sample softmax(-z / |T|)
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")


def prefill(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache=None):
    """(logits (B, V) of the last prompt column, the cache holding all P prompt columns, positions
    (B, P) from the mask). `cache`: None, or a cache already holding the first C columns of every
    row (models/shared_prompts.py), which then run no more."""
    positions = position_ids_from_mask(attention_mask)
    if cache is None:
        cache = dynamic_cache(model.config)
    done_cols = cache.get_seq_length()
    # The last column's logits only, picked by an index tensor: that gives a contiguous (B, 1, H)
    # copy; logits_to_keep=1 slices a strided view, which torch's matmul cannot fold to 2-D, and it
    # then expands the (V, H) head weight to (B, H, V) for a bmm (0.9 GB copied at B = 16).
    last = torch.tensor([input_ids.shape[1] - done_cols - 1], device=input_ids.device)
    logits = model(input_ids=input_ids[:, done_cols:], attention_mask=attention_mask,
                   position_ids=positions[:, done_cols:], **cache_kwargs(cache), use_cache=True,
                   logits_to_keep=last).logits[:, -1]  # (B, V)
    return logits, cache, positions


@torch.no_grad()
def decode(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
           stop_ids: tuple[int, ...], temperature: float, cache=None) -> list[torch.Tensor]:
    """Sampled tokens of each left-padded prompt row: B 1-D long tensors, each ending at its first
    stop token (included) or after `max_new_tokens` tokens.

    input_ids, attention_mask: (B, P). `cache`: a transformers cache already holding the first C
    columns of every row (models/shared_prompts.py), or None. Rows leave the batch when they
    stop: the forward of step t runs only the rows still going.
    """
    check_temperature(temperature)
    B, P = input_ids.shape
    device = input_ids.device
    logits, cache, positions = prefill(model, input_ids, attention_mask, cache)
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    tokens = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=HOST)  # read row by row on the host
    rows = torch.arange(B, device=device)  # the original row of each row still in the batch
    mask = attention_mask
    next_pos = positions[:, -1:] + 1  # (b, 1)
    for t in range(max_new_tokens):
        tok = draw(logits, temperature)  # (b,)
        tokens[rows, t] = tok
        stopped = torch.isin(tok, stops)
        if bool(stopped.any()):
            lengths[rows[stopped].cpu()] = t + 1
            keep = (~stopped).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            rows, tok, mask, next_pos = rows[keep], tok[keep], mask[keep], next_pos[keep]
            cache.batch_select_indices(keep)
        if t + 1 == max_new_tokens:
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, **cache_kwargs(cache),
                       use_cache=True).logits[:, -1]
        next_pos = next_pos + 1
    return [tokens[i, : int(lengths[i])].cpu() for i in range(B)]


def lean_generate(model: torch.nn.Module, tokenizer, prompt_texts: list[str], params: SamplingParams,
                  batch_size: int | None = None, share_prompts: bool = False, share_prefix: bool = False,
                  decoder: Callable = decode) -> Rollout:
    """generate() (rollout/core.py) with the lean loop (or `decoder`, a loop with decode's
    signature: rollout/static_decode.py): the same arguments, prompt encoding and token layout
    (`rollout_from_tokens`)."""
    enc = encode_prompts(tokenizer, prompt_texts, params.max_prompt_length)  # left padding: ends kept
    stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
    rows = lean_generate_ids(model, tokenizer, enc["input_ids"], enc["attention_mask"], params, batch_size,
                             share_prompts, share_prefix, decoder)
    return rollout_from_tokens(tokenizer, enc, rows, stop_ids)


@torch.no_grad()
def lean_generate_ids(model: torch.nn.Module, tokenizer, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams,
                      batch_size: int | None = None, share_prompts: bool = False,
                      share_prefix: bool = False, decoder: Callable = decode) -> list[torch.Tensor]:
    """generate_ids() (rollout/core.py) with the lean loop (or `decoder`): N left-padded context rows
    ids, mask (N, L) -> N rows of up to params.max_new_tokens ids, each ending at its first stop
    token, on the CPU. Shared prompt/prefix caches and merged LoRA as there; truncated sampling
    (top_k / top_p) runs HF generate instead."""
    if not lean_supported(params):
        return generate_ids(model, tokenizer, ids, mask, params, batch_size, share_prompts, share_prefix)
    was_training = model.training
    model.eval()
    stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
    device = next(model.parameters()).device
    rows: list[torch.Tensor] = []
    with merged_lora(model), native_attention():  # no backward here (models/attention.py)
        step = rows_per_call(model, ids, params.max_new_tokens, batch_size)  # CUDA: as many as fit (rollout/core.py)
        for i in range(0, len(ids), step):
            chunk_ids, chunk_mask = ids[i : i + step].to(device), mask[i : i + step].to(device)
            cache = shared_prompt_cache(model, chunk_ids, chunk_mask) if share_prompts else None
            if cache is None and share_prefix:
                shared = shared_prefix_prompts(model, chunk_ids, chunk_mask)
                if shared is not None:  # prefix moved to the front; positions and response columns unchanged
                    chunk_ids, chunk_mask, cache = shared
            rows += decoder(model, chunk_ids, chunk_mask, params.max_new_tokens, stop_ids, params.temperature, cache)
    model.train(was_training)
    return rows
