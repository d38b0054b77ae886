"""Set-up steps of the RL trainers (PPO, GRPO): data, reward, actor-critic, before/after check."""

from __future__ import annotations

import contextlib

from rlhfkit.errors import UserError
from rlhfkit.rollout import SamplingParams


def prepare_data(cfg) -> tuple:
    """(reward_fn, train records, held-out records)."""
    from rlhfkit.data.prompts import load_prompts
    from rlhfkit.rewards import get_reward

    reward_fn = get_reward(cfg.reward)
    train = load_prompts(cfg.prompts, split="train", seed=cfg.seed)
    if not train:
        raise UserError(f"prompts: '{cfg.prompts}' has no training prompts")
    held_out: list[dict] = []
    if cfg.num_eval_prompts > 0:
        spec = cfg.eval_prompts or cfg.prompts
        try:
            held_out = load_prompts(spec, split="test", limit=cfg.num_eval_prompts, seed=cfg.seed)
        except UserError:
            held_out = []
        if not held_out:  # a user file has no split: hold out nothing, evaluate on a fixed sample
            held_out = load_prompts(spec, split="train", limit=cfg.num_eval_prompts, seed=cfg.seed + 1)
    return reward_fn, train, held_out


def prompt_limit(cfg, tok, model, *record_sets) -> int | None:
    """The token limit of rollout prompts (SamplingArgs.max_prompt_length, else the context window
    minus max_new_tokens); longer prompts get one warning or, with prompt_overflow=error, a DataError."""
    from rlhfkit.rollout.prompt_fit import enforce_prompt_limit, prompt_token_limit
    from rlhfkit.trainers.common import format_prompts

    limit, how = prompt_token_limit(model, cfg.max_new_tokens, cfg.max_prompt_length)
    groups = [(format_prompts(tok, [r["prompt"] for r in records], cfg), getattr(records, "where", None))
              for records in record_sets]
    enforce_prompt_limit(tok, groups, limit, cfg.prompt_overflow, how)
    return limit


def build_actor_critic(cfg):
    """(ActorCritic, Reference | None, tokenizer)."""
    import torch

    from rlhfkit.models import load_causal_lm
    from rlhfkit.models.loading import set_gradient_checkpointing
    from rlhfkit.models.policy import ActorCritic, Reference, ValueHead
    from rlhfkit.trainers.common import build_policy

    policy, tok = build_policy(cfg)
    hidden = policy.config.hidden_size
    critic = None
    if cfg.critic_model:
        critic = load_causal_lm(cfg.critic_model, dtype="fp32", trainable=True)
        hidden = critic.config.hidden_size
        if cfg.gradient_checkpointing:
            set_gradient_checkpointing(critic)
    actor = ActorCritic(policy, ValueHead(hidden), critic,
                        share_prefix=cfg.share_prefix and not cfg.gradient_checkpointing)
    needs_ref = cfg.kl_coef > 0
    ref_dtype = torch.bfloat16 if cfg.dtype == "bf16" else None
    reference = (Reference(actor, use_adapter_off=cfg.lora, dtype=ref_dtype, offload=cfg.offload_reference)
                 if needs_ref else None)
    return actor, reference, tok


def evaluate_reward(model, tok, records, reward_fn, cfg, params: SamplingParams, seed: int) -> dict:
    """Mean/std of the reward of sampled completions on `records` (`cfg.eval_samples_per_prompt` each,
    default 1: more samples per prompt make the before/after change less noisy)."""
    from rlhfkit.generate import sample_and_score
    from rlhfkit.trainers.common import format_prompts, mean_std

    k = getattr(cfg, "eval_samples_per_prompt", 1)
    records = [r for r in records for _ in range(k)]
    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    # k x the rollout's generation batch: as many generate() calls as with one sample, whose fixed
    # per-token cost (small ops, the cache) dominates CPU decoding
    completions, scores = sample_and_score(model, tok, records, formatted, reward_fn, params, seed,
                                           cfg.generation_batch_size * k, cfg.dtype)
    m, s = mean_std(scores)
    return {"mean": m, "std": s, "n": len(scores),
            "samples": [{"prompt": r["prompt"], "completion": c, "score": x}
                        for r, c, x in list(zip(records, completions, scores))[:8]]}


@contextlib.contextmanager
def eval_before_after(actor, tok, records, reward_fn, cfg, params, tracker, summary: dict, device,
                      generation_context=contextlib.nullcontext):
    """Score sampled completions on held-out prompts before and after the wrapped training. A resumed
    run finds the before-training result in `summary` (restored from the checkpoint) and reuses it.
    `generation_context()` wraps each evaluation's sampling (full weights under DeepSpeed ZeRO-3)."""
    if not records:
        yield
        return
    seed = cfg.seed + 424242  # same seed before and after: the comparison sees the same sampling noise
    before = summary.get("eval_before")
    if before is None:
        with generation_context():
            before = evaluate_reward(actor.policy, tok, records, reward_fn, cfg, params, seed)
        summary["eval_before"] = before
    tracker.print(f"[eval] before training: mean reward {before['mean']:.3f} (sd {before['std']:.3f}, n={before['n']})")
    yield
    with generation_context():
        after = evaluate_reward(actor.policy, tok, records, reward_fn, cfg, params, seed)
    tracker.print(f"[eval] after training:  mean reward {after['mean']:.3f} (sd {after['std']:.3f}, n={after['n']})")
    tracker.print(f"[eval] change: {after['mean'] - before['mean']:+.3f} on {len(records)} held-out prompts, "
                  f"{after['n']} samples (reward={cfg.reward}, T={cfg.temperature})")
    summary.update({"eval_before": before, "eval_after": after, "eval_change": after["mean"] - before["mean"]})
