"""KV-cache reuse across turns: the keys and values of a finished row, kept under its token ids, so
a later request whose context starts with those ids runs only its new tokens.

A multi-turn episode's next context is its last context + the turn the model sampled + the
environment's (or agent's) new messages. Re-encoding it all each turn costs the whole history
every turn (quadratic in the turns); with this store a turn costs its new tokens. Entries hold
the K/V of every layer for one row's real tokens (left padding stripped): (layers, 2) tensors of
(kv heads, length, head dim). An entry is taken out when used (the row's next context extends
it; the old one is not needed again) and the oldest go first beyond `max_tokens` cached tokens.

Only valid while the weights do not change: a store lives for one rollout (one iteration).
Numerics: K/V computed incrementally equal a full prefill's up to float rounding, so sampled
tokens follow the same distribution; the trainer's teacher-forced pass scores the ids either way.

Notation: B rows, H kv heads, C cached columns, N new columns, D head dim.
"""

from __future__ import annotations

import collections

import torch

from rlhfkit.models.hf_compat import dynamic_cache


class PrefixCache:
    """ids tuple -> per-layer [(k (H, L, D), v (H, L, D))] of that sequence's L = len(ids) tokens."""

    def __init__(self, max_tokens: int = 2_000_000):
        self.entries: collections.OrderedDict[tuple[int, ...], list] = collections.OrderedDict()
        self.lengths: collections.Counter = collections.Counter()
        self.max_tokens, self.tokens = max_tokens, 0
        self.hits = self.reused_tokens = 0

    def put(self, ids: tuple[int, ...], kv: list) -> None:
        if not ids or ids in self.entries:
            return
        self.entries[ids] = kv
        self.lengths[len(ids)] += 1
        self.tokens += len(ids)
        while self.tokens > self.max_tokens and self.entries:
            self._drop(next(iter(self.entries)))

    def _drop(self, ids: tuple[int, ...]) -> list:
        kv = self.entries.pop(ids)
        self.lengths[len(ids)] -= 1
        if not self.lengths[len(ids)]:
            del self.lengths[len(ids)]
        self.tokens -= len(ids)
        return kv

    def match(self, ids: list[int]) -> int:
        """Length of the longest entry that is a proper prefix of `ids` (at least one token must
        still run), 0 when there is none."""
        for n in sorted(self.lengths, reverse=True):
            if n < len(ids) and tuple(ids[:n]) in self.entries:
                return n
        return 0

    def take(self, ids: list[int]) -> tuple[int, list | None]:
        """(n, K/V) of the `match` of `ids`, removed from the store; (0, None) when there is none."""
        n = self.match(ids)
        if not n:
            return 0, None
        self.hits += 1
        self.reused_tokens += n
        return n, self._drop(tuple(ids[:n]))


def batched_cache(config, rows: list[list | None], lengths: list[int], device):
    """A transformers DynamicCache of C = max(lengths) columns: row b's K/V right-aligned (left
    padding, zeros), and the (B, C) mask that marks its real columns."""
    B, C = len(rows), max(lengths)
    mask = torch.zeros((B, C), dtype=torch.long, device=device)
    cache = dynamic_cache(config)
    layers = len(next(r for r in rows if r is not None))
    first = next(r for r in rows if r is not None)[0][0]  # (H, L, D)
    shape, dtype = first.shape, first.dtype
    for layer in range(layers):
        k = torch.zeros((B, shape[0], C, shape[2]), dtype=dtype, device=device)
        v = torch.zeros_like(k)
        for b, (row, n) in enumerate(zip(rows, lengths)):
            if n:
                k[b, :, C - n :] = row[layer][0]
                v[b, :, C - n :] = row[layer][1]
        cache.update(k, v, layer)
    for b, n in enumerate(lengths):
        if n:
            mask[b, C - n :] = 1
    return cache, mask


def row_kv(cache, j: int, real: torch.Tensor) -> list:
    """Row j's K/V of the columns where `real` (L,) is 1, every layer: [(k (H, n, D), v (H, n, D))]."""
    cols = real.nonzero().squeeze(1)
    return [(layer.keys[j][:, cols].clone(), layer.values[j][:, cols].clone()) for layer in cache.layers]
