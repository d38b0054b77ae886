"""Worker for tests/scale/test_fsdp2_gradients.py, started on 2 CPU processes (gloo) by

    python -m torch.distributed.run --nproc_per_node 2 fsdp2_gradient_worker.py OUT_JSON

Each process builds the same tiny Llama with a value head (ActorCritic, seeded), keeps one copy
whole and shards the other with rlhfkit's FSDP2 (`runtime/fsdp2.shard`, full shard, fp32). Process r
takes rows r::2 of one batch of 4 rows. The sharded copy runs the trainers' own forward
(`rollout/logprobs.forward_logprobs`: log-probs, values masked out of place, entropy) on its rows
and backs a PPO-shaped loss through it; FSDP2 averages the two processes' gradients. The whole copy
runs the same loss on both processes' rows and takes the mean, which is that average. Process 0
writes, per parameter, the norm of the whole copy's gradient and of the difference (the sharded
gradient gathered whole), and the warnings the sharded forward raised.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from rlhfkit.learn.tiny import build_tiny_model, build_tokenizer
from rlhfkit.models.policy import ActorCritic, ValueHead
from rlhfkit.rollout.logprobs import forward_logprobs
from rlhfkit.runtime.fsdp2 import Fsdp2Plan, shard

B, P, R = 4, 5, 4  # rows, prompt tokens, response tokens


def batch(rows: slice) -> tuple[SimpleNamespace, torch.Tensor, torch.Tensor]:
    """The rows `rows` of one fixed batch (the rollout fields forward_logprobs reads), with advantages
    and returns. Row 1 has a left-padded prompt and row 2 a response cut short (mask 0)."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 60, (B, P + R), generator=g)
    mask = torch.ones(B, P + R, dtype=torch.long)
    mask[1, :2] = 0
    response_mask = mask[:, P:].clone()
    response_mask[2, 2:] = 0
    mask[2, P + 2:] = 0
    adv, ret = torch.randn(B, R, generator=g), torch.randn(B, R, generator=g)
    data = SimpleNamespace(input_ids=ids[rows], attention_mask=mask[rows], response_ids=ids[rows, P:],
                           response_mask=response_mask[rows].float(), trunk=None)
    return data, adv[rows], ret[rows]


def loss_of(actor, rows: slice) -> torch.Tensor:
    """PPO-shaped: policy term, value term, entropy bonus, over the masked response tokens."""
    data, adv, ret = batch(rows)
    logp, values, ent = forward_logprobs(actor, data, temperature=0.7, with_values=True, with_entropy=True)
    m = data.response_mask
    return (-(logp * adv * m).sum() + ((values - ret) ** 2 * m).sum() - 0.01 * (ent * m).sum()) / m.sum()


def main(out: Path) -> None:
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    lm = build_tiny_model(len(build_tokenizer()), seed=0)
    head = ValueHead(lm.config.hidden_size)
    torch.nn.init.normal_(head.summary.weight, std=0.5)  # not the zero start: values carry a gradient
    whole = ActorCritic(lm, head).train()
    sharded = copy.deepcopy(whole)
    shard(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1), Fsdp2Plan(True, (), "no"), torch.device("cpu"))

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loss_of(sharded, slice(rank, None, 2)).backward()
    (loss_of(whole, slice(0, None, 2)) + loss_of(whole, slice(1, None, 2))).div(2).backward()

    rows = {}
    grads = dict(whole.named_parameters())
    for name, p in sharded.named_parameters():  # every process gathers, in the same order
        full = p.grad.full_tensor()
        rows[name] = [float(grads[name].grad.norm()), float((full - grads[name].grad).norm())]
    if rank == 0:
        out.write_text(json.dumps({"grads": rows, "warnings": [str(w.message) for w in seen]}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    from rlhfkit.cli import end_process

    end_process(0)  # without the interpreter's finalisation, as ddp_worker.py ends (rlhfkit.cli.end_process)
