"""`rlhfkit trpo`: Trust Region Policy Optimization (Schulman et al. 2015) for causal LMs.

One iteration, as numbered steps in `train`:
  1. rollout   sample responses to a batch of prompts (as PPO)
  2. score     reward function/model -> one score per sequence
  3. log-probs one teacher-forced pass: old log-probs, values, reference log-probs
  4. shape+GAE per-token reward = -beta * KL_t + score on the last token; GAE; returns; whitening
               (PPO's `compute_advantages`, trainers/advantages.py)
  5. policy    one natural-gradient step: g = grad of the surrogate advantage, x = (F + lambda I)^-1 g by
               conjugate gradients with Fisher-vector products (F estimated on fvp_fraction of the rows),
               the step scaled to the KL bound max_kl, then a backtracking line search on the whole
               rollout (algos/trpo.py)
  6. critic    vf_epochs x mini-batches of the (clipped) value loss on the returns, value head only
  7. log       PPO's metric names + trpo/* (docs/algorithms.md)

Where PPO approximates the trust region with a clipped ratio and several epochs of first-order
steps, TRPO takes one second-order step whose mean token KL to the rollout policy is measured and
bounded. One process only: the natural-gradient step uses autograd directly, not DDP's all-reduce.
"""

from __future__ import annotations

import contextlib
import time
from functools import partial

import torch
import torch.nn.functional as F

from rlhfkit.algos import (
    AdaptiveKLController,
    FixedKLController,
    ppo_value_loss,
)
from rlhfkit.algos.trpo import (
    fisher_rows,
    fisher_vector_product,
    flat_params,
    gauss_newton_fvp,
    line_search_evaluator,
    set_flat_params_,
    summed_flat_grad,
    surrogate_advantage,
    token_kl,
    trpo_step,
)
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.errors import UserError
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.rollout.logprobs import micro_batch_chunks, rows_of
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.faults import guarded_step
from rlhfkit.trainers.advantages import compute_advantages
from rlhfkit.trainers.build import build_actor_critic
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import rollout_metrics, shuffled_rows
from rlhfkit.trainers.trpo_config import TRPOConfig

__all__ = ["TRPOConfig", "policy_step", "fisher_product", "critic_update", "train"]


# ----------------------------------------------------------------------------- the policy step


def response_logits(actor, mb: Rollout, temperature: float) -> torch.Tensor:
    """(B, R, V) float32 logits / T of the response positions, through the same forward path as the
    log-prob pass (frozen trunk, shared prefix); the full distributions the KL constraint needs."""
    device = next(actor.parameters()).device
    trunk = mb.trunk.to(device) if mb.trunk is not None else None
    logits, _ = actor.logits(mb.input_ids.to(device), mb.attention_mask.to(device), mb.response_ids.shape[1],
                             trunk=trunk)
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature  # one (B, R, V) copy fewer at T = 1


def token_logprobs(logits: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[response token]: (B, R, V), (B, R) -> (B, R)."""
    return F.log_softmax(logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)


def micro_batches(rollout: Rollout, rows: torch.Tensor, micro: int, device, chunk_budget: int) -> list[Rollout]:
    """`rows` of the rollout in consecutive micro-batches of at most `micro` rows (padding trimmed),
    on the CPU each cut into the row chunks every trainer runs (rollout/logprobs.py): every term is a
    sum over tokens divided by a count fixed beforehand, so chunks add up to their micro-batch."""
    return [rows_of(rollout, chunk, micro_rows) for chunk, micro_rows in micro_batch_chunks(rows, micro, rollout, device, chunk_budget)]


def policy_step(actor, params: list[torch.Tensor], rollout: Rollout, cfg: TRPOConfig, device,
                generator: torch.Generator | None = None) -> dict[str, float]:
    """Step 5: one TRPO step on the policy parameters `params`, in place. The surrogate's pi_old and
    the KL's p_old are computed here, micro-batch by micro-batch, with the same function the terms
    use, so at theta_old the ratio is exactly 1 and the KL exactly 0 (their gradients: the policy
    gradient, and no first-order KL term). The gradient and the line search use every row, each term
    divided by the rollout's valid-token count N; the Fisher-vector products use the rows
    `fisher_rows` draws (`cfg.fvp_fraction`, from `generator`; default: seeded by cfg.seed), each
    term divided by their own token count. So gradient, Fisher-vector products and the step do not
    depend on the micro-batch split."""
    B, micro = rollout.response_ids.shape[0], cfg.micro_batch_size
    mbs = micro_batches(rollout, torch.arange(B, device=rollout.response_ids.device), micro, device,
                        cfg.cpu_chunk_positions)
    n_tok = float(rollout.response_mask.sum().clamp(min=1))
    amp = partial(autocast, cfg.dtype, device)
    with torch.no_grad(), amp():
        old_logits = [response_logits(actor, mb, cfg.temperature) for mb in mbs]
    old_logp = [token_logprobs(lg, mb.response_ids.to(device)) for lg, mb in zip(old_logits, mbs)]
    m0 = mbs[0].response_mask.to(device) != 0
    ratio_dev = ((old_logp[0] - mbs[0].logprobs.to(device)).exp() - 1).abs().masked_fill(~m0, 0).max().item()

    def both(i: int, with_kl: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward: (surrogate share, KL share or None). The gradient needs no KL (its gradient
        is 0 at theta_old): leaving it out keeps ~6 (B, R, V) float32 tensors out of that backward."""
        mb = mbs[i]
        mask = mb.response_mask.to(device)
        with amp():
            logits = response_logits(actor, mb, cfg.temperature)
        logp = token_logprobs(logits, mb.response_ids.to(device))
        surrogate, _ = surrogate_advantage(logp, old_logp[i], mb.advantages.to(device), mask, n_tok)
        if not with_kl:
            return surrogate, None
        kl, _ = token_kl(old_logits[i], logits, mask, 1.0, n_tok)  # logits are already / T
        return surrogate, kl

    surrogate_terms = [lambda i=i: both(i, with_kl=False)[0] for i in range(len(mbs))]
    grad, surrogate_before = summed_flat_grad(surrogate_terms, params)
    fvp = fisher_product(actor, params, rollout, cfg, device, generator)
    evaluate = line_search_evaluator(params, [lambda i=i: both(i) for i in range(len(mbs))])
    theta_old = flat_params(params)
    step, metrics = trpo_step(grad, fvp, evaluate, surrogate_before, cfg.max_kl, cfg.cg_iters,
                              backtrack_coef=cfg.backtrack_coef, max_backtracks=cfg.max_backtracks,
                              accept_ratio=cfg.accept_ratio)
    set_flat_params_(params, theta_old + step)
    return {**metrics, "trpo/policy_grad_norm": float(grad.norm()), "ratio_first_microbatch_maxdev": ratio_dev,
            "loss/policy": -(surrogate_before + metrics["trpo/surrogate_improvement"])}


def fisher_product(actor, params: list[torch.Tensor], rollout: Rollout, cfg: TRPOConfig, device,
                   generator: torch.Generator | None = None):
    """v -> (F + damping I) v, F the Fisher of the token distributions on the rows `fisher_rows`
    draws (all rows for fvp_fraction = 1), the mean over their N_F valid tokens; by the double
    backward of the KL (`fisher_vector_product`) or its closed form (`gauss_newton_fvp`)."""
    if generator is None:
        generator = torch.Generator(device=HOST).manual_seed(cfg.seed)
    rows = fisher_rows(rollout.response_ids.shape[0], cfg.fvp_fraction, generator)
    mbs = micro_batches(rollout, rows, cfg.micro_batch_size, device, cfg.cpu_chunk_positions)
    n_fisher = float(sum(float(mb.response_mask.sum()) for mb in mbs)) or 1.0
    amp = partial(autocast, cfg.dtype, device)

    def logits_of(mb: Rollout) -> torch.Tensor:
        with amp():
            return response_logits(actor, mb, cfg.temperature)

    if cfg.fvp_mode == "gauss-newton":
        terms = [lambda mb=mb: (logits_of(mb), mb.response_mask.to(device) / n_fisher) for mb in mbs]
        return gauss_newton_fvp(terms, params, cfg.damping)
    with torch.no_grad():
        old = [logits_of(mb) for mb in mbs]  # p_old of these micro-batches, by the same forward as the terms
    terms = [lambda i=i: token_kl(old[i], logits_of(mbs[i]), mbs[i].response_mask.to(device), 1.0, n_fisher)[0]
             for i in range(len(mbs))]
    return fisher_vector_product(terms, params, cfg.damping, cfg.fvp_cache_graph)


# ----------------------------------------------------------------------------- the critic


@contextlib.contextmanager
def frozen(params: list[torch.Tensor]):
    """No gradient reaches `params` inside (the backward stops at the value head)."""
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)


def value_loss(rl: RLRun, mb: Rollout, cfg: TRPOConfig, n_tok: float) -> tuple[torch.Tensor, dict]:
    """PPO's clipped value loss of micro-batch `mb` summed over its tokens / `n_tok` (the step's
    token count), and its share of the step's "loss/value" and "value_clip_frac"."""
    device = rl.device
    mask = mb.response_mask.to(device)
    with autocast(cfg.dtype, device):
        _, values, _ = forward_logprobs(rl.model, mb, cfg.temperature, with_values=True)
    loss, vm = ppo_value_loss(values, mb.values.to(device), mb.returns.to(device), mask,
                              cfg.value_clip_eps, agg_mode="token-mean", num_tokens=n_tok)
    return loss, {"loss/value": loss.item(), "value_clip_frac": vm["value_clip_frac"] * float(mask.sum()) / n_tok}


def critic_update(rl: RLRun, policy_params: list[torch.Tensor], rollout: Rollout, cfg: TRPOConfig) -> dict[str, float]:
    """Step 6: regress the values on the returns (PPO's clipped value loss, global token mean of
    each mini-batch), training the value head (and a separate critic) only."""
    device = rl.device
    B = rollout.response_ids.shape[0]
    sums = {"loss/value": 0.0, "value_clip_frac": 0.0, "grad_norm": 0.0}
    n_steps = 0
    with frozen(policy_params):
        for _ in range(cfg.vf_epochs):
            perm = shuffled_rows(B, rl.generator)
            for start in range(0, B, cfg.vf_mini_batch_size):
                mini = perm[start : start + cfg.vf_mini_batch_size]
                n_tok = max(float(rollout.response_mask[mini].sum()), 1.0)  # the step's normaliser
                micro = micro_batches(rollout, mini, cfg.micro_batch_size, device, cfg.cpu_chunk_positions)
                step = add_up(accumulate(rl.accelerator, rl.model, micro, partial(value_loss, rl, cfg=cfg, n_tok=n_tok)))
                grad_norm, _ = guarded_step(rl.model.parameters(), rl.optimizer, rl.scheduler, rl.accelerator,
                                            cfg.max_grad_norm, loss=step["loss/value"], guard=rl.guard,
                                            where=f"iteration {rl.iteration}, critic step {n_steps + 1}")
                sums["loss/value"] += step["loss/value"]
                sums["value_clip_frac"] += step["value_clip_frac"]
                sums["grad_norm"] += grad_norm
                n_steps += 1
    return {k: v / n_steps for k, v in sums.items()}


# ----------------------------------------------------------------------------- loop


def train(cfg: TRPOConfig) -> dict:
    """Run TRPO; returns the summary (also written to RUN/summary.json)."""
    with RLRun(cfg, "trpo", build_actor_critic) as rl:
        if rl.world > 1:
            raise UserError("trpo runs in one process: its natural-gradient step does not all-reduce over processes")
        policy_params = [p for p in rl.core.policy.parameters() if p.requires_grad]
        kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon) if cfg.adaptive_kl
                  else FixedKLController(cfg.kl_coef))
        rl.resume(kl_ctl=kl_ctl)  # when resuming: weights, optimiser, data position, RNG, ... from the checkpoint
        with rl.evaluating():  # held-out reward before and after
            for it in rl.steps():
                t0 = time.time()
                records = rl.stream.next(cfg.rollout_batch_size)
                rollout = rl.logprob_pass(rl.sample(records, it), torch.arange(cfg.rollout_batch_size, device=HOST))  # steps 1-3
                rollout, metrics = compute_advantages(rollout, cfg, kl_ctl.value)  # step 4
                t1 = time.time()
                with rl.tracker.phase("update", None):
                    step = policy_step(rl.model, policy_params, rollout, cfg, rl.device, rl.generator)  # step 5
                    critic = critic_update(rl, policy_params, rollout, cfg)  # step 6
                t2 = time.time()
                metrics.update({k: v for k, v in step.items() if k.startswith(("trpo/", "loss/"))})
                metrics.update({"loss/value": critic["loss/value"], "params/value_clip_frac": critic["value_clip_frac"],
                                "params/grad_norm": critic["grad_norm"], "params/approx_kl": step["trpo/kl_after_step"],
                                "params/ratio_first_microbatch_maxdev": step["ratio_first_microbatch_maxdev"],
                                "params/kl_coef": kl_ctl.value})
                metrics.update(rollout_metrics(rollout))
                logged = rl.log_iteration(it, rollout, metrics, (t0, t1, t2))  # step 7
                kl_ctl.update(logged["rollout/kl"], cfg.rollout_batch_size)
        return rl.finish()
