"""`rlhfkit ppo`: PPO with GAE for causal LMs (seeds 000-004).

One iteration, as numbered steps in `train`:
  1. rollout   sample responses to a batch of prompts (left-padded, KV-cached generate)
  2. score     reward function/model -> one score per sequence
  3. evaluate  one teacher-forced pass: old log-probs, values, reference log-probs
  4. shape     per-token reward = -beta * KL_t, score added on the last valid token
  5. GAE       advantages and returns = advantages + values, then whiten advantages
  6. update    ppo_epochs x shuffled mini-batches x micro-batches (gradient accumulation)
  7. log       metrics.jsonl, samples.jsonl, diagnostics
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from rlhfkit.algos import (
    AdaptiveKLController,
    FixedKLController,
    entropy_loss,
    gae,
    kl_k3,
    aggregate_loss,
    masked_mean,
    masked_whiten,
    ppo_policy_loss,
    ppo_value_loss,
    shape_rewards,
)
from rlhfkit.errors import UserError
from rlhfkit.rollout import Rollout, SamplingParams, forward_logprobs, generate, score_rollout
from rlhfkit.rollout.core import trim_rows
from rlhfkit.runtime.config import parse_args, save_config
from rlhfkit.runtime.seeding import sampling_seed, seed_everything
from rlhfkit.runtime.tracker import Tracker, make_run_dir
from rlhfkit.trainers.common import PromptStream, autocast, format_prompts, info_lists, mean_std
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.setup import build_actor_critic, eval_before_after, prepare_data


class RatioCheckError(RuntimeError):
    """The first-micro-batch ratio is not 1: log-prob reconstruction is broken (pitfall 4)."""


# ----------------------------------------------------------------------------- rollout


def collect_rollout(actor, reference, tok, records, cfg: PPOConfig, params: SamplingParams, seed: int,
                    reward_fn, device, order: torch.Tensor | None = None) -> Rollout:
    """Steps 1-3: sample, score, and one teacher-forced pass for log-probs/values/ref log-probs."""
    from rlhfkit.rewards import score_batch

    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    torch.manual_seed(seed)
    with autocast(cfg.dtype, device):
        rollout = generate(actor.policy, tok, formatted, params, batch_size=cfg.generation_batch_size)
    rollout.prompts = [str(r["prompt"]) for r in records]
    rollout.info = info_lists(records)
    scores = score_batch(reward_fn, rollout.prompts, rollout.completions, rollout.info)
    rollout.scores = torch.tensor([float(s) for s in scores], dtype=torch.float32)
    with autocast(cfg.dtype, device):
        score_rollout(actor, reference, rollout, cfg.temperature, cfg.micro_batch_size, order)
    return rollout


def compute_advantages(rollout: Rollout, cfg: PPOConfig, kl_coef: float) -> dict[str, float]:
    """Steps 4-5: shaped rewards, GAE, returns before whitening (pitfall 7)."""
    mask = rollout.response_mask
    ref = rollout.ref_logprobs if rollout.ref_logprobs is not None else rollout.logprobs
    beta = kl_coef if cfg.kl_penalty == "reward" else 0.0
    rollout.rewards, shaping = shape_rewards(
        rollout.scores, rollout.logprobs, ref, mask, beta, kl_estimator=cfg.kl_estimator,
        stopped=rollout.stopped, no_stop_penalty=cfg.no_stop_penalty, score_clip=cfg.score_clip,
    )
    adv, rollout.returns = gae(rollout.rewards, rollout.values, mask, cfg.gamma, cfg.lam)
    rollout.advantages = masked_whiten(adv, mask) if cfg.whiten_advantages else adv
    kl_seq = ((rollout.logprobs - ref) * mask).sum(1)  # k1 per sequence, the logged rollout KL
    return {
        "rollout/kl": kl_seq.mean().item(),
        "rollout/non_score_reward": shaping.get("non_score_reward", 0.0),
        "rollout/advantage_mean_raw": masked_mean(adv, mask).item(),
        "rollout/return_mean": masked_mean(rollout.returns, mask).item(),
        "rollout/value_mean": masked_mean(rollout.values, mask).item(),
    }


# ----------------------------------------------------------------------------- update


def micro_batch_loss(actor, mb: Rollout, cfg: PPOConfig, kl_coef: float, n_tokens: int, device):
    """Loss of one micro-batch, normalised by the mini-batch token count (pitfall 11)."""
    mask = mb.response_mask.to(device)
    with autocast(cfg.dtype, device):
        logp, values, ent = forward_logprobs(actor, mb, cfg.temperature, with_values=True, with_entropy=True)
    agg = {"agg_mode": cfg.loss_agg, "num_tokens": n_tokens, "num_seqs": cfg.mini_batch_size}
    old_lp = mb.logprobs.to(device)
    pl, pm = ppo_policy_loss(logp, old_lp, mb.advantages.to(device), mask, cfg.clip_eps, **agg)
    vl, vm = ppo_value_loss(values, mb.values.to(device), mb.returns.to(device), mask, cfg.value_clip_eps, **agg)
    ent_term = entropy_loss(ent, mask, **agg)
    loss = pl + cfg.vf_coef * vl - cfg.ent_coef * ent_term
    if cfg.kl_penalty == "loss" and mb.ref_logprobs is not None:
        loss = loss + kl_coef * aggregate_loss(kl_k3(logp, mb.ref_logprobs.to(device)), mask, **agg)
    ratio_dev = ((logp - old_lp).exp() - 1).abs().masked_fill(mask == 0, 0).max().item()
    stats = {"loss/policy": pl.item(), "loss/value": vl.item(), "loss/entropy": ent_term.item(),
             "loss/total": loss.item(), "ratio_dev": ratio_dev, **pm, **vm}
    return loss, stats


def ppo_update(actor, optimizer, scheduler, accelerator, rollout: Rollout, cfg: PPOConfig, kl_coef: float,
               generator: torch.Generator, first_perm: torch.Tensor) -> dict[str, float]:
    """Step 6: ppo_epochs x shuffled mini-batches x micro-batches; one optimiser step per mini-batch.

    `first_perm` is epoch 0's shuffle, the one the scoring pass grouped its micro-batches by.
    """
    device = accelerator.device
    B = rollout.response_ids.shape[0]
    tol = cfg.ratio_check_tol
    sums: dict[str, float] = defaultdict(float)
    n_steps = 0
    first_dev = None
    for epoch in range(cfg.ppo_epochs):
        perm = first_perm if epoch == 0 else torch.randperm(B, generator=generator)
        for start in range(0, B, cfg.mini_batch_size):
            mini = perm[start : start + cfg.mini_batch_size]
            # Global token count of this mini-batch (all micro-batches, all processes).
            n_tok = accelerator.reduce(rollout.response_mask[mini].sum().to(device), "sum").item()
            for m0 in range(0, len(mini), cfg.micro_batch_size):
                mb = trim_rows(rollout, mini[m0 : m0 + cfg.micro_batch_size])
                loss, st = micro_batch_loss(actor, mb, cfg, kl_coef, max(n_tok, 1.0), device)
                if first_dev is None:
                    first_dev = st["ratio_dev"]
                    if first_dev > tol:
                        raise RatioCheckError(
                            f"max |ratio - 1| = {first_dev:.3g} on the first micro-batch (tolerance {tol}): log-prob "
                            "reconstruction is broken (check padding, position ids, temperature, dropout)")
                # DDP averages gradients over processes; undo it so the global token mean holds.
                accelerator.backward(loss * accelerator.num_processes)
                w = mb.response_mask.sum().item() / max(n_tok, 1.0)
                for k, v in st.items():
                    sums[k] += v if k.startswith("loss/") else v * w
            grad_norm = accelerator.clip_grad_norm_(actor.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            sums["grad_norm"] += float(grad_norm)
            n_steps += 1
    m = {k: v / n_steps for k, v in sums.items()}
    return {
        "loss/policy": m["loss/policy"], "loss/value": m["loss/value"], "loss/entropy": m["loss/entropy"],
        "loss/total": m["loss/total"], "params/policy_clip_frac": m["policy_clip_frac"],
        "params/value_clip_frac": m["value_clip_frac"], "params/approx_kl": m["approx_kl"],
        "params/ratio_mean": m["ratio_mean"], "params/grad_norm": m["grad_norm"],
        "params/ratio_first_microbatch_maxdev": float(first_dev),
    }


# ----------------------------------------------------------------------------- loop


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    mask = rollout.response_mask
    per_seq_reward = (rollout.rewards * mask).sum(1)
    return {
        "rollout/reward_mean": per_seq_reward.mean().item(),
        "rollout/reward_std": per_seq_reward.std(unbiased=False).item(),
        "rollout/score_mean": rollout.scores.mean().item(),
        "rollout/score_std": rollout.scores.std(unbiased=False).item(),
        "rollout/response_length": mask.sum(1).mean().item(),
        "rollout/stop_fraction": rollout.stopped.float().mean().item(),
        "rollout/entropy": masked_mean(rollout.entropy, mask).item(),
    }


def train(cfg: PPOConfig) -> dict:
    """Run PPO; returns the summary (also written to RUN/summary.json)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    seed_everything(cfg.seed)
    run_dir = make_run_dir(cfg.output_dir, cfg.run_name, "ppo")
    if accelerator.is_main_process:
        save_config(cfg, run_dir / "config.yaml")
    tracker = Tracker(run_dir, cfg.iterations, cfg.quiet, accelerator.is_main_process, cfg.tensorboard, cfg.wandb)
    reward_fn, train_records, eval_records = prepare_data(cfg)
    actor, reference, tok = build_actor_critic(cfg)
    from rlhfkit.trainers.common import make_optimizer

    optimizer, scheduler = make_optimizer(actor.parameters(), cfg.lr, cfg.warmup_steps, cfg.weight_decay, cfg.adam_eps)
    actor, optimizer, scheduler = accelerator.prepare(actor, optimizer, scheduler)
    core = accelerator.unwrap_model(actor)
    kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon) if cfg.adaptive_kl
              else FixedKLController(cfg.kl_coef))
    stop_ids = tuple(cfg.stop_ids or [tok.eos_token_id])
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, stop_ids)
    stream = PromptStream(train_records, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    summary = {"run_dir": str(run_dir)}
    with eval_before_after(core, tok, eval_records, reward_fn, cfg, params, tracker, summary, accelerator.device):
        for it in range(cfg.iterations):
            t0 = time.time()
            records = stream.next(cfg.rollout_batch_size)
            seed = sampling_seed(cfg.seed, accelerator.process_index, it)
            perm = torch.randperm(cfg.rollout_batch_size, generator=gen)
            with tracker.phase("rollout", None):
                rollout = collect_rollout(core, reference, tok, records, cfg, params, seed, reward_fn,
                                          accelerator.device, perm)
            metrics = compute_advantages(rollout, cfg, kl_ctl.value)
            t1 = time.time()
            metrics.update(ppo_update(actor, optimizer, scheduler, accelerator, rollout, cfg, kl_ctl.value, gen, perm))
            t2 = time.time()
            metrics.update(rollout_metrics(rollout))
            metrics.update({"params/kl_coef": kl_ctl.value, "params/lr": scheduler.get_last_lr()[0],
                            "params/max_grad_norm": cfg.max_grad_norm, "timing/rollout_s": t1 - t0,
                            "timing/update_s": t2 - t1,
                            "throughput/tokens_per_s": rollout.response_mask.sum().item() / (t2 - t0)})
            kl_ctl.update(metrics["rollout/kl"], cfg.rollout_batch_size)
            tracker.log(it, metrics)
            tracker.log_samples(it, [
                {"prompt": p, "completion": c, "score": float(s), "reward": float(r)}
                for p, c, s, r in zip(rollout.prompts, rollout.completions, rollout.scores,
                                      (rollout.rewards * rollout.response_mask).sum(1))
            ][: cfg.log_samples])
    if accelerator.is_main_process:
        from rlhfkit.models.policy import save_actor

        save_actor(core, tok, run_dir / "final")
        if cfg.save_merged and cfg.lora:
            save_actor(core, tok, run_dir / "final" / "merged", merge=True)
        tracker.write_json("summary.json", summary)
    tracker.close()
    return summary


def main(argv: list[str]) -> int:
    cfg = parse_args(PPOConfig, argv, "rlhfkit ppo")
    if cfg is None:
        return 0
    try:
        train(cfg)
    except RatioCheckError as e:
        raise UserError(str(e)) from None
    return 0
