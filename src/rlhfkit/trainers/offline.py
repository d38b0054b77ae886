"""The run harness of the offline trainers (sft, rm, dpo/simpo/orpo, kto), as trainers/rl.py's
`RLRun` is for the on-policy ones: set-up, the optimiser step, the evaluations and the final save,
written once; each trainer keeps its data, its loss and one loop over these pieces:

    h = OfflineRun(cfg, "dpo")                    # Run: accelerator, seeds, the run folder checked
    ... data and models (checked before the run folder exists; preference_models for the judged ones) ...
    h.open(steps, N, train_pairs=N)               # batch_size divisible by the processes; RUN/ opened
    model = h.start(model, optimizer, scheduler)  # prepare, shard a frozen reference, resume
    h.judge_before(...) | h.evaluate_before(...)  # once per run (a resumed run keeps the first)
    for step in h.run.steps():
        t0 = time.time()
        metrics = <the trainer's accumulation>    # runtime/accumulate.py
        metrics.update(h.optimizer_step(model, metrics["loss/..."], step))
        h.run.log(step, h.timed(metrics, t0))     # (+ h.evaluate_due(...) where the trainer evaluates)
    return h.finish(save)                         # RUN/final (h.finish_judged: judged, then the policy)

Every trainer steps alike (runtime/optim.py `optimizer_step`): clip and step unless non-finite
(runtime/faults.py), then give the step's freed heap back (core/allocator.py): the next step's widths
differ, so its chunks would not reuse those blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from rlhfkit.core.config import check
from rlhfkit.core.seeding import EVAL_SEED_OFFSET
from rlhfkit.runtime.optim import optimizer_step
from rlhfkit.runtime.run import Run, actor_saver


class OfflineRun:
    """One offline training run over a `Run` (runtime/run.py): see the module docstring for the sequence."""

    def __init__(self, cfg, command: str):
        self.cfg, self.run = cfg, Run(cfg, command)
        self.judged: dict = {}  # the starting model's judged scores ("before"), kept in checkpoints
        self.epoch_size: int | None = None

    # ---- set-up -------------------------------------------------------------------------
    def preference_models(self, build: Callable) -> tuple:
        """(judge, policy, reference or None, tokenizer): the judge resolved, then `build(cfg)`'s models
        on the device before `start` (the reference passes and the judge's samples run first)."""
        from rlhfkit.rewards import get_reward

        judge = get_reward(self.cfg.judge)
        model, reference, tok = build(self.cfg)
        model.to(self.run.device)
        if reference is not None:
            reference.to(self.run.device)  # a frozen copy stays in CPU memory when offloaded
        return judge, model, reference, tok

    def open(self, total: int, epoch_size: int | None = None, **counts) -> None:
        """The run folder, metrics and progress for `total` optimiser steps; `counts` join the summary.
        Given the `epoch_size` (examples or pairs an epoch), each step logs params/epoch."""
        self.epoch_size = epoch_size
        world = self.run.world
        check(self.cfg.batch_size % world == 0, f"batch_size ({self.cfg.batch_size}) must be divisible by the {world} processes")
        self.run.open(total=total, unit="step", **counts)

    def start(self, model, optimizer, scheduler, reference=None, **state):
        """The prepared model (DDP/FSDP/DeepSpeed); a frozen reference still in use sharded like it under
        FSDP2; when resuming, weights, optimiser, RNG and `state` (e.g. judged=self.judged) restored."""
        wrapped = self.run.prepare(model, optimizer, scheduler, self.cfg.micro_batch_size, **state)
        self.run.shard_reference(reference)
        self.run.resume()
        return wrapped

    # ---- the loop -----------------------------------------------------------------------
    def optimizer_step(self, model, loss: float, step: int) -> dict[str, float]:
        """`optimizer_step` with the run's optimiser, schedule and non-finite guard (+ params/epoch)."""
        run = self.run
        out = optimizer_step(model.parameters(), run.optimizer, run.scheduler, run.accelerator, self.cfg.max_grad_norm,
                             loss, run.guard, f"step {step}")
        if self.epoch_size:
            out["params/epoch"] = (step + 1) * self.cfg.batch_size / self.epoch_size
        return out

    @staticmethod
    def timed(metrics: dict[str, float], t0: float) -> dict[str, float]:
        """`metrics` with timing/step_s, the seconds since `t0` (the step, without its evaluation)."""
        metrics["timing/step_s"] = time.time() - t0
        return metrics

    @staticmethod
    def reference_loaded(reference, device):
        """The reference on the device for a step (an offloaded frozen copy), or nothing."""
        return reference.loaded(device) if reference is not None else contextlib.nullcontext()

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate_before(self, evaluate: Callable[[], dict], line: Callable[[dict], str]) -> None:
        """`evaluate()` before training, once per run (summary eval_before), and its line."""
        self.run.print(line(self.run.once("eval_before", evaluate)))

    def evaluate_due(self, step: int, every: int, evaluate: Callable[[], dict]) -> dict:
        """`evaluate()` after step `step` when due (summary eval_after), else {}."""
        if not self.run.eval_due(step, every):
            return {}
        self.run.summary["eval_after"] = evaluate()
        return self.run.summary["eval_after"]

    def evaluate_after(self, line: Callable[[dict], str]) -> None:
        """The last evaluation's line, when there was one."""
        if "eval_after" in self.run.summary:
            self.run.print(line(self.run.summary["eval_after"]))

    def judge_before(self, model, tok, records: list[dict], judge) -> None:
        """The starting model's judged samples on `records` (trainers/judged.py), once per run."""
        from rlhfkit.trainers.judged import judged_samples

        if records and "before" not in self.judged:
            with self.run.full_weights():
                self.judged["before"] = judged_samples(model, tok, records, judge, self.cfg,
                                                       self.cfg.seed + EVAL_SEED_OFFSET)[1]

    def held_out(self, metrics: dict[str, float], line: Callable[[dict], str]) -> None:
        """The held-out metrics after training: summary held_out, and their line."""
        self.run.summary["held_out"] = metrics
        self.run.print(line(metrics))

    def finish_judged(self, model, tok, records: list[dict], judge, held_out: bool) -> dict:
        """The trained model's judged samples on `records` and their win rate over the starting model's
        (same seed, trainers/judged.py), then the policy saved (`actor_saver`); returns the summary."""
        from rlhfkit.trainers.judged import judged_after

        if records:
            with self.run.full_weights():
                judged_after(self.run, model, tok, records, judge, self.judged["before"],
                             self.cfg.seed + EVAL_SEED_OFFSET, "held-out" if held_out else "training")
        return self.finish(actor_saver(self.run, model, tok))

    def finish(self, save: Callable) -> dict:
        """RUN/final by `save(folder, state)` and summary.json (Run.finish); returns the summary."""
        return self.run.finish(save)
