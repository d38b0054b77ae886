"""The decode loop of `generation_backend=graph`: a static KV cache, and on CUDA each decoding step
replayed as one captured CUDA graph.

The lean loop (rollout/decode.py) grows its cache by a `cat` per layer and step and shrinks the
batch as rows stop, so shapes change every step and every kernel of the model is launched from
Python: on a GPU a step is then bound by launches, not by the arithmetic or the bytes it moves.
Here the cache is allocated once for prompt + max_new_tokens columns (transformers' StaticCache,
written in place) and the attention mask is a preallocated (n, M) buffer whose next column is set
before each step, so every step of a batch size has the same shapes and addresses: on CUDA
`step_for` runs it through torch.compile(mode="reduce-overhead"), one graph replay per step. The
draw (rollout/decode.py `draw`: softmax(z / T) by an exponential race, argmax at T = 0) runs outside
the graph on torch's generator, as in the lean loop.

Finished rows: the rows run in buckets, the batch's B rows, then powers of two. Once the rows still
going fit in half of their bucket they move (cache rows included) into the smallest power of two
that holds them, so a finished row costs at most what a live one does until then, and nothing
afterwards; each bucket size is one graph, at most log2(B) + 2 per call.

Prompt sharing is kept: the prompt columns (after a shared prompt or prefix cache,
models/shared_prompts.py) are prefilled with a dynamic cache as in the lean loop, then copied into
the static cache once. Models with sliding-window layers decode with the lean loop instead.

The capture is the only CUDA-only part: elsewhere the same step runs eagerly, which is what the CPU
tests check (tests/rollout/test_static_decode.py); its `gpu`-marked test checks on CUDA that the
captured step gives the uncaptured one's tokens.

Notation: B rows, n rows of the current bucket, P prompt width, M >= P + max_new_tokens cache
columns (`cache_columns`), V vocabulary.
"""

from __future__ import annotations

import functools

import torch

from rlhfkit.core.devices import HOST
from rlhfkit.models.hf_compat import cache_kwargs, static_layers_only
from rlhfkit.models.hf_compat import static_cache as new_static_cache
from rlhfkit.rollout.decode import check_temperature, decode, draw, prefill

COLUMN_MULTIPLE = 64  # static cache columns come in multiples of this (`cache_columns`); masked when unused


def static_supported(config) -> bool:
    """Every layer of the model's cache is a full-attention static layer (no sliding window)."""
    return static_layers_only(config)


def static_cache(config, layers: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor, filled: int,
                 columns: int):
    """A transformers StaticCache of `columns` columns holding the first `filled` columns of rows
    `rows` (n,) of `layers`: (keys, values) per layer, each (b, kv heads, >= filled, d)."""
    cache = new_static_cache(config, columns)
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.update(keys[rows, :, :filled], values[rows, :, :filled])  # allocates (n, kv, M, d), writes [0, filled)
    return cache


def cache_columns(positions: int) -> int:
    """Columns of the static cache for `positions` prompt + new tokens: rounded up to a multiple of
    COLUMN_MULTIPLE, so rollouts whose prompts differ in width by a few tokens share graphs."""
    return -(-positions // COLUMN_MULTIPLE) * COLUMN_MULTIPLE


def kv_of(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def next_bucket(live: int, size: int) -> int:
    """Rows of the bucket to go on in: `size` while the `live` rows need more than half of it, else
    the smallest power of two that holds them."""
    return size if 2 * live > size else 1 << (live - 1).bit_length()


def decode_step(model: torch.nn.Module, tok: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                cache) -> torch.Tensor:
    """Logits (n, V) of the next token of each row: tok, pos (n, 1), mask (n, M), cache static."""
    return model(input_ids=tok, attention_mask=mask, position_ids=pos, **cache_kwargs(cache),
                 use_cache=True).logits[:, -1]


@functools.cache
def _captured_step():
    # dynamic=None: a second shape makes torch.compile trace the sizes symbolically instead of
    # recompiling per bucket and prompt width; each new shape is then one more graph capture.
    return torch.compile(decode_step, mode="reduce-overhead")


def step_for(device: torch.device):
    """`decode_step`, captured as CUDA graphs on CUDA (one per bucket size); plain elsewhere."""
    if device.type != "cuda":
        return decode_step
    captured = _captured_step()

    def step(*args):
        torch.compiler.cudagraph_mark_step_begin()  # the last step's logits are consumed: reuse its buffers
        return captured(*args)

    return step


@torch.no_grad()
def static_decode(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  max_new_tokens: int, stop_ids: tuple[int, ...], temperature: float,
                  cache=None) -> list[torch.Tensor]:
    """rollout/decode.py `decode` with a static cache and bucketed rows: the same arguments, the
    same result (B 1-D long tensors on the CPU, each ending at its first stop token or after
    max_new_tokens), the same draws."""
    check_temperature(temperature)
    if not static_supported(model.config):
        return decode(model, input_ids, attention_mask, max_new_tokens, stop_ids, temperature, cache)
    B, P = input_ids.shape
    device, M = input_ids.device, cache_columns(P + max_new_tokens)
    logits, dynamic, positions = prefill(model, input_ids, attention_mask, cache)
    rows = torch.arange(B, device=device)  # the original row of each slot; B: a filler slot
    cache = static_cache(model.config, kv_of(dynamic), rows, P, M)
    del dynamic
    mask = torch.cat([attention_mask, attention_mask.new_zeros(B, M - P)], dim=1)  # (n, M)
    step = step_for(device)
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    tokens = torch.zeros(B + 1, max_new_tokens, dtype=torch.long, device=device)  # row B: fillers' sink
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=HOST)  # read row by row on the host
    live = torch.ones(B, dtype=torch.bool, device=device)  # (n,) slots whose row is still going
    next_pos = positions[:, -1:] + 1  # (n, 1)
    for t in range(max_new_tokens):
        tok = draw(logits, temperature)  # (n,)
        tokens[rows, t] = tok  # finished rows write past their end, which `lengths` cuts off
        stopped = torch.isin(tok, stops) & live
        if bool(stopped.any()):
            lengths[rows[stopped].cpu()] = t + 1
            live &= ~stopped
            n_live = int(live.sum())
            if n_live == 0:
                break
            size = next_bucket(n_live, len(rows))
            if size < len(rows):  # into a smaller bucket: the live slots, then fillers copying the first
                keep = live.nonzero().squeeze(1)
                keep = torch.cat([keep, keep[:1].expand(size - n_live)])
                cache = static_cache(model.config, kv_of(cache), keep, P + t, M)
                tok, mask, next_pos = tok[keep], mask[keep], next_pos[keep]
                rows = torch.where(torch.arange(size, device=device) < n_live, rows[keep], B)
                live = rows < B
        if t + 1 == max_new_tokens:
            break
        mask[:, P + t] = 1
        logits = step(model, tok[:, None], next_pos, mask, cache)
        next_pos = next_pos + 1
    return [tokens[i, : int(lengths[i])].cpu() for i in range(B)]
