"""Distillation rules: the divergence to the teacher should fall as the student learns.

The student's entropy collapsing is `entropy_collapse` (rules/generation.py), which reads the
rollout/entropy distillation logs too.
"""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt, mean
from rlhfkit.diagnostics.rules.common import lr_hint
from rlhfkit.diagnostics.rules.generation import baseline_and_recent, shift_evidence, span
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

REVERSE_KL = "distill/reverse_kl"
JSD = "distill/jsd"


@rule("teacher_divergence_rising", metrics=(REVERSE_KL, JSD), trainers=("distill",),
      summary="the student moves away from its teacher")
def teacher_divergence_rising(h: History, t: Thresholds) -> list[Finding]:
    """Recent distill/reverse_kl (else distill/jsd) above teacher_kl_rise_factor x its baseline and
    above teacher_kl_floor (nats per token)."""
    key = REVERSE_KL if h.current(REVERSE_KL) is not None else JSD
    pts = baseline_and_recent(h, key, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    if r <= t.teacher_kl_floor or r <= t.teacher_kl_rise_factor * max(b, 0.0):
        return []
    return finding(
        "teacher_divergence_rising", "warning", h,
        f"{key} rose from {fmt(b)} (iterations {span(base)}) to {fmt(r)} nats/token "
        f"(iterations {span(recent)}): the student is moving away from its teacher",
        shift_evidence(key, base, recent, threshold=t.teacher_kl_rise_factor),
        "Distillation should bring the student closer: lower the learning rate" + lr_hint(h) + ", check "
        "that the teacher shares the student's tokenizer and chat template and samples at the same "
        "temperature, and read samples.jsonl for degenerate answers.",
        score=r / max(t.teacher_kl_rise_factor * max(b, t.teacher_kl_floor), 1e-12),
    )
