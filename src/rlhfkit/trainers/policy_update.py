"""What the on-policy RL trainers (PPO, GRPO, RLOO) share: run set-up, the rollout, the clipped
update loop, rollout metrics, logging and the final checkpoint.

Each trainer supplies only its own maths: how advantages are formed and a `loss_fn` for one
micro-batch. `update_policy` owns epochs x mini-batches x micro-batches, the global
normalisers, gradient accumulation, clipping and the first-micro-batch ratio check.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.algos import masked_mean
from rlhfkit.errors import UserError
from rlhfkit.rollout import Rollout, SamplingParams, generate, score_rollout
from rlhfkit.rollout.core import trim_rows
from rlhfkit.runtime.distributed import (
    accumulate_backward,
    full_state_dict,
    generation_weights,
    max_over_processes,
    mean_over_processes,
    sum_over_processes,
)
from rlhfkit.runtime.faults import NonFiniteGuard, guarded_step
from rlhfkit.trainers.common import autocast, format_prompts, info_lists

# loss_fn(micro_batch, global token count, global sequence count) -> (loss, stats). Stats named
# "loss/..." are already normalised by the global counts (they add up over micro-batches); the
# others are token means of this micro-batch and must include "ratio_dev" = max |ratio - 1|.
LossFn = Callable[[Rollout, float, float], tuple[torch.Tensor, dict[str, float]]]


class RatioCheckError(UserError):
    """The first-micro-batch ratio is not 1: log-prob reconstruction is broken (pitfall 4).
    A UserError so the CLI prints it as one line with exit code 2 (usually a setting to fix)."""


# ----------------------------------------------------------------------------- rollout


def sample_rollout(actor, tok, records, cfg, params: SamplingParams, seed: int, reward_fn, device,
                   backend=None) -> Rollout:
    """Sample one response per record and score it. `backend` (rollout/backends.py) samples; the
    default is HF's left-padded, KV-cached generate on the policy itself."""
    from rlhfkit.rewards import score_batch

    t0 = time.perf_counter()
    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    with autocast(cfg.dtype, device):
        if backend is None:
            torch.manual_seed(seed)
            rollout = generate(actor.policy, tok, formatted, params, batch_size=cfg.generation_batch_size,
                               share_prompts=actor.share_prompts, share_prefix=actor.share_prefix)
        else:
            rollout = backend.generate(actor.policy, tok, formatted, params, seed, cfg.generation_batch_size,
                                       share_prompts=actor.share_prompts, share_prefix=actor.share_prefix)
    t1 = time.perf_counter()
    rollout.prompts = [str(r["prompt"]) for r in records]
    rollout.info = info_lists(records)
    scores = score_batch(reward_fn, rollout.prompts, rollout.completions, rollout.info)
    rollout.scores = torch.tensor([float(s) for s in scores], dtype=torch.float32)
    rollout.timings = {"timing/generate_s": t1 - t0, "timing/reward_s": time.perf_counter() - t1}
    return rollout


def collect_rollout(actor, reference, tok, records, cfg, params: SamplingParams, seed: int,
                    reward_fn, device, order: torch.Tensor | None = None) -> Rollout:
    """`sample_rollout`, then one teacher-forced pass for log-probs, values (when the actor has a
    value head), entropy and reference log-probs.

    `order` groups the scoring micro-batches as the first update epoch will (see score_rollout).
    """
    rollout = sample_rollout(actor, tok, records, cfg, params, seed, reward_fn, device)
    t0 = time.perf_counter()
    with autocast(cfg.dtype, device):
        score_rollout(actor, reference, rollout, cfg.temperature, cfg.micro_batch_size, order)
    rollout.timings["timing/logprobs_s"] = time.perf_counter() - t0
    return rollout


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
        **rollout.timings,
    }


# ----------------------------------------------------------------------------- update


def shuffled_rows(n_rows: int, generator: torch.Generator, group_size: int = 1,
                  mini_batch_size: int | None = None) -> torch.Tensor:
    """A random order of `n_rows` rows (`torch.randperm`, draw for draw). With group_size G > 1 the
    rows of each mini-batch are then sorted by their group (G consecutive rows share a prompt):
    the same rows in the same mini-batches, so the same optimisation, but each micro-batch holds
    few distinct prompts, and each runs once (models/shared_prompts.py)."""
    perm = torch.randperm(n_rows, generator=generator)
    if group_size == 1:
        return perm
    chunks = perm.split(mini_batch_size or n_rows)
    return torch.cat([c[torch.argsort(c // group_size, stable=True)] for c in chunks])


def update_policy(model, optimizer, scheduler, accelerator, rollout: Rollout, loss_fn: LossFn, *, epochs: int,
                  mini_batch_size: int, micro_batch_size: int, max_grad_norm: float, ratio_check_tol: float,
                  generator: torch.Generator, first_perm: torch.Tensor, guard: NonFiniteGuard | None = None,
                  where: str = "", group_size: int = 1) -> dict[str, float]:
    """`epochs` x shuffled mini-batches x micro-batches; one optimiser step per mini-batch.

    `first_perm` is epoch 0's shuffle, the one the scoring pass grouped its micro-batches by, so
    the first micro-batch repeats that pass exactly and its ratio must be 1 (else RatioCheckError).
    Each micro-batch loss is normalised by the whole mini-batch's token and sequence counts, summed
    over processes, so the accumulated gradient does not depend on the split (pitfall 11) nor on
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
            mini_loss = 0.0
            for m0 in range(0, len(mini), micro_batch_size):
                mb = trim_rows(rollout, mini[m0 : m0 + micro_batch_size])
                loss, st = loss_fn(mb, n_tok, n_seq)
                mini_loss += loss.item()
                if first_dev is None:  # the largest of all processes, so they all raise or none does
                    first_dev = max_over_processes(accelerator, st["ratio_dev"])
                    if first_dev > ratio_check_tol:
                        raise RatioCheckError(
                            f"max |ratio - 1| = {first_dev:.3g} on the first micro-batch (tolerance "
                            f"{ratio_check_tol}): log-prob reconstruction is broken (check padding, position "
                            "ids, temperature, dropout)")
                accumulate_backward(accelerator, model, loss, sync=m0 + micro_batch_size >= len(mini))
                w = mb.response_mask.sum().item() / n_tok
                for k, v in st.items():
                    sums[k] += v if k.startswith("loss/") else v * w
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


def policy_update_metrics(m: dict[str, float]) -> dict[str, float]:
    """The metric names PPO and GRPO share, from `update_policy`'s averaged stats."""
    return {
        "loss/policy": m["loss/policy"], "loss/total": m["loss/total"],
        "params/policy_clip_frac": m["policy_clip_frac"], "params/approx_kl": m["approx_kl"],
        "params/ratio_mean": m["ratio_mean"], "params/grad_norm": m["grad_norm"],
        "params/ratio_first_microbatch_maxdev": m["ratio_first_microbatch_maxdev"],
        "params/skipped_steps": m["skipped_steps"],
    }


# ----------------------------------------------------------------------------- run


@dataclass
class RLRun:
    """Everything a trainer's loop needs, built by `start_run`."""

    cfg: Any
    accelerator: Any
    run_dir: Any
    tracker: Any
    reward_fn: Any
    eval_records: list
    stream: Any
    model: Any  # the prepared (possibly DDP-wrapped) actor: use it for training forwards
    core: Any  # the unwrapped actor: rollouts, evaluation, saving
    reference: Any
    tok: Any
    optimizer: Any
    scheduler: Any
    params: SamplingParams
    generator: torch.Generator
    summary: dict = field(default_factory=dict)
    checkpointer: Any = None  # rlhfkit.runtime.checkpoint.Checkpointer
    guard: Any = None  # NonFiniteGuard: counts skipped optimiser steps
    resume_from: Any = None  # the checkpoint to continue from (Path), or None
    iteration: int = 0  # the iteration being run (set by `sample`), for messages
    backend: Any = None  # generation backend (rollout/backends.py); None = HF generate

    @property
    def device(self):
        return self.accelerator.device

    @property
    def world(self) -> int:
        """Number of processes; per-process batch sizes times this are the global ones."""
        return self.accelerator.num_processes

    def mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        """Metrics averaged over processes (each process has its own rollout)."""
        return mean_over_processes(self.accelerator, metrics)

    def generation_context(self):
        """Context manager around sampling: full weights under DeepSpeed ZeRO-3, else nothing."""
        return generation_weights(self.accelerator, self.core)

    @property
    def start(self) -> int:
        """First iteration to run: 0, or the checkpoint's step after `resume`."""
        return self.checkpointer.start

    def resume(self, **objects) -> int:
        """Register the trainer's own state (e.g. kl_ctl=...), then restore everything from the
        checkpoint when resuming. Call before `evaluating`, which then skips the before-evaluation."""
        return self.checkpointer.resume(self.resume_from, **objects)

    def stop_signals(self):
        """Context manager: SIGINT/SIGTERM end the run after the current iteration, with a checkpoint."""
        return self.checkpointer.signals

    def end_iteration(self, iteration: int) -> None:
        """After logging: checkpoint when due, or on a stop signal (then raise Interrupted)."""
        self.checkpointer.end_step(iteration)

    def evaluating(self):
        """Context manager: held-out reward before and after the wrapped training."""
        from rlhfkit.trainers.setup import eval_before_after

        return eval_before_after(self.core, self.tok, self.eval_records, self.reward_fn, self.cfg, self.params,
                                 self.tracker, self.summary, self.device, self.generation_context)

    def sample(self, records: list[dict], iteration: int) -> Rollout:
        """Sampled and scored responses, no teacher-forced pass yet."""
        from rlhfkit.runtime.seeding import sampling_seed

        self.iteration = iteration
        seed = sampling_seed(self.cfg.seed, self.accelerator.process_index, iteration)
        with self.tracker.phase("rollout", None), self.generation_context():
            if self.backend is not None:
                self.backend.sync(self.core.policy)  # vLLM: this iteration's weights
            return sample_rollout(self.core, self.tok, records, self.cfg, self.params, seed, self.reward_fn,
                                  self.device, self.backend)

    def score(self, rollout: Rollout, order: torch.Tensor) -> Rollout:
        """The teacher-forced pass, grouped by `order` (the first update epoch's shuffle)."""
        t0 = time.perf_counter()
        with self.tracker.phase("scoring", None), autocast(self.cfg.dtype, self.device):
            score_rollout(self.core, self.reference, rollout, self.cfg.temperature, self.cfg.micro_batch_size, order,
                          keep_trunk_mb=getattr(self.cfg, "trunk_cache_mb", 0.0))
        rollout.timings["timing/logprobs_s"] = time.perf_counter() - t0
        return rollout

    def rollout(self, records: list[dict], iteration: int, order: torch.Tensor) -> Rollout:
        return self.score(self.sample(records, iteration), order)

    def update(self, rollout: Rollout, loss_fn: LossFn, epochs: int, mini_batch_size: int,
               first_perm: torch.Tensor, group_size: int = 1) -> dict[str, float]:
        cfg = self.cfg
        with self.tracker.phase("update", None):
            return update_policy(self.model, self.optimizer, self.scheduler, self.accelerator, rollout, loss_fn,
                                 epochs=epochs, mini_batch_size=mini_batch_size,
                                 micro_batch_size=cfg.micro_batch_size, max_grad_norm=cfg.max_grad_norm,
                                 ratio_check_tol=cfg.ratio_check_tol, generator=self.generator,
                                 first_perm=first_perm, guard=self.guard, where=f"iteration {self.iteration}, ",
                                 group_size=group_size)

    def log(self, iteration: int, rollout: Rollout, metrics: dict[str, float], times: tuple[float, float, float],
            extra_sample_fields: dict[str, list] | None = None) -> None:
        """Add lr/timing/throughput to `metrics`, log them (averaged over processes; throughput
        summed) and a few samples of the main process's rollout."""
        t0, t1, t2 = times
        metrics.update({"params/lr": self.scheduler.get_last_lr()[0], "params/max_grad_norm": self.cfg.max_grad_norm,
                        "timing/rollout_s": t1 - t0, "timing/update_s": t2 - t1,
                        "throughput/tokens_per_s": rollout.response_mask.sum().item() / max(t2 - t0, 1e-9)})
        metrics = self.mean_over_processes(metrics)
        metrics["throughput/tokens_per_s"] *= self.world
        self.tracker.log(iteration, metrics)
        per_seq = (rollout.rewards * rollout.response_mask).sum(1)
        extra = extra_sample_fields or {}
        rows = []
        for i in range(min(self.cfg.log_samples, len(rollout.completions))):
            rows.append({"prompt": rollout.prompts[i], "completion": rollout.completions[i],
                         "score": float(rollout.scores[i]), "reward": float(per_seq[i]),
                         **{k: v[i] for k, v in extra.items()}})
        self.tracker.log_samples(iteration, rows)

    def finish(self) -> dict:
        """The final checkpoint, the final policy (and merged weights when asked), summary.json."""
        self.checkpointer.finish(self.cfg.iterations)
        state = full_state_dict(self.accelerator, self.model)  # FSDP / ZeRO-3: gathered on every process
        if self.accelerator.is_main_process:
            from rlhfkit.models.policy import save_actor

            save_actor(self.core, self.tok, self.run_dir / "final", state_dict=state)
            if self.cfg.save_merged and self.cfg.lora and state is None:
                save_actor(self.core, self.tok, self.run_dir / "final" / "merged", merge=True)
            elif self.cfg.save_merged and self.cfg.lora:
                self.tracker.print("[save] save_merged skipped: the weights are sharded (FSDP/ZeRO-3); the adapter "
                                   "in final/ merges with `peft` after training")
            self.tracker.write_json("summary.json", self.summary)
        self.tracker.close()
        return self.summary


def start_run(cfg, command: str, build_models: Callable) -> RLRun:
    """Accelerator, seeds, run folder, tracker, data and reward, models, optimiser, sampling params.

    `build_models(cfg) -> (actor, reference | None, tokenizer)`.
    """
    from accelerate import Accelerator

    from rlhfkit.models.loading import resolve_dtype, resolve_model_path
    from rlhfkit.rollout.backends import make_backend
    from rlhfkit.runtime.allocator import tune_malloc
    from rlhfkit.runtime.checkpoint import Checkpointer, open_run_dir
    from rlhfkit.runtime.config import save_config
    from rlhfkit.runtime.distributed import agree_on_run_name, configure_deepspeed
    from rlhfkit.runtime.seeding import seed_everything
    from rlhfkit.runtime.tracker import Tracker
    from rlhfkit.trainers.common import PromptStream, make_optimizer
    from rlhfkit.trainers.setup import prepare_data, prompt_limit

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    seed_everything(cfg.seed)
    tune_malloc()  # freed CPU tensors stay in the process for reuse (runtime/allocator.py)
    cfg.dtype = resolve_dtype(cfg.dtype)  # config.yaml records what actually ran
    # Data, reward, models and prompt lengths are checked before the run folder exists: bad input
    # stops with one line and leaves nothing behind.
    reward_fn, train_records, eval_records = prepare_data(cfg)
    actor, reference, tok = build_models(cfg)
    max_prompt_length = prompt_limit(cfg, tok, actor, train_records, eval_records)
    agree_on_run_name(accelerator, cfg, command)
    run_dir, resume_from = open_run_dir(cfg, command)
    if accelerator.is_main_process:
        save_config(cfg, run_dir / "config.yaml")
    tracker = Tracker(run_dir, cfg.iterations, cfg.quiet, accelerator.is_main_process, cfg.tensorboard, cfg.wandb)
    optimizer, scheduler = make_optimizer(actor.parameters(), cfg.lr, cfg.warmup_steps, cfg.weight_decay, cfg.adam_eps)
    configure_deepspeed(accelerator, cfg.micro_batch_size, cfg.max_grad_norm)
    model, optimizer, scheduler = accelerator.prepare(actor, optimizer, scheduler)
    if reference is not None:
        reference.to(accelerator.device)  # the frozen copy is not prepared; offloaded: stays in CPU memory
    backend = make_backend(cfg, resolve_model_path(cfg.model), accelerator.num_processes, tracker.print)
    stop_ids = tuple(cfg.stop_ids or [tok.eos_token_id])
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, stop_ids, max_prompt_length)
    run = RLRun(cfg=cfg, accelerator=accelerator, run_dir=run_dir, tracker=tracker, reward_fn=reward_fn,
                eval_records=eval_records, model=model,
                stream=PromptStream(train_records, cfg.seed, accelerator.process_index, accelerator.num_processes),
                core=accelerator.unwrap_model(model), reference=reference, tok=tok, optimizer=optimizer,
                scheduler=scheduler, params=params, generator=torch.Generator().manual_seed(cfg.seed),
                summary={"run_dir": str(run_dir)}, guard=NonFiniteGuard.for_config(cfg, tracker.print),
                resume_from=resume_from, backend=backend)
    run.checkpointer = Checkpointer(cfg, run_dir, command, accelerator, tracker, model=run.core, optimizer=optimizer,
                                    scheduler=scheduler, objects={"stream": run.stream, "generator": run.generator,
                                                                  "summary": run.summary}, guard=run.guard,
                                    total=cfg.iterations)
    return run

