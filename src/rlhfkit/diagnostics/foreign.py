"""Metric logs written by other tools, renamed to rlhfkit's metrics so the rules can read them.

TRL (and transformers' Trainer under it) keep a run's log in OUTPUT_DIR/trainer_state.json:
``log_history`` holds one dict per logging step with a ``step`` key (an evaluation adds a second
dict at the same step). The same dicts written one per line (a JSONL file from a logging callback)
read the same way. A name is mapped only where both tools compute the same quantity (checked
against TRL's code): TRL PPO's ``objective/entropy`` is a summed negative log-prob, not a
token entropy, so it stays unmapped, and GRPO's ``kl`` is a per-token k3 mean, so it becomes
``loss/kl`` rather than the per-sequence ``rollout/kl``. Unknown names pass through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Mapping = dict[str, tuple[str, Callable[[float], float] | None]]


def _same(names: dict[str, str]) -> Mapping:
    return {theirs: (ours, None) for theirs, ours in names.items()}


# transformers' Trainer, under every TRL trainer except PPO
TRAINER = _same({"grad_norm": "params/grad_norm", "learning_rate": "params/lr", "eval_loss": "eval/loss"})
TRL_PPO = _same({
    "objective/kl": "rollout/kl",  # mean over sequences of the summed k1 (logprob - ref_logprob)
    "objective/rlhf_reward": "rollout/reward_mean",  # score + summed -kl_coef * KL, per sequence
    "objective/scores": "rollout/score_mean",
    "objective/non_score_reward": "rollout/non_score_reward",
    "policy/approxkl_avg": "params/approx_kl",  # 0.5 * mean(logratio^2): k2
    "policy/clipfrac_avg": "params/policy_clip_frac",  # strict >, as rlhfkit
    "loss/policy_avg": "loss/policy",
    "loss/value_avg": "loss/value",  # 0.5 * max of clipped and unclipped squared errors
    "val/clipfrac_avg": "params/value_clip_frac",
    "policy/entropy_avg": "rollout/entropy",  # token entropy of the update's logits
    "val/ratio": "params/ratio_mean",
    "lr": "params/lr",
})
TRL_GRPO = {
    **_same({
        "reward": "rollout/reward_mean",
        "reward_std": "rollout/group_reward_std",  # mean within-group std, not the batch std
        "frac_reward_zero_std": "rollout/zero_std_group_fraction",
        "kl": "loss/kl",  # token mean of k3
        "entropy": "rollout/entropy",
        "clip_ratio/region_mean": "params/policy_clip_frac",  # the clip active: A > 0 above, A < 0 below
        "completions/mean_length": "rollout/response_length",
        "completion_length": "rollout/response_length",  # older TRL
        "loss": "loss/total",
    }),
    "completions/clipped_ratio": ("rollout/stop_fraction", lambda x: 1.0 - x),  # share that hit the length limit
}
TRL_DPO = _same({"rewards/accuracies": "rewards/accuracy", "rewards/margins": "rewards/margin", "loss": "loss/dpo"})
TRL_SFT = _same({"loss": "loss/sft"})

# kind -> (names whose presence identifies it, its mapping); the first kind that matches wins
KINDS: dict[str, tuple[frozenset[str], Mapping]] = {
    "TRL PPO": (frozenset({"objective/kl", "objective/rlhf_reward", "policy/approxkl_avg"}), TRL_PPO),
    "TRL DPO": (frozenset({"rewards/accuracies", "rewards/margins"}), {**TRAINER, **TRL_DPO}),
    "TRL GRPO": (frozenset({"reward_std", "frac_reward_zero_std", "completions/mean_length", "completion_length",
                            "clip_ratio/region_mean"}), {**TRAINER, **TRL_GRPO}),
    "TRL SFT / transformers Trainer": (frozenset({"loss", "eval_loss"}), {**TRAINER, **TRL_SFT}),
}
STEP_KEYS = ("iteration", "step", "global_step", "_step")
SUMMARY_KEYS = ("train_runtime", "total_flos")  # the Trainer's end-of-training row: not an iteration


def detect(keys: set[str]) -> str | None:
    """The kind of log whose names ``keys`` (all rows' keys) are, or None for an rlhfkit log."""
    if any(k.startswith(("rollout/", "params/")) for k in keys):
        return None  # rlhfkit's own names (TRL PPO uses neither namespace)
    return next((kind for kind, (marks, _) in KINDS.items() if keys & marks), None)


def rename(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None, list[str]]:
    """(rows with rlhfkit names, the kind detected or None, "theirs -> ours" for each name used).
    A row that already has the rlhfkit name keeps its own value."""
    keys = set().union(*(r.keys() for r in rows)) if rows else set()
    kind = detect(keys)
    if kind is None:
        return rows, None, []
    mapping = KINDS[kind][1]
    used = sorted(k for k in keys if k in mapping)
    out = []
    for row in rows:
        new = dict(row)
        for theirs in used:
            if theirs in row and isinstance(row[theirs], (int, float)) and not isinstance(row[theirs], bool):
                ours, fn = mapping[theirs]
                new.setdefault(ours, fn(row[theirs]) if fn else row[theirs])
        out.append(new)
    return out, kind, [f"{k} -> {mapping[k][0]}" for k in used]


def with_iterations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows keyed by iteration: "iteration", else the first of step / global_step / _step; rows with
    the same step (a training and an evaluation log) merged; the Trainer's summary row dropped."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        if any(k in row for k in SUMMARY_KEYS):
            continue
        step = next((row[k] for k in STEP_KEYS if k in row), None)
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        merged.setdefault(step, {}).update({k: v for k, v in row.items() if k not in STEP_KEYS})
        merged[step]["iteration"] = step
    return [merged[i] for i in sorted(merged)]


def find_trainer_state(folder: Path) -> Path | None:
    """folder/trainer_state.json, else the one in the checkpoint-N subfolder with the largest N."""
    direct = folder / "trainer_state.json"
    if direct.is_file():
        return direct

    def number(p: Path) -> int:
        tail = p.parent.name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    found = sorted(folder.glob("checkpoint-*/trainer_state.json"), key=number)
    return found[-1] if found else None


def read_trainer_state(path: Path) -> list[dict[str, Any]]:
    """The ``log_history`` dicts of a trainer_state.json (ValueError when it has none)."""
    state = json.loads(path.read_text(encoding="utf-8"))
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ValueError("no 'log_history' list (is it a transformers/TRL trainer_state.json?)")
    return [row for row in history if isinstance(row, dict)]
