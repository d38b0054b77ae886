"""The teacher-forced log-prob pass: every sampled token's log-prob under the policy (at the
sampling temperature), the values, the entropy and the reference log-probs, from one causal
forward over prompt + response per micro-batch; and `forward_logprobs`, the same forward the
update runs with gradients. Sampling itself is rollout/core.py's `generate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch

from rlhfkit.rollout.core import Rollout, trim_bounds, trim_rows

# Positions one forward/backward runs at most on the CPU: a micro-batch that runs more runs in row
# chunks (`row_chunks`). Activations grow with the positions the forward runs, prompt and response
# alike (about 31 KB per position and layer for SmolLM2-135M with LoRA in bf16: estimate/memory.py
# CPU_ACTIVATION_BYTES), while the matmuls of a 640-position chunk still run at full speed
# (docs/benchmarks.md). GPUs run whole micro-batches. The default of the config's cpu_chunk_positions
# (trainers/options.py): the trainers pass the run's budget down (`chunk_budget`), so every pass of a
# run cuts alike and two runs in one process do not share it.
CHUNK_POSITIONS = 640


def chunk_positions(device: torch.device, budget: int = CHUNK_POSITIONS) -> int | None:
    """The CPU chunk budget `budget` on the CPU, None (no chunks) elsewhere."""
    return int(budget) if torch.device(device).type == "cpu" else None


def trimmed_widths(data: Rollout, rows: torch.Tensor) -> tuple[int, int]:
    """(prompt, response) widths of `rows` once `trim` drops their all-padding columns."""
    first, last = trim_bounds(data.query_mask[rows], data.real_mask[rows])
    return data.query_mask.shape[1] - first, last


def positions_run(data: Rollout, rows: torch.Tensor, widths: tuple[int, int]) -> int:
    """Positions a forward over `rows` runs at `widths` (prompt P, response R): R per row and P per
    distinct prompt, since a prompt several rows share runs once (models/shared_prompts.py; every
    trainer that samples or reads several rows per prompt shares them by default)."""
    prompts = len(torch.unique(data.query_ids[rows], dim=0)) if len(rows) > 1 else len(rows)
    return len(rows) * widths[1] + prompts * widths[0]


def row_chunks(items: torch.Tensor, data: Rollout, max_positions: int | None,
               to_rows: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """`items` (one micro-batch, in order) cut into the fewest contiguous near-equal chunks whose
    forward runs at most `max_positions` positions each (`positions_run`, at the micro-batch's
    trimmed widths, which every chunk keeps: `rows_of`); a row over the budget runs alone; None: no cut.
    `to_rows` maps items to rows of `data` (DPO: a pair is its chosen and its rejected row).
    Pure in its inputs, so the scoring pass and the update cut a micro-batch alike (the first update
    chunk repeats the scoring pass exactly). Contiguous chunks keep a group's rows together."""
    if max_positions is None or len(items) < 2:
        return [items]
    to_rows = to_rows or (lambda c: c)
    widths = trimmed_widths(data, to_rows(items))
    # chunks' positions add up to at least the whole micro-batch's (a split group's prompt runs twice)
    k = -(-positions_run(data, to_rows(items), widths) // max_positions)
    while k < len(items):
        chunks = torch.tensor_split(items, k)
        if all(positions_run(data, to_rows(c), widths) <= max_positions for c in chunks):
            return list(chunks)
        k += 1
    return list(torch.tensor_split(items, len(items)))


def micro_batch_chunks(order: torch.Tensor, micro_batch_size: int, data: Rollout, device,
                       chunk_budget: int = CHUNK_POSITIONS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(chunk, micro-batch) pairs: `order` in micro-batches of micro_batch_size rows of `data`, each
    cut by `row_chunks` to at most `chunk_budget` positions on the CPU (whole elsewhere). A chunk runs
    with its micro-batch's columns (`rows_of`)."""
    micros = [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
    return [(c, m) for m in micros for c in row_chunks(m, data, chunk_positions(device, chunk_budget))]


def rows_of(rollout: Rollout, rows: torch.Tensor, columns: torch.Tensor | None = None) -> Rollout:
    """Rows `rows` of `rollout`, trimmed to their own columns (`trim_rows`), or to those of `columns`
    (the rows of the micro-batch the chunk `rows` comes from): then every chunk of a micro-batch has
    the micro-batch's shape and glibc reuses one chunk's freed blocks for the next, where chunks of
    other widths each grew the heap anew."""
    if columns is None:
        return trim_rows(rollout, rows)
    where = {int(r): i for i, r in enumerate(columns)}
    return trim_rows(rollout, columns).select(torch.tensor([where[int(r)] for r in rows], dtype=torch.long,
                                                                     device=columns.device))


def forward_logprobs(
    actor,
    rollout: Rollout,
    temperature: float,
    with_values: bool = True,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Teacher-forced log-probs (B, R) at temperature T, values (B, R), entropy (B, R).

    Padding positions are zeroed so they cannot leak into sums (the fused head skips them).
    `entropy_grad=False`: the entropy is a constant (logged, not trained on).
    """
    device = next(actor.parameters()).device
    R = rollout.response_ids.shape[1]
    m = rollout.response_mask.to(device)
    trunk = rollout.trunk.to(device) if rollout.trunk is not None else None
    lp, values, ent = actor(rollout.input_ids.to(device), rollout.attention_mask.to(device), R, with_values,
                            response_ids=rollout.response_ids.to(device), response_mask=m, temperature=temperature,
                            with_entropy=with_entropy, entropy_grad=entropy_grad, trunk=trunk)
    return lp, (values.float() * m if values is not None else None), ent


@torch.no_grad()
def logprob_pass(actor, reference, rollout: Rollout, temperature: float, micro_batch_size: int,
                 order: torch.Tensor | None = None, keep_trunk_mb: float = 0.0,
                 chunk_budget: int = CHUNK_POSITIONS) -> Rollout:
    """The rollout with logprobs, values, entropy and ref_logprobs (B, R), computed in micro-batches
    (bounded peak memory); a new Rollout, the input is left as it was.

    `order` (B,) groups rows into micro-batches exactly as the first update epoch will, so the
    first update micro-batch repeats this computation bit for bit and its ratio must be 1
    (docs/pitfalls.md#off-by-one); other groupings change padding widths, which moves bf16 results by
    ~1e-2. A micro-batch that runs more than `chunk_budget` positions (CPU) runs in row chunks
    (`row_chunks`), as the update runs it.

    When the actor has frozen bottom layers (`actor.trunk_depth`, models/trunk.py) they run once per
    micro-batch for the policy and the adapter-disabled reference, and their output is kept in
    `rollout.trunk` for the update when it takes at most `keep_trunk_mb` megabytes.
    """
    was_training = actor.training
    actor.eval()
    (B, P), R = rollout.query_ids.shape, rollout.response_ids.shape[1]
    order = torch.arange(B, device=rollout.query_ids.device) if order is None else order
    parts: dict[str, list[torch.Tensor]] = {"logprobs": [], "values": [], "entropy": [], "ref_logprobs": [],
                                            "trunk": []}
    device = next(actor.parameters()).device
    depth = getattr(actor, "trunk_depth", 0)
    H = actor.config.hidden_size if depth else 0
    keep = depth and B * (P + R) * H * 4 <= keep_trunk_mb * 2**20  # (B, L, H) at 4 bytes
    loaded = getattr(reference, "loaded", None)  # an offloaded reference comes in once per pass
    with loaded(device) if callable(loaded) else contextlib.nullcontext():
        for rows, micro in micro_batch_chunks(order, micro_batch_size, rollout, device, chunk_budget):
            mb = rows_of(rollout, rows, micro)  # the micro-batch's columns, as the update runs the chunk
            ids, mask = mb.input_ids.to(device), mb.attention_mask.to(device)
            mb = dataclasses.replace(mb, trunk=actor.trunk(ids, mask) if depth else None)  # policy's and reference's
            lp, v, ent = forward_logprobs(actor, mb, temperature, with_values=True, with_entropy=True)
            parts["logprobs"].append(lp.cpu())
            if v is not None:  # a policy-only model (GRPO, RLOO) has no value head
                parts["values"].append(v.cpu())
            parts["entropy"].append(ent.cpu())
            if reference is not None:
                ref_lp = reference.logprobs(ids, mask, mb.response_ids.to(device), mb.response_mask.to(device),
                                            temperature, trunk=mb.trunk)
                parts["ref_logprobs"].append(ref_lp.cpu())
            if keep:  # back to the full rollout's columns: the prompt columns trim cut on the left, response on the right
                pad = (0, 0, P - mb.query_ids.shape[1], R - mb.response_ids.shape[1])
                parts["trunk"].append(torch.nn.functional.pad(mb.trunk.cpu(), pad))
    actor.train(was_training)
    inverse = torch.argsort(order)  # back from micro-batch order to row order
    filled = {name: torch.cat([c if c.dim() == 3 else torch.nn.functional.pad(c, (0, R - c.shape[1]))
                               for c in chunks])[inverse] for name, chunks in parts.items() if chunks}
    if reference is None:
        filled["ref_logprobs"] = None
    return dataclasses.replace(rollout, **filled)


@torch.no_grad()
def frozen_logprobs(reference, rollout: Rollout, temperature: float, micro_batch_size: int,
                    order: torch.Tensor | None = None, chunk_budget: int = CHUNK_POSITIONS) -> torch.Tensor:
    """(B, R) log-probs of the rollout's tokens at `temperature` under a frozen model alone (a
    `models.policy.Reference`, e.g. a distillation teacher), 0 on padding; in the micro-batches and
    row chunks of `order` as `logprob_pass` runs them (bounded peak memory), on the reference's device."""
    B, R = rollout.response_ids.shape
    order = torch.arange(B, device=rollout.query_ids.device) if order is None else order
    device = next(reference.frozen.parameters()).device
    parts = []
    with reference.loaded(device):
        for rows, micro in micro_batch_chunks(order, micro_batch_size, rollout, device, chunk_budget):
            mb = rows_of(rollout, rows, micro)
            lp = reference.logprobs(mb.input_ids.to(device), mb.attention_mask.to(device),
                                    mb.response_ids.to(device), mb.response_mask.to(device), temperature)
            parts.append(torch.nn.functional.pad(lp.float().cpu(), (0, R - lp.shape[1])))
    return torch.cat(parts)[torch.argsort(order)]
