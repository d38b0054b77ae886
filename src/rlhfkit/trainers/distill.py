"""`rlhfkit distill teacher=MODEL`: a student learns a teacher's per-token distributions.

One iteration, as numbered steps in `train`:
  1. sequences   rollout_batch_size prompts; with probability lmbda (a coin drawn from the seed and the
                 iteration, as GKD draws one per batch) the student samples the answers (on-policy), else
                 they come from `off_policy_data`: the teacher samples them, or the dataset's
                 completions are read; every sequence is scored by `reward` for the log only
  2. log-probs   one teacher-forced pass: the student's log-probs and entropy of the tokens and, for
                 loss=reverse-kl, the teacher's log-prob of each of them (the reference's chunked pass,
                 rollout/logprobs.py, with the frozen teacher in the reference's place)
  3. update      one pass of mini-batches x micro-batches: reverse-kl = the policy-gradient surrogate
                 of the per-token reverse KL on the student's samples (algos.reverse_kl_loss); jsd =
                 GKD's generalised JSD over the whole (or the teacher's top-k) next-token distributions,
                 the teacher's logits computed per micro-batch without gradient (algos.jsd_loss)
  4. log         distill/reverse_kl (on-policy iterations), distill/jsd (jsd), rollout/on_policy,
                 the student's entropy, the reward of the sequences, timings

Before and after training: the held-out reward of the student's own samples (accuracy with the
arithmetic reward). The run harness, checkpoints and resume are the RL trainers' (trainers/rl.py).
Maths, conventions and when to prefer which loss: docs/algorithms.md.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time

import torch

from rlhfkit.algos import jsd_loss, masked_mean, reverse_kl_loss, shape_rewards, teacher_topk
from rlhfkit.core.precision import autocast
from rlhfkit.errors import UserError
from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.models.policy import Reference
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.rollout.logprobs import logprob_pass
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.distill_config import DistillConfig
from rlhfkit.trainers.distill_data import dataset_rollout, teacher_rollout
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import rollout_metrics, shuffled_rows

__all__ = ["build_models", "check_same_vocabulary", "load_teacher", "micro_batch_loss", "on_policy", "train"]

COIN_SEED_OFFSET = 7_919  # the lmbda coins' stream, apart from sampling's seeds


# ----------------------------------------------------------------------------- models


def check_same_vocabulary(student_tok, teacher_tok, student_width: int, teacher_width: int, teacher: str) -> None:
    """UserError unless the teacher's tokenizer and output layer match the student's: the losses
    compare next-token distributions token id by token id."""
    if student_tok.get_vocab() != teacher_tok.get_vocab():
        raise UserError(f"teacher ({teacher}): its tokenizer's vocabulary ({len(teacher_tok)} tokens) differs from "
                        f"the student's ({len(student_tok)} tokens); distillation needs one tokenizer for both")
    if student_width != teacher_width:
        raise UserError(f"teacher ({teacher}): its output layer has {teacher_width} logits, the student's "
                        f"{student_width}; distillation needs the same vocabulary for both")


def load_teacher(cfg, actor, tok):
    """The frozen teacher `cfg.teacher` as a models.policy.Reference beside the student `actor`: in bf16
    when cfg.dtype is bf16 (wholly with LoRA, as the student's frozen base; else its linear layers). Missing, not a causal LM or another
    vocabulary: a UserError naming the teacher (one line, before anything is written)."""
    # the student's base dtype (trainers/build.py build_policy): bf16 with LoRA in a bf16 run, so a
    # teacher equal to the student computes the same bits (step 0 exactly 0)
    base_dtype = "bf16" if (cfg.dtype == "bf16" and cfg.lora) else "fp32"
    try:
        teacher_tok = load_tokenizer(cfg.teacher)
        teacher = load_causal_lm(cfg.teacher, dtype=base_dtype, trainable=False)
    except UserError as e:
        raise UserError(f"teacher: {e}") from None
    check_same_vocabulary(tok, teacher_tok, actor.policy.get_output_embeddings().weight.shape[0],
                          teacher.get_output_embeddings().weight.shape[0], cfg.teacher)
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else None  # frozen linear weights stored in bf16
    return Reference(actor, use_adapter_off=False, dtype=dtype, model=teacher)


def build_models(cfg: DistillConfig):
    """(policy-only ActorCritic, the frozen teacher as a Reference, tokenizer); bad input stops with
    one line and nothing written."""
    if cfg.loss == "jsd" and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # its logits skip the DDP wrapper
        raise UserError("loss=jsd runs in one process (its student logits bypass the data-parallel wrapper); "
                        "use loss=reverse-kl with several processes")
    actor, _, tok = build_actor(cfg, with_reference=False)
    return actor, load_teacher(cfg, actor, tok), tok


# ----------------------------------------------------------------------------- the loss


def on_policy(seed: int, iteration: int, lmbda: float) -> bool:
    """GKD's coin for one iteration: True (the student samples) with probability lmbda; a pure
    function of (seed, iteration), so a resumed run draws the same coins."""
    return lmbda >= 1 or random.Random(seed * 1_000_003 + iteration + COIN_SEED_OFFSET).random() < lmbda


def micro_batch_loss(model, teacher, mb: Rollout, cfg: DistillConfig, n_tokens: float, device):
    """Loss of one micro-batch (normalised by the mini-batch's global token count `n_tokens`).
    reverse-kl: from the student's log-probs with gradient and the pass's teacher log-probs; jsd: the
    student's logits (B, R, V) with gradient and the teacher's (B, R, V), or its top-k (B, R, K)."""
    mask = mb.response_mask.to(device)
    old = mb.logprobs.to(device)
    if cfg.loss == "reverse-kl":
        with autocast(cfg.dtype, device):
            logp, _, _ = forward_logprobs(model, mb, cfg.temperature, with_values=False)
        loss, m = reverse_kl_loss(logp, old, mb.ref_logprobs.to(device), mask, n_tokens)
        return loss, {"loss/distill": loss.detach(), "ratio_dev": m["ratio_dev"]}
    ids, am, R = mb.input_ids.to(device), mb.attention_mask.to(device), mb.response_ids.shape[1]
    with autocast(cfg.dtype, device):
        t_logits = teacher.logits(ids, am, R)  # (B, R, V), no gradient
        idx = None
        if cfg.distill_topk is not None:
            t_logits, idx = teacher_topk(t_logits, cfg.distill_topk)  # (B, R, K): the rest is dropped
        s_logits, _ = model.logits(ids, am, R)  # (B, R, V)
    loss, m = jsd_loss(s_logits, t_logits, mask, cfg.beta, cfg.temperature, idx, n_tokens)
    logp = torch.log_softmax(s_logits.detach().float() / cfg.temperature, -1)
    logp = logp.gather(-1, mb.response_ids.to(device)[..., None]).squeeze(-1)
    dev = ((logp - old).exp() - 1).abs().masked_fill(mask == 0, 0).max()
    return loss, {"loss/distill": loss.detach(), "jsd": m["jsd"], "ratio_dev": dev}


# ----------------------------------------------------------------------------- loop


def sequences(rl: RLRun, cfg: DistillConfig, it: int) -> tuple[Rollout, bool]:
    """Step 1: (this iteration's scored sequences, whether the student sampled them)."""
    records = rl.stream.next(cfg.rollout_batch_size)
    if on_policy(cfg.seed, it, cfg.lmbda):
        return rl.sample(records, it), True
    if cfg.off_policy_data == "dataset":
        return dataset_rollout(rl, cfg, records), False
    return teacher_rollout(rl, cfg, records, it), False


def scoring_pass(rl: RLRun, cfg: DistillConfig, rollout: Rollout, order: torch.Tensor) -> Rollout:
    """Step 2: the rollout with the student's log-probs and entropy (and the teacher's log-probs with
    reverse-kl), computed in the micro-batches of the update's first pass, so that its first
    micro-batch repeats this exactly."""
    t0 = time.perf_counter()
    teacher = rl.reference if cfg.loss == "reverse-kl" else None
    with rl.tracker.phase("log-probs", None), autocast(cfg.dtype, rl.device):
        scored = logprob_pass(rl.core, teacher, rollout, cfg.temperature, rl.micro_batch_size, order,
                              chunk_budget=cfg.cpu_chunk_positions)
    return dataclasses.replace(scored, timings={**rollout.timings, "timing/logprobs_s": time.perf_counter() - t0})


def train(cfg: DistillConfig) -> dict:
    """Run distillation (see the module docstring); returns the summary (also RUN/summary.json)."""
    with RLRun(cfg, "distill", build_models) as rl:

        def loss_fn(mb: Rollout, n_tokens: float, n_seqs: float):
            return micro_batch_loss(rl.model, rl.reference, mb, cfg, n_tokens, rl.device)

        rl.resume()
        with rl.evaluating():  # held-out reward of the student's samples before and after
            for it in rl.steps():
                t0 = time.time()
                rollout, sampled = sequences(rl, cfg, it)  # step 1
                mask = rollout.response_mask
                rewards, _ = shape_rewards(rollout.scores, torch.zeros_like(mask), torch.zeros_like(mask),
                                           mask, 0.0)  # the score on the last token: logged, not trained on
                rollout = dataclasses.replace(rollout, rewards=rewards)
                perm = shuffled_rows(len(rollout.scores), rl.generator)
                rollout = scoring_pass(rl, cfg, rollout, perm)  # step 2
                t1 = time.time()
                m = rl.update(rollout, loss_fn, 1, cfg.optimiser_batch, perm)  # step 3
                metrics = {**rollout_metrics(rollout), "rollout/on_policy": float(sampled),
                           "loss/distill": m["loss/distill"], "params/grad_norm": m["grad_norm"],
                           "params/ratio_first_microbatch_maxdev": m["ratio_first_microbatch_maxdev"],
                           "params/skipped_steps": m["skipped_steps"]}
                if cfg.loss == "jsd":
                    metrics["distill/jsd"] = m["jsd"]
                if sampled and rollout.ref_logprobs is not None:  # k1 on the student's own tokens
                    metrics["distill/reverse_kl"] = masked_mean(rollout.logprobs - rollout.ref_logprobs, mask).item()
                rl.log_iteration(it, rollout, metrics, (t0, t1, time.time()))  # step 4
        if cfg.reward == "arithmetic" and "eval_after" in rl.summary:  # exact match: mean reward = accuracy
            b, a = rl.summary["eval_before"], rl.summary["eval_after"]
            rl.print(f"[eval] held-out accuracy (T={cfg.temperature}): {b['mean']:.1%} before -> "
                         f"{a['mean']:.1%} after (n={a['n']})")
        return rl.finish()
