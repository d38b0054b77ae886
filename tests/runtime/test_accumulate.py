"""runtime/accumulate.py: the gradient-accumulation step every trainer runs. With each chunk's loss
divided by the step's global normaliser, the accumulated gradient and the summed stats of a step do
not depend on how its rows are cut into micro-batches (docs/pitfalls.md#loss-aggregation)."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from rlhfkit.runtime.accumulate import accumulate, add_up

from tiny_lm import build_tiny_model

VOCAB, ROWS, WIDTH = 48, 8, 10


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(ROWS, WIDTH) token ids and a mask of unequal row lengths (3..10 tokens), so that micro-batches
    hold unequal token counts and a per-micro-batch mean would weigh tokens differently."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (ROWS, WIDTH), generator=g)
    lengths = torch.tensor([10, 3, 7, 4, 9, 5, 8, 6])
    return ids, (torch.arange(WIDTH) < lengths[:, None]).float()


def step_gradient(n_chunks: int) -> tuple[torch.Tensor, dict]:
    """(flat gradient, summed stats) of one step over the batch cut into `n_chunks` micro-batches;
    loss: the summed next-token NLL / the whole batch's token count (the global normaliser)."""
    model = build_tiny_model(VOCAB)
    ids, mask = batch()
    n_tok = float(mask[:, 1:].sum())

    def loss_fn(rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits = model(input_ids=ids[rows]).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[rows, 1:], reduction="none")
        m = mask[rows, 1:]
        loss = (nll * m).sum() / n_tok
        return loss, {"loss/nll": loss.item(), "tokens": float(m.sum())}

    stats = accumulate(Accelerator(cpu=True), model, torch.arange(ROWS).tensor_split(n_chunks), loss_fn)
    assert len(stats) == n_chunks and all(st["loss"].requires_grad is False for st in stats)
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return grad, add_up(stats)


@pytest.mark.parametrize("n_chunks", [2, 4])
def test_the_step_gradient_does_not_depend_on_the_micro_batch_split(n_chunks):
    whole, whole_stats = step_gradient(1)
    split, split_stats = step_gradient(n_chunks)
    assert whole.norm() > 0
    assert (split - whole).norm() <= 1e-5 * whole.norm()
    assert split_stats["tokens"] == whole_stats["tokens"] == float(batch()[1][:, 1:].sum())
    assert split_stats["loss/nll"] == pytest.approx(whole_stats["loss/nll"], rel=1e-5)
    assert "loss" not in split_stats  # the backward's tensors stay out of the summed stats


def test_add_up_sums_in_chunk_order_and_keeps_tensors():
    stats = [{"a": 0.1, "t": torch.tensor(1.5), "loss": torch.tensor(9.0)}, {"a": 0.2, "t": torch.tensor(2.0)}]
    total = add_up(stats)
    assert total["a"] == (0.0 + 0.1) + 0.2  # as a running `+=` from 0.0 adds them
    assert isinstance(total["t"], torch.Tensor) and float(total["t"]) == 3.5
    assert set(total) == {"a", "t"}
