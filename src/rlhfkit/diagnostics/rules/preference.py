"""Preference-learning rules (DPO and reward models)."""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt, iterations, mean, values
from rlhfkit.diagnostics.rules.common import lr_hint
from rlhfkit.diagnostics.rules.generation import baseline_and_recent, shift_evidence, span
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

CHOSEN = "logps/chosen"
REJECTED = "logps/rejected"
ACCURACY_KEYS = ("rewards/accuracy", "rm/accuracy")


@rule("dpo_chosen_logps_falling", metrics=(CHOSEN, REJECTED), trainers=("dpo",),
      summary="DPO lowers the likelihood of the chosen answers")
def dpo_chosen_logps_falling(h: History, t: Thresholds) -> list[Finding]:
    """Recent logps/chosen more than dpo_logp_drop nats below its baseline."""
    pts = baseline_and_recent(h, CHOSEN, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    drop = b - r
    if drop < t.dpo_logp_drop:
        return []
    rej = baseline_and_recent(h, REJECTED, t)
    rej_txt = ""
    rej_drop = None
    if rej is not None:
        rej_drop = mean(rej[0]) - mean(rej[1])
        rej_txt = f" (rejected fell {fmt(rej_drop)} nats)"
    return finding(
        "dpo_chosen_logps_falling", "warning", h,
        f"log-prob of the chosen answers fell {fmt(drop)} nats, {fmt(b)} -> {fmt(r)} (iterations "
        f"{span(base)} -> {span(recent)}){rej_txt}: the margin grows by pushing both answers down",
        shift_evidence(CHOSEN, base, recent, drop=drop,
                       rejected_drop=rej_drop, threshold=t.dpo_logp_drop),
        "Likelihood displacement: add an NLL (SFT) term on the chosen answers (RPO / DPOP), raise "
        "beta, lower the learning rate" + lr_hint(h) + " or train fewer epochs; check generations, "
        "since probability mass leaving both answers can go to unrelated text.",
        score=drop / t.dpo_logp_drop,
    )


@rule("preference_accuracy_low", metrics=ACCURACY_KEYS, trainers=("dpo", "rm"),
      summary="preference accuracy at chance after many iterations")
def preference_accuracy_low(h: History, t: Thresholds) -> list[Finding]:
    """Mean of rewards/accuracy (DPO) or rm/accuracy (RM) over pref_window iterations at or
    below pref_accuracy_min, once pref_min_iterations values were logged."""
    out: list[Finding] = []
    for key in ACCURACY_KEYS:
        if h.current(key) is None or h.count(key) < t.pref_min_iterations:
            continue
        window = h.tail(key, t.pref_window)
        level = mean(window)
        if level > t.pref_accuracy_min:
            continue
        out += finding(
            "preference_accuracy_low", "warning", h,
            f"{key} averages {fmt(level)} over iterations {span(window)} after "
            f"{h.count(key)} iterations: no better than chance",
            {"metric": key, "iterations": iterations(window), "values": values(window), "mean": level,
             "threshold": t.pref_accuracy_min},
            "Check the data (chosen/rejected swapped? identical pairs? truncation cutting off the "
            "part that differs), that the loss reads scores/log-probs at the right tokens, and the "
            "learning rate" + lr_hint(h) + "; a LoRA reward model must also train its score head.",
            score=1.0, key=key,
        )
    return out
