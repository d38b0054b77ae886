"""The gradient-accumulation step every trainer runs: forward and backward of each chunk of one
optimiser step, the gradients adding up, all-reduced on the last chunk only.

The trainer keeps its loss and its normaliser: `loss_fn(chunk)` returns the chunk's loss already
divided by the step's GLOBAL normaliser (tokens, sequences or pairs of all chunks on all processes),
so the chunks' gradients add up to the step's gradient however the step is cut
(docs/pitfalls.md#loss-aggregation). The optimiser step that follows is `runtime/faults.guarded_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlhfkit.runtime.distributed import accumulate_backward

Stats = dict[str, Any]  # a chunk's stats: floats, or 0-d tensors to read after the loop
ChunkLoss = Callable[[Any], tuple[torch.Tensor, Stats]]  # chunk -> (loss / global normaliser, stats)


def accumulate(accelerator, model, chunks: Sequence, loss_fn: ChunkLoss) -> list[Stats]:
    """Forward and backward of each of `chunks` in order (`runtime/distributed.accumulate_backward`,
    gradients synchronised on the last one). Reads nothing on the host itself, so with a `loss_fn`
    that reads nothing either the device runs ahead of Python. Returns each chunk's stats as
    `loss_fn` gave them, plus its "loss" (the detached 0-d tensor that went backward)."""
    out = []
    for i, chunk in enumerate(chunks):
        loss, stats = loss_fn(chunk)
        accumulate_backward(accelerator, model, loss, sync=i == len(chunks) - 1)
        out.append({**stats, "loss": loss.detach()})
    return out


def add_up(stats: list[Stats]) -> Stats:
    """Each stat summed over the chunks, in chunk order from 0.0 (so a float stat adds up as a running
    `+=` would, a tensor stat stays a tensor); the backward's "loss" tensors are left out."""
    total: Stats = {}
    for st in stats:
        for k, v in st.items():
            if k != "loss":
                total[k] = total.get(k, 0.0) + v
    return total
