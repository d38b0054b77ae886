"""The run harness of the offline trainers (sft, rm, dpo/simpo/orpo, kto), as trainers/rl.py's
`RLRun` is for the on-policy ones: set-up, the optimiser step, the evaluations and the final save,
written once; each trainer keeps its data, its loss and one loop over these pieces:

    launch = Launch(cfg)                          # accelerator, seeds, the run folder checked
    ... data and models (checked before the run folder exists; preference_models for the judged ones) ...
    with OfflineRun(launch, "dpo", steps, model, optimizer, scheduler, epoch_size=N, reference=...,
                    summary=dict(train_pairs=N)) as h:   # RUN/ opened, the model prepared, resumed
        h.judge_before(...) | h.evaluate_before(...)  # once per run (a resumed run keeps the first)
        for step in h.steps():
            t0 = time.time()
            metrics = <the trainer's accumulation>    # runtime/accumulate.py
            metrics.update(h.optimizer_step(metrics["loss/..."], step))
            h.log(step, h.timed(metrics, t0))         # (+ h.evaluate_due(...) where the trainer evaluates)
        return h.finish(save)                         # RUN/final (h.finish_judged: judged, then the policy)

Every trainer steps alike (`optimizer_step`, runtime/run.py): clip and step unless non-finite
(runtime/faults.py), then give the step's freed heap back (core/allocator.py): the next step's widths
differ, so its chunks would not reuse those blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from rlhfkit.core.bounds import check_planned_steps, check_warmup
from rlhfkit.core.config import check
from rlhfkit.estimate.memory import check_rollout_fits
from rlhfkit.rewards import get_reward
from rlhfkit.runtime.final_folder import actor_saver
from rlhfkit.runtime.run import Launch, Run
from rlhfkit.trainers.options import ExamplesArgs


def check_offline_work(cfg, total: int) -> None:
    """Before the run folder exists: the `total` optimiser steps the data and epochs plan (core/bounds.py),
    a warm-up the run could never finish by a wide margin, and a batch whose token tensors alone
    outgrow the machine's memory (batch_size=1e9 would build its batch for minutes, deaf to signals)."""
    check_planned_steps(total, f"epochs ({cfg.epochs}) over the data at batch_size {cfg.batch_size}")
    check_warmup(cfg.warmup_steps, total, cfg.lr)
    tokens = cfg.max_length if isinstance(cfg, ExamplesArgs) else cfg.max_prompt_length + cfg.max_response_length
    check_rollout_fits(cfg.batch_size, tokens, 0, option=("batch_size", cfg.batch_size),
                       what="its batch's token tensors")


def preference_models(launch: Launch, build: Callable) -> tuple:
    """(judge, policy, reference or None, tokenizer): the judge resolved, then `build(cfg)`'s models on the
    device before the run is built (the reference passes and the judge's samples run first)."""
    judge = get_reward(launch.cfg.judge)
    model, reference, tok = build(launch.cfg)
    model.to(launch.device)
    if reference is not None:
        reference.to(launch.device)  # a frozen copy stays in CPU memory when offloaded
    return judge, model, reference, tok


class OfflineRun(Run):
    """One offline training run (runtime/run.py `Run`: see the module docstring for the sequence), complete
    when built: `batch_size` divisible by the processes and the planned work checked (check_offline_work),
    the run folder and metrics for `total` optimiser steps opened, the model prepared, a frozen `reference`
    still in use sharded like it under FSDP2 and, when resuming, weights, optimiser, RNG and `objects`
    restored (with the judged scores before training). Given the `epoch_size` (examples or pairs an
    epoch), each step logs params/epoch."""

    def __init__(self, launch: Launch, command: str, total: int, model, optimizer, scheduler, *,
                 epoch_size: int | None = None, reference=None, summary: dict | None = None, **objects):
        cfg = launch.cfg
        check(cfg.batch_size % launch.world == 0,
              f"batch_size ({cfg.batch_size}) must be divisible by the {launch.world} processes")
        check_offline_work(cfg, total)
        self.judged: dict = {}  # the starting model's judged scores ("before"), kept in checkpoints
        self.epoch_size = epoch_size
        super().__init__(launch, command, total, model, optimizer, scheduler, cfg.micro_batch_size, unit="step",
                         summary=summary, reference=reference, judged=self.judged, **objects)
        try:
            self.resume()
        except BaseException as e:
            self.close(e)
            raise

    # ---- the loop -----------------------------------------------------------------------
    def optimizer_step(self, loss: float, step: int) -> dict[str, float]:
        """Run.optimizer_step (+ params/epoch)."""
        out = super().optimizer_step(loss, step)
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
        with self.evaluation("before"):
            result = self.once("eval_before", evaluate)
        self.print(line(result))

    def evaluate_due(self, step: int, every: int, evaluate: Callable[[], dict]) -> dict:
        """`evaluate()` after step `step` when due (summary eval_after), else {}."""
        if not self.eval_due(step, every):
            return {}
        self.summary["eval_after"] = evaluate()
        return self.summary["eval_after"]

    def evaluate_after(self, line: Callable[[dict], str]) -> None:
        """The last evaluation's line, when there was one."""
        if "eval_after" in self.summary:
            self.print(line(self.summary["eval_after"]))

    def judge_before(self, model, tok, records: list[dict], judge) -> None:
        """The starting model's judged samples on `records` (trainers/judged.py), once per run."""
        from rlhfkit.trainers.judged import judge_before

        judge_before(self, model, tok, records, judge, self.judged)

    def held_out(self, metrics: dict[str, float], line: Callable[[dict], str]) -> None:
        """The held-out metrics after training: summary held_out, and their line."""
        self.summary["held_out"] = metrics
        self.print(line(metrics))

    def finish_judged(self, model, tok, records: list[dict], judge, held_out: bool) -> dict:
        """The trained model's judged samples on `records` and their win rate over the starting model's
        (same seed, trainers/judged.py), then the policy saved (`actor_saver`); returns the summary."""
        from rlhfkit.trainers.judged import judged_after

        judged_after(self, model, tok, records, judge, self.judged.get("before"), "held-out" if held_out else "training")
        return self.finish(actor_saver(self, model, tok))
