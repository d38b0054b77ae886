"""The preference trainers' shared tables and passes (dpo/simpo/orpo, kto, online-dpo).

A table is a Rollout (left-padded prompt, right-padded response); a pair table holds 2N rows, chosen i
and rejected N + i. Batches are planned from the seed; micro-batches are cut into chunks of bounded
positions on the CPU (rollout/logprobs.py `row_chunks`), and the losses are sums over pairs or rows,
so chunks add up to their micro-batch's gradient. Shapes: N pairs (or rows), P prompt and R response
width.
"""

from __future__ import annotations

import torch

from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import end_of_turn, format_prompts, tokenize_sft_example
from rlhfkit.errors import DataError
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.rollout.logprobs import chunk_positions, micro_batch_chunks, row_chunks, rows_of
from rlhfkit.rollout.prompt_fit import enforce_prompt_limit

# ----------------------------------------------------------------------------- tables


def encode_pairs(tok, pairs: list[dict], cfg) -> Rollout:
    """2N rows: chosen responses (rows 0..N-1), then rejected (N..2N-1) (`encode_rows`)."""
    return encode_rows(tok, pairs + pairs, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs], cfg,
                       "a chosen or rejected response")


def response_budget(prompt_tokens: int, cfg) -> int:
    """Response tokens a row keeps: max_response_length, and with max_length (TRL's) at most what is
    left of it after the prompt's `prompt_tokens`, at least 1."""
    total = cfg.max_length
    if total is None:
        return cfg.max_response_length
    return max(1, min(cfg.max_response_length, total - prompt_tokens))


def encode_rows(tok, records: list[dict], responses: list[str], cfg, what: str = "a response") -> Rollout:
    """One row per (record's prompt, response). Each response ends with the end-of-turn token, so the
    model also learns where to stop. Prompts keep their last max_prompt_length tokens, responses their
    first max_response_length (and with max_length, at most max_length minus the prompt's, `response_budget`)."""
    texts = format_prompts(tok, [r.get("messages") or r["prompt"] for r in records], cfg)
    queries, encoded = [], []
    for text, response in zip(texts, responses):
        ex = tokenize_sft_example(tok, text, text + response + end_of_turn(tok))
        n = sum(1 for label in ex["labels"] if label == -100)
        queries.append(ex["input_ids"][:n][-cfg.max_prompt_length:])
        encoded.append(ex["input_ids"][n:][: response_budget(len(queries[-1]), cfg)])
    if any(not r for r in encoded):
        raise DataError(f"{what} tokenises to nothing")
    P, R, pad = max(map(len, queries)), max(map(len, encoded)), tok.pad_token_id
    q_ids = torch.tensor([[pad] * (P - len(q)) + q for q in queries], device=HOST)  # (N, P)
    q_mask = torch.tensor([[0] * (P - len(q)) + [1] * len(q) for q in queries], device=HOST)
    r_ids = torch.tensor([r + [pad] * (R - len(r)) for r in encoded], device=HOST)  # (N, R)
    r_mask = torch.tensor([[1.0] * len(r) + [0.0] * (R - len(r)) for r in encoded], device=HOST)
    return Rollout(query_ids=q_ids, query_mask=q_mask, response_ids=r_ids, response_mask=r_mask,
                   stopped=torch.ones(len(encoded), dtype=torch.bool, device=HOST))


def check_prompt_lengths(tok, pair_sets: list[list[dict]], cfg) -> None:
    """Prompts longer than max_prompt_length: one warning with the count (they keep their end), or a
    DataError naming the first one (prompt_overflow=error)."""
    groups = [(format_prompts(tok, [p.get("messages") or p["prompt"] for p in pairs], cfg), getattr(pairs, "where", None))
              for pairs in pair_sets]
    enforce_prompt_limit(tok, groups, cfg.max_prompt_length, cfg.prompt_overflow, f"max_prompt_length={cfg.max_prompt_length}")


def pair_lengths(data: Rollout, share_prompts: bool) -> torch.Tensor:
    """(N,) the length that sets a pair's padded width: its longer response when the prompt runs once
    per pair (responses then carry most of the padding: two rows each), else prompt + that response."""
    n = data.response_ids.shape[0] // 2
    response = data.response_mask.sum(1)
    longer = torch.maximum(response[:n], response[n:]).long()
    return longer if share_prompts else data.query_mask[:n].sum(1) + longer


# ----------------------------------------------------------------------------- batches and chunks


def plan_batches(n_pairs: int, cfg, generator: torch.Generator, world: int = 1,
                 lengths: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Pair indices of every optimiser step: a fresh shuffle per epoch, cut at max_steps. With
    `world` processes an epoch's last, short batch is cut to a multiple of `world`, so that every
    process gets as many pairs (and runs as many backward passes) as the others.

    Given `lengths` (pair_lengths), each batch is ordered longest first, so its micro-batches hold
    pairs of similar length and pad less. A step's pairs and its summed gradient stay the same."""
    batches = []
    for _ in range(cfg.epochs):
        perm = torch.randperm(n_pairs, generator=generator, device=generator.device)
        cut = [perm[i : i + cfg.batch_size] for i in range(0, n_pairs, cfg.batch_size)]
        batches += [b[: len(b) // world * world] for b in cut if len(b) >= world]
    if lengths is not None:
        batches = [b[torch.argsort(lengths[b], descending=True, stable=True)] for b in batches]
    return batches[: cfg.max_steps] if cfg.max_steps else batches


def should_precompute(cfg, n_pairs: int, n_steps: int) -> bool:
    """Precompute costs one reference pass per pair in the data set; on the fly costs one per pair
    visited. So precompute when the run visits at least as many pairs as the data set holds."""
    if cfg.precompute_ref_logps is not None:
        return cfg.precompute_ref_logps
    return n_steps * cfg.batch_size >= n_pairs


def pair_rows(idx: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """Table rows of pairs `idx`: their chosen rows, then their rejected rows."""
    return torch.cat([idx, idx + n_pairs])


def pair_chunks(idx: torch.Tensor, data: Rollout, device, budget: int) -> list[torch.Tensor]:
    """One micro-batch's pairs `idx` in contiguous chunks of at most `budget` positions (a
    pair runs its chosen and rejected row, its prompt once) on the CPU (rollout/logprobs.py
    `row_chunks`): the loss is a sum over pairs, so chunks add up to the micro-batch's gradient while
    their activations stay bounded. Pure in its inputs: the reference table, the steps and the
    held-out pass cut alike."""
    n = data.response_ids.shape[0] // 2
    return row_chunks(idx, data, chunk_positions(device, budget), to_rows=lambda pairs: pair_rows(pairs, n))


def micro_pair_chunks(pairs: torch.Tensor, micro_batch_size: int, data: Rollout, device, budget: int) -> list[tuple]:
    """(pair indices, columns) of each chunk of `pairs` cut into micro-batches of `micro_batch_size`
    pairs, each cut into `pair_chunks`; columns: the rows of the chunk's micro-batch (`pair_rows`),
    which set its padded width."""
    n = data.response_ids.shape[0] // 2
    return [(c, pair_rows(micro, n)) for m0 in range(0, len(pairs), micro_batch_size)
            for micro in [pairs[m0 : m0 + micro_batch_size]] for c in pair_chunks(micro, data, device, budget)]


def all_pair_chunks(data: Rollout, cfg, device) -> list[tuple]:
    """`micro_pair_chunks` of every pair of a table in order (the held-out passes)."""
    n = data.response_ids.shape[0] // 2
    return micro_pair_chunks(torch.arange(n, device=HOST), cfg.micro_batch_size, data, device, cfg.cpu_chunk_positions)


def all_row_chunks(data: Rollout, cfg, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(chunk rows, micro-batch rows) of every row of a table in order (rollout/logprobs.py
    `micro_batch_chunks`): the row-level cut of the unpaired trainers."""
    rows = torch.arange(data.response_ids.shape[0], device=data.response_ids.device)
    return micro_batch_chunks(rows, cfg.micro_batch_size, data, device, cfg.cpu_chunk_positions)


# ----------------------------------------------------------------------------- log-probs


def sequence_logps(model, data: Rollout, rows: torch.Tensor, cfg, device,
                   columns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of response-token log-probs, response lengths), one per row; with grad. `columns`: the
    micro-batch's rows, whose trimmed columns a chunk keeps (rollout/logprobs.py `rows_of`)."""
    mb = rows_of(data, rows, columns)
    with autocast(cfg.dtype, device):
        lp, _, _ = forward_logprobs(model, mb, 1.0, with_values=False)
    return lp.sum(1), mb.response_mask.sum(1).to(device)


@torch.no_grad()
def reference_logps(reference, data: Rollout, rows: torch.Tensor, cfg, device,
                    columns: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of response-token log-probs under the reference, one per row (on `device`). `columns`: as
    in sequence_logps."""
    mb = rows_of(data, rows, columns)
    with autocast(cfg.dtype, device):
        lp = reference.logprobs(mb.input_ids.to(device), mb.attention_mask.to(device), mb.response_ids.to(device),
                                mb.response_mask.to(device))
    return lp.sum(1)


def reference_table(reference, data: Rollout, chunks: list[tuple], cfg, device,
                    to_rows=lambda idx: idx) -> torch.Tensor:
    """(rows of `data`,) reference log-probs on the CPU, filled chunk by chunk: `chunks` are (indices,
    columns) pairs and `to_rows` maps a chunk's indices to its table rows (`pair_rows` for pairs)."""
    table = torch.zeros(data.response_ids.shape[0], device=HOST)
    for idx, columns in chunks:
        rows = to_rows(idx)
        table[rows] = reference_logps(reference, data, rows, cfg, device, columns).cpu()
    return table


def row_reference_table(reference, data: Rollout, cfg, device) -> torch.Tensor:
    """`reference_table` of every row of `data`, cut as `all_row_chunks` (the unpaired trainers)."""
    return reference_table(reference, data, all_row_chunks(data, cfg, device), cfg, device)


def batch_reference(ref_table, reference, data: Rollout, rows: torch.Tensor, cfg, device,
                    columns: torch.Tensor | None = None):
    """Reference log-probs of `rows`: from the precomputed table, computed now, or None (reference-free)."""
    if ref_table is not None:
        return ref_table[rows].to(device)
    return None if reference is None else reference_logps(reference, data, rows, cfg, device, columns)
