"""`rlhfkit dpo`, `simpo`, `orpo`: preference optimisation on pairs: DPO, IPO and cDPO against a
reference; SimPO and ORPO without one (no reference is built, step 2 is skipped).

As numbered steps in `train`:
  1. data       pairs (prompt, chosen, rejected) -> one tokenised table of 2N rows, chosen i and
                rejected N + i, in PPO's Rollout layout (left-padded prompt, right-padded response)
  2. reference  sequence log-probs under pi_ref: the adapter-disabled base (LoRA), a frozen copy, or
                `reference_model`; computed once for the whole data set before training when the run
                sees every pair at least once (cheaper), else alongside each micro-batch
  3. before     the starting model's samples on held-out prompts, scored by the judge
  4. train      epochs x shuffled batches x micro-batches; loss = mean over the batch's pairs
  5. after      held-out preference accuracy, and the judged win rate over the starting model

Set-up, the optimiser step, the judged evaluation and the save are the offline harness's
(trainers/offline.py); tables, batches and log-probs are trainers/pairs.py's (PPO's teacher-forced
pass, rollout.forward_logprobs); the losses are chosen by name from trainers/pair_losses.py (algos'
dpo_loss, simpo_loss, orpo_loss). Formulas and defaults: docs/algorithms.md.
"""

from __future__ import annotations

import time

import torch

from rlhfkit.core.devices import HOST
from rlhfkit.data.prefs import load_pairs, load_preferences, resolve_prefs
from rlhfkit.rollout import Rollout
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.distributed import sum_over_processes
from rlhfkit.runtime.optim import optimizer_for
from rlhfkit.runtime.run import Launch
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.judged import eval_records, judged_after, judged_samples, win_rate
from rlhfkit.trainers.offline import OfflineRun, preference_models
from rlhfkit.trainers.pair_losses import pair_batch_loss as dpo_batch_loss
from rlhfkit.trainers.pairs import (
    all_pair_chunks,
    batch_reference,
    check_prompt_lengths,
    encode_pairs,
    micro_pair_chunks,
    pair_lengths,
    pair_rows,
    plan_batches,
    reference_logps,
    reference_table,
    sequence_logps,
    should_precompute,
)

__all__ = ["dpo_batch_loss", "encode_pairs", "eval_records", "judged_after", "judged_samples", "load_pairs",
           "pair_rows", "resolve_prefs", "sequence_logps", "train", "win_rate"]


def build_models(cfg: DPOConfig):
    """(policy-only ActorCritic, Reference (None for reference-free losses), tokenizer)."""
    return build_actor(cfg, with_reference=cfg.uses_reference, reference_model=cfg.reference_model)


# ----------------------------------------------------------------------------- reference


def precompute_reference(reference, data: Rollout, batches: list[torch.Tensor], cfg: DPOConfig, device,
                         world: int = 1) -> torch.Tensor:
    """Reference log-probs of all 2N rows, grouped like the first epoch's micro-batches on each
    process (so with LoRA, step 0 sees log pi == log pi_ref to the last bit and the loss is exactly
    log 2); pairs the first batches miss (cut for `world` processes) are computed after them."""
    n = data.response_ids.shape[0] // 2
    table, done = torch.zeros(2 * n, device=HOST), torch.zeros(n, dtype=torch.bool, device=HOST)

    def fill(pairs: torch.Tensor) -> None:
        pairs = pairs[~done[pairs]]
        for idx, columns in micro_pair_chunks(pairs, cfg.micro_batch_size, data, device, cfg.cpu_chunk_positions):
            rows = pair_rows(idx, n)
            table[rows] = reference_logps(reference, data, rows, cfg, device, columns).cpu()
        done[pairs] = True

    for batch in batches[: -(-n // cfg.batch_size)]:  # the first epoch, each process's share in turn
        for r in range(world):
            fill(batch[r::world])
    fill((~done).nonzero().squeeze(1))
    return table


def reference_tables(h: OfflineRun, reference, data: Rollout, held: Rollout | None, batches: list[torch.Tensor],
                     precompute: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Step 2: reference log-probs of the held-out pairs, and of every training pair when computing
    them once before training is cheaper (`precompute`: `should_precompute`; else None: per micro-batch)."""
    cfg, device = h.cfg, h.device
    if reference is None:  # reference-free loss (SimPO, ORPO)
        h.summary["precomputed_ref_logps"] = False
        return None, None
    held_ref = None
    if held is not None:
        n = held.response_ids.shape[0] // 2
        with reference.loaded(device):  # in micro-batches and chunks, as held_out_metrics runs the policy
            held_ref = reference_table(reference, held, all_pair_chunks(held, cfg, device), cfg, device,
                                       lambda idx: pair_rows(idx, n))
    ref_table = None
    if precompute:
        with h.tracker.phase("reference log-probs", None), reference.loaded(device):
            ref_table = precompute_reference(reference, data, batches, cfg, device, h.world)
    h.summary["precomputed_ref_logps"] = ref_table is not None
    return held_ref, ref_table


# ----------------------------------------------------------------------------- loss


def train_step(model, data: Rollout, batch: torch.Tensor, ref_table, reference, cfg: DPOConfig, accelerator) -> dict:
    """Gradients of one optimiser batch (this process's share, in micro-batches); returns metrics."""
    device, world, n = accelerator.device, accelerator.num_processes, data.response_ids.shape[0] // 2
    local = batch[accelerator.process_index :: world]

    def loss_fn(chunk: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        idx, columns = chunk
        rows = pair_rows(idx, n)
        logps, lengths = sequence_logps(model, data, rows, cfg, device, columns)
        ref = batch_reference(ref_table, reference, data, rows, cfg, device, columns)
        loss, st = dpo_batch_loss(logps, ref, lengths, cfg, float(len(batch)), cfg.rpo_alpha)  # / all processes' pairs
        return loss, {"loss/dpo": loss.item(), **{k: v * len(idx) / len(local) for k, v in st.items()}}

    sums = add_up(accumulate(accelerator, model, micro_pair_chunks(local, cfg.micro_batch_size, data, device, cfg.cpu_chunk_positions), loss_fn))
    sums = sum_over_processes(accelerator, sums)  # loss/dpo: the global loss; the others: x world
    return {k: v if k == "loss/dpo" else v / world for k, v in sums.items()}


def held_out_metrics(model, held: Rollout, held_ref: torch.Tensor | None, cfg: DPOConfig, device) -> dict[str, float]:
    """rewards/* and logps/* of the held-out pairs under the current policy."""
    n = held.response_ids.shape[0] // 2
    chosen, rejected = [], []  # (log-prob sums, lengths) of each chunk's chosen and rejected rows
    with torch.no_grad():  # in micro-batches and chunks, as training runs them (not all pairs at once)
        for idx, columns in all_pair_chunks(held, cfg, device):
            logps, lengths = sequence_logps(model, held, pair_rows(idx, n), cfg, device, columns)
            chosen.append((logps[: len(idx)], lengths[: len(idx)]))
            rejected.append((logps[len(idx) :], lengths[len(idx) :]))
        logps = torch.cat([lp for lp, _ in chosen + rejected])
        lengths = torch.cat([ln for _, ln in chosen + rejected])
        return dpo_batch_loss(logps, None if held_ref is None else held_ref.to(device), lengths, cfg, float(n),
                              cfg.rpo_alpha)[1]


# ----------------------------------------------------------------------------- loop


def train(cfg: DPOConfig) -> dict:
    """Run DPO; returns the summary (also written to RUN/summary.json)."""
    launch = Launch(cfg)
    device = launch.device
    # 1. data. Data, judge, model and prompt lengths are checked before the run folder exists.
    train_pairs, held_out = load_pairs(cfg.prefs, cfg.eval_split)
    if cfg.eval_data:  # TRL's eval_dataset: held-out pairs given apart
        held_out = load_preferences(resolve_prefs(cfg.eval_data))
    judge, model, reference, tok = preference_models(launch, build_models)
    check_prompt_lengths(tok, [train_pairs, held_out], cfg)
    data, N = encode_pairs(tok, train_pairs, cfg), len(train_pairs)
    held = encode_pairs(tok, held_out, cfg) if held_out else None
    batches = plan_batches(N, cfg, torch.Generator(device=HOST).manual_seed(cfg.seed), launch.world,
                           pair_lengths(data, model.share_prompts))
    precompute = reference is not None and should_precompute(cfg, N, len(batches))
    with OfflineRun(launch, getattr(type(cfg), "command", "dpo"), len(batches), model,
                    *optimizer_for(model.parameters(), cfg, len(batches)), epoch_size=N,
                    reference=None if precompute else reference,  # sharded like the policy when still in use
                    summary=dict(train_pairs=N, held_out_pairs=len(held_out))) as h:
        held_ref, ref_table = reference_tables(h, reference, data, held, batches, precompute)  # 2. reference
        reference = None if precompute else reference  # the table is all training needs: a copy's memory is freed
        records = eval_records(train_pairs, held_out, cfg) if cfg.num_eval_prompts > 0 else []
        h.judge_before(model, tok, records, judge)  # 3. the starting model, judged
        for step in h.steps():  # 4. train (the batches are planned from the seed: a resumed run starts further in)
            t0 = time.time()
            with h.reference_loaded(reference, device):
                metrics = train_step(h.model, data, batches[step], ref_table, reference, cfg, h.accelerator)
            metrics.update(h.optimizer_step(metrics["loss/dpo"], step))
            h.log(step, h.timed(metrics, t0))
        if held is not None:  # 5. after: held-out preference accuracy, judged win rate over the starting model
            h.held_out(held_out_metrics(model, held, held_ref, cfg, device), lambda m: "[eval] held-out pairs: "
                       f"preference accuracy {m['rewards/accuracy']:.1%}, reward margin {m['rewards/margin']:+.3f} "
                       f"(n={len(held_out)})")
        return h.finish_judged(model, tok, records, judge, bool(held_out))
