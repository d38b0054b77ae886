"""Supervised fine-tuning rules."""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

EVAL = "eval/loss"
TRAIN = "loss/sft"


@rule("eval_loss_rising", metrics=(EVAL, TRAIN), trainers=("sft",),
      summary="eval loss rises while the training loss falls (overfitting)")
def eval_loss_rising(h: History, t: Thresholds) -> list[Finding]:
    """Latest eval/loss more than eval_rise_rel above its best (an earlier evaluation) while
    loss/sft is lower now than at that best evaluation."""
    cur = h.current(EVAL)
    evals = h.series(EVAL)
    if cur is None or len(evals) < 3:
        return []
    best_it, best = min(evals[:-1], key=lambda p: p[1])
    if best <= 0 or cur <= best * (1 + t.eval_rise_rel):
        return []
    train = dict(h.series(TRAIN))
    train_then = train.get(best_it)
    train_now = h.current(TRAIN)
    if train_then is None or train_now is None or train_now >= train_then:
        return []
    return finding(
        "eval_loss_rising", "warning", h,
        f"eval loss rose from its best {fmt(best)} at iteration {best_it} to {fmt(cur)} while the "
        f"training loss fell {fmt(train_then)} -> {fmt(train_now)}: overfitting",
        {"metric": EVAL, "iterations": [best_it, h.iteration], "values": [best, cur],
         "train_loss": [train_then, train_now], "threshold": t.eval_rise_rel},
        f"Keep the checkpoint from iteration {best_it}; train fewer epochs, lower the learning "
        "rate, add more data or use LoRA (lora=true) with a smaller lora_r or some lora_dropout.",
        score=(cur / best - 1) / t.eval_rise_rel,
    )
