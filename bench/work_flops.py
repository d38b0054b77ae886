"""The least model arithmetic a GRPO rollout or a DPO step needs, for the FLOP floors of
bench/bench_grpo_dpo.py (how far a CPU speed-up target is from the hardware).

Counted by rlhfkit.estimate.flops (its docstring has the rules) on unpadded lengths, with a prompt shared
by several rows run once (rlhfkit's share_prompts), the prefix every prompt of a forward call shares (a
chat template's header) run once per call (share_prefix), LoRA adapters merged while sampling, a sampled
row's decode ending at its last token. Anything a trainer does beyond this (padding, a prompt run per
row, logits at prompt positions, rows that keep decoding after they stopped) is extra work, so
`work / peak` is a floor neither trainer can beat on that machine at that micro-batch size.
"""

from __future__ import annotations

from collections import defaultdict

from rlhfkit.estimate.flops import forward_flops, shape_of, train_flops


def prompt_groups(query_ids, query_mask, response_mask) -> list[tuple[int, list[int]]]:
    """(prompt length, response lengths of its rows) for each distinct prompt of a batch.

    query_ids, query_mask: (B, P) left-padded prompts; response_mask: (B, R)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for ids, q, r in zip(query_ids.tolist(), query_mask.tolist(), response_mask.sum(1).tolist()):
        groups[tuple(i for i, m in zip(ids, q) if m)].append(int(r))
    return [(len(prompt), lengths) for prompt, lengths in groups.items()]


def common_prefix(query_ids, query_mask) -> int:
    """Leading tokens every left-padded prompt of (B, P) `query_ids` starts with."""
    prompts = [[i for i, m in zip(ids, mask) if m] for ids, mask in zip(query_ids.tolist(), query_mask.tolist())]
    n = min(map(len, prompts), default=0)
    return next((k for k in range(n) if any(p[k] != prompts[0][k] for p in prompts)), n)


def teacher_forced(shape, groups, lora_r: int | None, lora_layers: int | None, train: bool, prefix: int = 0,
                   calls: int = 1, layers: int | None = None) -> int:
    """FLOPs of a teacher-forced forward (and backward when `train`) over `groups`, each prompt once:
    its rows' sequences counted whole, less (rows - 1) runs of the prompt alone. The prompt's own
    projections and attention are the part rows share; a response's attention to the prompt stays in.
    `prefix`: tokens every prompt starts with, run once per forward call (`calls` of them, each holding
    at least one prompt) rather than once per prompt. `layers`: the forward runs the top this many
    layers only (the frozen trunk's output reused; None: all). `lora_r`: LoRA rank, None for full
    fine-tuning (every weight trains)."""
    def count(seqs: list[int], head: int) -> int:
        if train:
            return train_flops(shape, seqs, head, lora_r=lora_r, lora_layers=lora_layers, forward_layers=layers)["total"]
        return forward_flops(shape, seqs, head, layers=layers, lora_r=lora_r or 0, lora_layers=lora_layers)

    total = 0
    for prompt, lengths in groups:
        total += count([prompt + r for r in lengths], sum(lengths)) - (len(lengths) - 1) * count([prompt], 0)
    return total - max(len(groups) - calls, 0) * count([prefix], 0)


def sampling(shape, groups, prefix: int = 0, calls: int = 1) -> int:
    """FLOPs of sampling every row's response with a KV cache: each prompt's prefill once (its
    logits at the last position: the first new token), the shared `prefix` once per generate call,
    then one decode step per further token of each row, attending to the prompt and the tokens before it."""
    s = shape_of(shape)
    per_pair = 4 * s.heads * s.d  # attention FLOPs per (query, key) pair and layer
    per_token = forward_flops(s, [1], 1) - s.layers * per_pair  # projections and head of one new token
    total = 0
    for prompt, lengths in groups:
        total += forward_flops(s, [prompt], 1)
        for r in lengths:  # steps t = 1 .. r - 1; step t's query sees prompt + t keys
            steps = max(r - 1, 0)
            total += steps * per_token + s.layers * per_pair * (steps * prompt + steps * (steps + 1) // 2)
    return total - max(len(groups) - calls, 0) * forward_flops(s, [prefix], 0)


def grpo_rollout(shape, sampled, updated, lora_r: int | None, lora_layers: int | None, epochs: int, prefix: int = 0,
                 generate_calls: int = 1, micro_batches: int = 1, with_pass: bool = True) -> dict[str, int]:
    """{'sampling', 'log-prob pass', 'update', 'total'} of one GRPO rollout: `sampled` and `updated` are
    prompt_groups of the rows sampled and of the rows updated (beta 0: no reference pass); `prefix`: the
    tokens all prompts share, run once per generate call and per micro-batch of the passes; `with_pass`:
    whether the log-prob pass ran (not for an exactly on-policy update)."""
    out = {"sampling": sampling(shape, sampled, prefix, generate_calls),
           "log-prob pass": (teacher_forced(shape, updated, lora_r, lora_layers, False, prefix, micro_batches)
                             if with_pass else 0),
           "update": epochs * teacher_forced(shape, updated, lora_r, lora_layers, True, prefix, micro_batches)}
    return {**out, "total": sum(out.values())}


def dpo_step(shape, micro_batches, lora_r: int, lora_layers: int | None) -> int:
    """FLOPs of one DPO optimiser step with the reference precomputed: per micro-batch a forward and
    backward over each pair's prompt (once) and its two responses, the prefix its prompts share once.
    `micro_batches`: (prefix, [(prompt, chosen, rejected) lengths of its pairs])."""
    return sum(teacher_forced(shape, [(p, [c, r]) for p, c, r in pairs], lora_r, lora_layers, True, prefix)
               for prefix, pairs in micro_batches)
