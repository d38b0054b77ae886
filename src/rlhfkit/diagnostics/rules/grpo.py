"""GRPO / RLOO rules: the within-group reward spread that group-relative advantages need."""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt, iterations, mean, values
from rlhfkit.diagnostics.rules.generation import baseline_and_recent, shift_evidence, span
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

GROUP_STD = "rollout/group_reward_std"
SOLVED = "rollout/solved_fraction"


@rule("group_reward_std_collapse", metrics=(GROUP_STD,), trainers=("grpo", "rloo"),
      summary="completions of a prompt all get the same reward (no learning signal)")
def group_reward_std_collapse(h: History, t: Thresholds) -> list[Finding]:
    """Recent rollout/group_reward_std below group_std_collapse_frac of its baseline."""
    pts = baseline_and_recent(h, GROUP_STD, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    if b <= 0 or r >= t.group_std_collapse_frac * b:
        return []
    return finding(
        "group_reward_std_collapse", "warning", h,
        f"within-group reward std fell from {fmt(b)} (iterations {span(base)}) to {fmt(r)} "
        f"(iterations {span(recent)}): group-relative advantages are ~0, little is learned",
        shift_evidence(GROUP_STD, base, recent, threshold=t.group_std_collapse_frac),
        "Every completion of a prompt gets the same reward: sample more completions per prompt "
        "(group_size) or at a higher temperature, use a graded (not only 0/1) reward, drop prompts "
        "that are always or never solved, and check rollout/entropy for collapse.",
        score=t.group_std_collapse_frac * b / max(r, 1e-12),
    )


@rule("solved_fraction_extreme", metrics=(SOLVED,), trainers=("grpo", "rloo"),
      summary="(almost) every or no prompt solved")
def solved_fraction_extreme(h: History, t: Thresholds) -> list[Finding]:
    """Mean rollout/solved_fraction over solved_window iterations >= solved_high (info: the task
    is saturated) or <= solved_low (warning: no group has a success to learn from)."""
    if h.current(SOLVED) is None:
        return []
    window = h.tail(SOLVED, t.solved_window)
    if len(window) < t.solved_window:
        return []
    level = mean(window)
    ev = {"metric": SOLVED, "iterations": iterations(window), "values": values(window), "mean": level}
    if level >= t.solved_high:
        return finding(
            "solved_fraction_extreme", "info", h,
            f"{fmt(100 * level)}% of prompts solved over iterations {span(window)}: the task is saturated",
            {**ev, "threshold": t.solved_high},
            "Little is left to learn here: stop, or move to harder prompts.",
            score=1.0, key="saturated",
        )
    if level <= t.solved_low:
        return finding(
            "solved_fraction_extreme", "warning", h,
            f"only {fmt(100 * level)}% of prompts solved over iterations {span(window)}: "
            "almost no group contains a success",
            {**ev, "threshold": t.solved_low},
            "The task is too hard for the current policy: start from an SFT model, use easier "
            "prompts (a curriculum), sample more completions per prompt, or add partial credit "
            "(format reward). Check that the answer parser accepts the model's format.",
            score=1.0, key="unsolved",
        )
    return []
