"""The clipped policy update every on-policy trainer (PPO, GRPO, RLOO) runs, and the metrics
they share.

`update_policy` owns epochs x mini-batches x micro-batches, the global normalisers, gradient
accumulation, clipping and the first-micro-batch ratio check; a trainer supplies only `loss_fn`,
its loss for one micro-batch.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable

import torch

from rlhfkit.algos import masked_mean
from rlhfkit.errors import UserError
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.logprobs import CHUNK_POSITIONS, micro_batch_chunks, rows_of
from rlhfkit.runtime.accumulate import accumulate
from rlhfkit.runtime.distributed import max_over_processes, sum_over_processes
from rlhfkit.runtime.faults import NonFiniteGuard, guarded_step

# loss_fn(micro_batch, n_tokens=global token count, n_seqs=global sequence count) -> (loss, stats). Stats named
# "loss/..." are already normalised by the global counts (they add up over micro-batches); the
# others are token means of this micro-batch and must include "ratio_dev" = max |ratio - 1|. Stats
# are 0-d tensors (or floats), read on the host once per optimiser step (`read_on_host`).
LossFn = Callable[[Rollout, float, float], tuple[torch.Tensor, dict[str, float]]]


class RatioCheckError(UserError):
    """The first-micro-batch ratio is not 1: log-prob reconstruction is broken (docs/pitfalls.md#off-by-one).
    A UserError so the CLI prints it as one line with exit code 2 (usually a setting to fix)."""



def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """rollout/* metrics every RL trainer logs (rewards = per-token shaped rewards)."""
    mask = rollout.response_mask
    per_seq_reward = (rollout.rewards * mask).sum(1)
    return {
        "rollout/reward_mean": per_seq_reward.mean().item(),
        "rollout/reward_std": per_seq_reward.std(unbiased=False).item(),
        "rollout/score_mean": rollout.scores.mean().item(),
        "rollout/score_std": rollout.scores.std(unbiased=False).item(),
        "rollout/response_length": mask.sum(1).mean().item(),
        "rollout/stop_fraction": rollout.stopped.float().mean().item(),
        **({} if rollout.entropy is None else {"rollout/entropy": masked_mean(rollout.entropy, mask).item()}),
        **env_metrics(rollout),
        **rollout.timings,
    }


def env_rates(info: dict) -> dict[str, float]:
    """Tool use from a multi-turn rollout's per-episode info lists: the share of episodes with a tool
    call, and the share of tool calls that failed (0 without calls). {} for other rollouts."""
    calls, errors = info.get("tool_calls", []), info.get("tool_errors", [])
    if not calls:
        return {}
    return {"tool_call_rate": sum(c > 0 for c in calls) / len(calls),
            "tool_error_rate": sum(errors) / max(sum(calls), 1)}


def env_metrics(rollout: Rollout) -> dict[str, float]:
    """Multi-turn rollouts only (rollout/multiturn.py): model turns per episode, the share of episodes
    that called a tool, the share of tool calls that failed, environment tokens per episode."""
    if rollout.context_mask is None or "turns" not in rollout.info:
        return {}
    turns = rollout.info["turns"]
    rates = env_rates(rollout.info)
    return {"rollout/turns_mean": sum(turns) / max(len(turns), 1),
            "rollout/tool_call_rate": rates.get("tool_call_rate", 0.0),
            "rollout/tool_error_rate": rates.get("tool_error_rate", 0.0),
            "rollout/env_tokens_mean": (rollout.context_mask - rollout.response_mask).sum(1).mean().item()}


def shuffled_rows(n_rows: int, generator: torch.Generator, group_size: int = 1,
                  mini_batch_size: int | None = None) -> torch.Tensor:
    """A random order of `n_rows` rows (`torch.randperm`, draw for draw). With group_size G > 1 the
    rows of each mini-batch are then sorted by their group (G consecutive rows share a prompt):
    the same rows in the same mini-batches, so the same optimisation, but each micro-batch holds
    few distinct prompts, and each runs once (models/shared_prompts.py)."""
    perm = torch.randperm(n_rows, generator=generator, device=generator.device)
    if group_size == 1:
        return perm
    chunks = perm.split(mini_batch_size or n_rows)
    return torch.cat([c[torch.argsort(c // group_size, stable=True)] for c in chunks])


def update_policy(model, optimizer, scheduler, accelerator, rollout: Rollout, loss_fn: LossFn, *, epochs: int,
                  mini_batch_size: int, micro_batch_size: int, max_grad_norm: float, ratio_check_tol: float,
                  generator: torch.Generator, first_perm: torch.Tensor, guard: NonFiniteGuard | None = None,
                  where: str = "", group_size: int = 1, chunk_budget: int = CHUNK_POSITIONS) -> dict[str, float]:
    """`epochs` x shuffled mini-batches x micro-batches; one optimiser step per mini-batch.

    `first_perm` is epoch 0's shuffle, the one the scoring pass grouped its micro-batches by, so
    the first micro-batch repeats that pass exactly and its ratio must be 1 (else RatioCheckError).
    Each micro-batch loss is normalised by the whole mini-batch's token and sequence counts, summed
    over processes, so the accumulated gradient does not depend on the split (docs/pitfalls.md#loss-aggregation) nor on
    the number of processes: N processes x b rows give the update of 1 process x N*b rows.
    With group_size > 1 the rows of a mini-batch are ordered by group (`shuffled_rows`).
    A step whose loss or gradient norm is non-finite is skipped (`guarded_step`; `guard` counts
    them, `where` names the iteration in its messages).
    Returns the stats of all processes averaged over optimiser steps, plus "grad_norm" (before
    clipping), "ratio_first_microbatch_maxdev" and "skipped_steps".
    """
    device = accelerator.device
    B = rollout.response_ids.shape[0]
    sums: dict[str, float] = defaultdict(float)
    n_steps = skipped = 0
    first_dev = None
    for epoch in range(epochs):
        perm = first_perm if epoch == 0 else shuffled_rows(B, generator, group_size, mini_batch_size)
        for start in range(0, B, mini_batch_size):
            mini = perm[start : start + mini_batch_size]
            # Global token and sequence counts of this mini-batch (all micro-batches, all processes).
            counts = torch.tensor([rollout.response_mask[mini].sum().item(), float(len(mini))], device=device)
            n_tok, n_seq = (max(float(c), 1.0) for c in accelerator.reduce(counts, "sum"))
            # a long micro-batch runs in row chunks, cut as the scoring pass cut it (bounded activations);
            # cut, weighed and moved to the device before the loop, which then never waits for the device
            chunks = micro_batch_chunks(mini, micro_batch_size, rollout, device, chunk_budget)
            micro = [rows_of(rollout, rows, m) for rows, m in chunks]
            shares = [mb.response_mask.sum().item() / n_tok for mb in micro]  # of the mini-batch's tokens
            # forward and backward of each micro-batch, no host synchronisation in between (no .item(),
            # no Python branch on a device value): the device runs ahead of Python; one host read after
            stats = read_on_host(accumulate(accelerator, model, [mb.to(device) for mb in micro],
                                            functools.partial(loss_fn, n_tokens=n_tok, n_seqs=n_seq)))
            if first_dev is None:  # the largest of all processes, so they all raise or none does
                first_dev = max_over_processes(accelerator, stats[0]["ratio_dev"])
                check_first_ratio(first_dev, ratio_check_tol)
            for w, st in zip(shares, stats):
                for k, v in st.items():
                    if k != "loss":
                        sums[k] += v if k.startswith("loss/") else v * w
            mini_loss = sum(st["loss"] for st in stats)
            grad_norm, skip = guarded_step(model.parameters(), optimizer, scheduler, accelerator, max_grad_norm,
                                           loss=mini_loss, guard=guard, where=f"{where}optimiser step {n_steps + 1}")
            sums["grad_norm"] += grad_norm
            n_steps += 1
            skipped += skip
    # loss/* are global sums already split over processes, the other stats token-weighted shares of
    # the global count: summed over processes both are the global values (grad_norm already is).
    sums = sum_over_processes(accelerator, sums, keep=("grad_norm",))
    out = {k: v / n_steps for k, v in sums.items()}
    out["ratio_first_microbatch_maxdev"] = float(first_dev)
    out["skipped_steps"] = float(skipped)
    return out


def read_on_host(stats: list[dict[str, torch.Tensor | float]]) -> list[dict[str, float]]:
    """`stats` with every tensor read as a Python float, all in one host read (one synchronisation
    per optimiser step). float64 holds any float32 or bf16 value exactly: the floats equal `.item()`'s."""
    tensors = [v for st in stats for v in st.values() if isinstance(v, torch.Tensor)]
    if not tensors:
        return stats
    device = tensors[0].device
    values = iter(torch.stack([t.to(device=device, dtype=torch.float64) for t in tensors]).tolist())
    return [{k: next(values) if isinstance(v, torch.Tensor) else v for k, v in st.items()} for st in stats]


def check_first_ratio(max_dev: float, tol: float) -> None:
    """RatioCheckError when the first micro-batch's max |ratio - 1| exceeds `tol`."""
    if max_dev > tol:
        raise RatioCheckError(
            f"max |ratio - 1| = {max_dev:.3g} on the first micro-batch (tolerance {tol}): log-prob "
            "reconstruction is broken (check padding, position ids, temperature, dropout)")


def policy_update_metrics(m: dict[str, float]) -> dict[str, float]:
    """The metric names PPO and GRPO share, from `update_policy`'s averaged stats."""
    return {
        "loss/policy": m["loss/policy"], "loss/total": m["loss/total"],
        "params/policy_clip_frac": m["policy_clip_frac"], "params/approx_kl": m["approx_kl"],
        "params/ratio_mean": m["ratio_mean"], "params/grad_norm": m["grad_norm"],
        "params/ratio_first_microbatch_maxdev": m["ratio_first_microbatch_maxdev"],
        "params/skipped_steps": m["skipped_steps"],
    }
