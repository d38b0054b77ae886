"""Steps 1-3 of the GRPO family (trainers/grpo.py) beyond one plain draw: DAPO's dynamic sampling,
overlong shaping and filtering, and ReMax's greedy baseline. The advantage estimators themselves are
in grpo_variants.py.

Dynamic sampling (Yu et al. 2025, DAPO): a group whose G completions all got the same reward has
advantage 0 and carries no gradient. Rounds of `prompts_per_iteration` fresh prompts are drawn
until the batch holds that many groups with a reward spread, at most `max_sampling_rounds` rounds;
the first groups found are kept, in the order they were drawn. With several processes all stop
together and every process keeps as many groups as the process that found the fewest: the count
is compared across processes after each round (they must run the same optimiser steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlhfkit.algos import overlong_penalty, shape_rewards
from rlhfkit.algos.masks import last_valid_index
from rlhfkit.rollout import Rollout
from rlhfkit.runtime.distributed import max_over_processes
from rlhfkit.trainers.rl import sample_rollout

# draw(round) -> (rollout with rewards and advantages, its metrics)
Draw = Callable[[int], tuple[Rollout, dict[str, float]]]


def keep_rows(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """Rows `rows` of a rollout, texts and reward info included."""
    idx = rows.tolist()
    return dataclasses.replace(rollout.select(rows), prompts=[rollout.prompts[i] for i in idx],
                               completions=[rollout.completions[i] for i in idx],
                               info={k: [v[i] for i in idx] for k, v in rollout.info.items()})


def shaped_rewards(rollout: Rollout, cfg) -> torch.Tensor:
    """(B, R) per-token rewards: the score (after score_clip and no_stop_penalty) plus DAPO's overlong
    punishment (`overlong_buffer` > 0) on the last valid token, 0 elsewhere. Multi-turn: the score is
    the episode's summed rewards, on the last model token (the loss masks environment tokens). No KL: the GRPO family
    puts it in the loss (beta) or, for REINFORCE++, adds it after the log-prob pass (grpo_variants.py)."""
    mask = rollout.response_mask
    zeros = torch.zeros_like(mask)
    rewards, _ = shape_rewards(rollout.scores, zeros, zeros, mask, 0.0, stopped=rollout.stopped,
                               no_stop_penalty=cfg.no_stop_penalty, score_clip=cfg.score_clip)
    if cfg.overlong_buffer > 0:
        pen = overlong_penalty(mask.sum(1), cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
        rewards = rewards.scatter_add(1, last_valid_index(mask != 0).unsqueeze(1), pen.unsqueeze(1).to(rewards.dtype))
    return rewards


def sequence_rewards(rollout: Rollout) -> torch.Tensor:
    """(B,) each completion's reward: the sum of its per-token rewards (0 on padding, so a response
    mask zeroed later by the overlong filter does not change it)."""
    return rollout.rewards.sum(1)


def completion_groups(rollout: Rollout, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(first (C,): the row that stands for each completion, group (C,): its group), C completions.
    Rows in consecutive groups of G: every row is a completion, row // G its group. Rows of agent
    episodes (`info["episode"]`: each row's episode number, episodes in groups of G by number; an
    episode may give several rows or, failed, none; its rows carry its reward): one completion per
    episode that has rows, its first row, episode // G its group."""
    device = rollout.response_mask.device
    episode = rollout.info.get("episode")
    if episode is None:
        rows = torch.arange(rollout.response_mask.shape[0], device=device)
        return rows, rows // group_size
    first: dict[int, int] = {}
    for b, e in enumerate(episode):
        first.setdefault(int(e), b)
    numbers = sorted(first)
    return (torch.tensor([first[e] for e in numbers], dtype=torch.long, device=device),
            torch.tensor([e // group_size for e in numbers], dtype=torch.long, device=device))


def row_completions(rollout: Rollout) -> torch.Tensor:
    """(B,) each row's completion (index into `completion_groups`' lists): the row itself, or its episode's."""
    device = rollout.response_mask.device
    episode = rollout.info.get("episode")
    if episode is None:
        return torch.arange(rollout.response_mask.shape[0], device=device)
    numbers = sorted({int(e) for e in episode})
    index = {e: i for i, e in enumerate(numbers)}
    return torch.tensor([index[int(e)] for e in episode], dtype=torch.long, device=device)


def consecutive(group: torch.Tensor, group_size: int) -> bool:
    """Whether completion c's group is c // G for every c and every group is full (full groups in order)."""
    return group.numel() % group_size == 0 and torch.equal(group, torch.arange(group.numel(), device=group.device)
                                                           // group_size)


def group_estimate(estimator: Callable, seq: torch.Tensor, group: torch.Tensor, group_size: int,
                   scale: bool) -> torch.Tensor:
    """(C,) a group estimator (algos registry: group, rloo) of completion rewards `seq` (C,) within each
    group (`completion_groups`); a group left with one completion gets 0."""
    if consecutive(group, group_size):
        return estimator(seq, group_size, None, scale)
    out = torch.zeros_like(seq)
    for g in group.unique().tolist():
        idx = (group == g).nonzero().squeeze(1)
        if idx.numel() >= 2:
            out[idx] = estimator(seq[idx], idx.numel(), None, scale)
    return out


def group_std(seq: torch.Tensor, group: torch.Tensor, group_size: int) -> torch.Tensor:
    """(groups,) the unbiased std of each group's completion rewards (0 for a group of one)."""
    if consecutive(group, group_size):
        return seq.view(-1, group_size).std(dim=1)
    return torch.stack([seq[group == g].std() if int((group == g).sum()) > 1 else torch.zeros((), device=seq.device)
                        for g in group.unique().tolist()])


def varied_rows(rollout: Rollout, seq_reward: torch.Tensor, group_size: int) -> torch.Tensor:
    """Rows (indices) of the groups whose completions' rewards are not all equal. seq_reward: (B,) per row."""
    first, group = completion_groups(rollout, group_size)
    seq = seq_reward[first]
    n = int(group.max()) + 1 if group.numel() else 0
    hi = torch.full((n,), float("-inf"), device=seq.device).scatter_reduce(0, group, seq, "amax")
    lo = torch.full((n,), float("inf"), device=seq.device).scatter_reduce(0, group, seq, "amin")
    varied = (hi > lo)[group]  # (C,)
    return varied[row_completions(rollout)].nonzero().squeeze(1)


def varied_groups(seq_reward: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B/G,) bool: the groups whose rewards are not all equal. seq_reward: (B,) in consecutive groups."""
    g = seq_reward.view(-1, group_size)
    return (g != g[:, :1]).any(1)


# ----------------------------------------------------------------------------- dynamic sampling


def fill_groups(draw: Draw, group_size: int, target: int, max_rounds: int,
                fewest: Callable[[int], int]) -> tuple[list[Rollout], list[Rollout], list[dict], int]:
    """DAPO's dynamic sampling loop. `draw(r)` samples round r; `fewest(n)` is the smallest n over all
    processes (n itself with one process). Stops when every process has `target` groups with a
    reward spread, or after `max_rounds` rounds. Returns (the varied groups of each round, every
    round's rollout, every round's metrics, groups to keep per process = min(target, fewest))."""
    kept, sampled, metrics = [], [], []
    found = 0
    for r in range(max_rounds):
        rollout, m = draw(r)
        sampled.append(rollout)
        metrics.append(m)
        varied = varied_groups(sequence_rewards(rollout), group_size)
        if varied.any():
            kept.append(keep_rows(rollout, varied.repeat_interleave(group_size).nonzero().squeeze(1)))
            found += int(varied.sum())
        if fewest(found) >= target:
            break
    return kept, sampled, metrics, min(target, fewest(found))


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """The rows of `parts` in order, prompts left-padded and responses right-padded to the widest
    (log-probs, rewards, advantages: 0 on the new padding; sampler log-probs: NaN)."""
    P = max(p.query_ids.shape[1] for p in parts)
    R = max(p.response_ids.shape[1] for p in parts)
    fill = {"query_ids": pad_id, "response_ids": pad_id, "sampler_logprobs": float("nan")}
    kw: dict = {}
    for f in dataclasses.fields(Rollout):
        values = [getattr(p, f.name) for p in parts]
        if f.name in ("prompts", "completions"):
            kw[f.name] = [x for v in values for x in v]
        elif f.name in ("info", "reward_parts"):  # per-sample lists by name
            kw[f.name] = {k: [x for v in values for x in v[k]] for k in values[0]}
        elif f.name == "timings":
            kw[f.name] = {k: sum(v.get(k, 0.0) for v in values) for k in values[0]}
        elif any(v is None for v in values) or f.name == "trunk":
            kw[f.name] = None
        elif values[0].dim() == 1:
            kw[f.name] = torch.cat(values)
        else:
            value, left = fill.get(f.name, 0), f.name.startswith("query")
            kw[f.name] = torch.cat([F.pad(v, ((P - v.shape[1], 0) if left else (0, R - v.shape[1])), value=value)
                                    for v in values])
    return Rollout(**kw)


def dynamic_batch(rl, cfg, draw: Draw) -> tuple[Rollout, Rollout, dict[str, float]]:
    """(the batch to train on: `prompts_per_iteration` groups with a reward spread or fewer at the
    cap, everything sampled, metrics). The per-round metrics are means over equal-sized rounds, so
    their mean is the mean over everything sampled."""
    G, target = cfg.group_size, cfg.prompts_per_iteration
    acc = rl.accelerator
    kept, sampled, per_round, n = fill_groups(draw, G, target, cfg.max_sampling_rounds,
                                              lambda c: -int(max_over_processes(acc, -c)))
    everything = concat_rollouts(sampled, rl.tok.pad_token_id)
    batch = concat_rollouts(kept, rl.tok.pad_token_id) if kept else everything
    batch = keep_rows(batch, torch.arange(n * G, device=batch.response_ids.device))
    metrics = {k: sum(m[k] for m in per_round) / len(per_round) for k in per_round[0]}
    metrics.update({"rollout/sampling_rounds": float(len(sampled)), "rollout/kept_groups": float(n),
                    "rollout/extra_samples": float((len(sampled) - 1) * cfg.rollout_batch_size)})
    return batch, everything, metrics


def greedy_scores(rl, cfg, records: list[dict]) -> torch.Tensor:
    """ReMax's baseline: the shaped reward of each record's greedy completion, (len(records),)."""
    params = dataclasses.replace(rl.params, temperature=0.0)  # temperature 0: greedy decoding
    with rl.tracker.phase("greedy baseline", None), rl.full_weights():
        greedy = sample_rollout(rl.core, rl.tok, records, cfg, params, 0, rl.reward_fn, rl.device, rl.backend,
                                rl.make_env)  # with an env: greedy episodes
    return sequence_rewards(dataclasses.replace(greedy, rewards=shaped_rewards(greedy, cfg)))


# ----------------------------------------------------------------------------- after the log-prob pass


def filter_overlong(rollout: Rollout) -> tuple[Rollout, float]:
    """DAPO's overlong filtering: (the rollout with the response masks of completions cut at the
    length limit (no stop token) set to 0, so they add no loss and no token to the normaliser; they
    keep their row (and their place in their group's baseline, computed before); their share of the rows)."""
    cut = ~rollout.stopped.bool()
    mask = rollout.response_mask * (~cut).to(rollout.response_mask.dtype)[:, None]
    return dataclasses.replace(rollout, response_mask=mask), (cut.float().mean().item() if cut.numel() else 0.0)
