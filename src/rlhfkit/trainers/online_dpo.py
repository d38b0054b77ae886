"""`rlhfkit online-dpo`: online DPO with a judge (Guo et al. 2024, "Direct Language Model Alignment
from Online AI Feedback"): the preference pairs come from the policy being trained.

One iteration, as numbered steps in `train`:
  1. sample     prompts_per_iteration prompts, two completions each from the current policy (the RL
                harness's rollout, trainers/rl.py)
  2. judge      the judge scores both (a reward function, or a reward model with model:PATH); the
                higher score is chosen, the lower rejected; a tie gives no pair
  3. DPO step   one optimiser step of DPO's loss (trainers/pairs.py's log-probs and pair_losses.py's loss,
                temperature 1, reference = the adapter-disabled base with LoRA) over the pairs of all
                processes, in micro-batches; loss = mean over pairs
  4. log        rollout metrics, DPO's rewards/* and logps/*, rollout/pairs and rollout/tie_fraction
Before and after training: DPO's judged win rate over the starting model (trainers/judged.py).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from rlhfkit.algos import shape_rewards
from rlhfkit.rollout import Rollout
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.distributed import sum_over_processes
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.judged import judge_before, judged_after
from rlhfkit.trainers.online_dpo_config import OnlineDPOConfig
from rlhfkit.trainers.pair_losses import pair_batch_loss
from rlhfkit.trainers.pairs import micro_pair_chunks, pair_rows, reference_logps, sequence_logps
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import rollout_metrics


def build_models(cfg: OnlineDPOConfig):
    """(policy-only ActorCritic, Reference, tokenizer)."""
    return build_actor(cfg, with_reference=True)


def judge_pairs(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen rows, rejected rows) of completions laid out in pairs [2i, 2i + 1] with judge scores
    `scores` (2k,); pairs with equal scores are left out. Returns two (k',) long tensors."""
    s = scores.view(-1, 2)
    first = torch.arange(s.shape[0], device=scores.device) * 2
    keep = s[:, 0] != s[:, 1]
    first_wins = s[:, 0] > s[:, 1]
    chosen = torch.where(first_wins, first, first + 1)[keep]
    rejected = torch.where(first_wins, first + 1, first)[keep]
    return chosen, rejected


def dpo_step(rl: RLRun, cfg: OnlineDPOConfig, rollout: Rollout, chosen: torch.Tensor, rejected: torch.Tensor,
             it: int) -> dict[str, float]:
    """Step 3: one optimiser step over every process's pairs, normalised by their global count. A
    process whose pairs all tied still runs one micro-batch at weight 0, so that every process takes
    part in the gradient all-reduce. No step (and no loss metrics) when no process has a pair."""
    acc, device = rl.accelerator, rl.device
    k = len(chosen)
    total = sum_over_processes(acc, {"pairs": float(k)})["pairs"]
    if total == 0:
        return {}
    n = max(k, 1)
    rows = torch.cat([chosen, rejected]) if k else torch.tensor([0, 1], device=chosen.device)
    table = rollout.select(rows)  # [chosen.., rejected..], tensors only

    def loss_fn(chunk: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        idx, columns = chunk
        rows = pair_rows(idx, n)
        logps, lengths = sequence_logps(rl.model, table, rows, cfg, device, columns)
        ref = reference_logps(rl.reference, table, rows, cfg, device, columns)
        loss, st = pair_batch_loss(logps, ref, lengths, cfg, total)  # / all processes' pairs
        loss = loss * float(k > 0)
        # pair-weighted: summed over processes, divided by all pairs
        return loss, {"loss/dpo": loss.item(), **{name: v * len(idx) * float(k > 0) for name, v in st.items()}}

    pairs = torch.arange(n, device=table.response_ids.device)  # CPU: chunks of bounded activations, as in DPO
    with rl.reference.loaded(device):
        sums = add_up(accumulate(acc, rl.model, micro_pair_chunks(pairs, cfg.micro_batch_size, table, device,
                                                                          cfg.cpu_chunk_positions), loss_fn))
    sums = sum_over_processes(acc, sums)
    metrics = {name: v if name == "loss/dpo" else v / total for name, v in sums.items()}
    step = rl.optimizer_step(metrics["loss/dpo"], it)  # and trims the heap
    metrics.update({k: step[k] for k in ("params/grad_norm", "params/skipped_steps")})  # RLRun.log logs the lr
    return metrics


def judge_metrics(scores: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    n_pairs = scores.shape[0] // 2
    return {"rollout/pairs": float(len(chosen)), "rollout/tie_fraction": 1.0 - len(chosen) / max(n_pairs, 1),
            "rollout/judge_margin": (scores[chosen] - scores[rejected]).mean().item() if len(chosen) else 0.0}


def train(cfg: OnlineDPOConfig) -> dict:
    """Run online DPO; returns the summary (also written to RUN/summary.json)."""
    with RLRun(cfg, "online-dpo", build_models) as rl:
        judged: dict = {}  # the starting model's judged scores, kept in checkpoints
        rl.resume(judged=judged)
        judge_before(rl, rl.core, rl.tok, rl.eval_records, rl.reward_fn, judged)  # same seed as after: the same noise
        for it in rl.steps():
            t0 = time.time()
            prompts = [r for r in rl.stream.next(cfg.prompts_per_iteration) for _ in range(2)]
            rollout = rl.sample(prompts, it)  # step 1 (and the judge's scores: step 2)
            mask = rollout.response_mask
            rewards, _ = shape_rewards(rollout.scores, torch.zeros_like(mask), torch.zeros_like(mask), mask, 0.0)
            rollout = dataclasses.replace(rollout, rewards=rewards)
            chosen, rejected = judge_pairs(rollout.scores)
            metrics = {**judge_metrics(rollout.scores, chosen, rejected), **rollout_metrics(rollout)}
            t1 = time.time()
            metrics.update(dpo_step(rl, cfg, rollout, chosen, rejected, it))  # step 3
            rl.log_iteration(it, rollout, metrics, (t0, t1, time.time()))  # step 4
        judged_after(rl, rl.core, rl.tok, rl.eval_records, rl.reward_fn, judged.get("before"), rl.eval_from)
        return rl.finish()
