"""The `Finding` record that every diagnostic rule emits.

A finding says *what* is wrong (``rule``, ``message``), *how bad* (``severity``), *where*
(``iteration`` and the numbers in ``evidence``), and *what to do* (``action``).

Severities, in increasing order:

- ``info``: worth knowing, often not a problem (a reward plateau after progress).
- ``warning``: probably hurting the run; act before the next run.
- ``critical``: the run is broken or diverging (non-finite values, log-prob mismatch,
  exploding updates); stop and fix. ``rlhfkit doctor`` exits with status 1 on these.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical (ValueError for anything else)."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}") from None


def _json_safe(value: Any) -> Any:
    """Evidence as plain JSON: non-finite floats become strings, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


@dataclass
class Finding:
    """One diagnosis of a training-health problem at one iteration.

    Attributes:
        rule: name of the rule in ``rlhfkit.diagnostics.RULES`` that produced it.
        severity: "info", "warning" or "critical".
        iteration: the iteration at which the rule fired (the last one it looked at).
        message: one sentence with the numbers, e.g. "policy clip fraction 0.80 ...".
        evidence: the numbers behind the message. Always has ``iterations`` (the
            iterations whose values were used) and usually ``metric`` and ``values``.
        action: what to try, most likely fix first.
        key: distinguishes independent findings of one rule (e.g. the metric a
            ``loss_spike`` is about); "" when a rule has a single identity.
        score: how far past its threshold the problem is (>= 1 when at or past it),
            comparable between findings of the same rule; the Monitor re-reports a
            finding when this grows (see ``Thresholds.worsen_margin``).
    """

    rule: str
    severity: str
    iteration: int
    message: str
    evidence: dict = field(default_factory=dict)
    action: str = ""
    key: str = ""
    score: float = 1.0

    def __post_init__(self) -> None:
        severity_rank(self.severity)  # validate

    @property
    def identity(self) -> tuple[str, str]:
        """(rule, key): findings with the same identity are the same problem."""
        return (self.rule, self.key)

    @property
    def rank(self) -> int:
        return severity_rank(self.severity)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (one line of diagnostics.jsonl)."""
        d = asdict(self)
        d["evidence"] = _json_safe(self.evidence)
        d["score"] = _json_safe(float(self.score))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """Inverse of `to_dict`; unknown keys are ignored (forward compatibility)."""
        score = d.get("score", 1.0)
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = 1.0
        return cls(
            rule=str(d["rule"]),
            severity=str(d["severity"]),
            iteration=int(d["iteration"]),
            message=str(d.get("message", "")),
            evidence=dict(d.get("evidence") or {}),
            action=str(d.get("action", "")),
            key=str(d.get("key", "")),
            score=score,
        )

    def one_line(self) -> str:
        """`[warning] rule @ it 7: message` (for logs)."""
        return f"[{self.severity}] {self.rule} @ it {self.iteration}: {self.message}"


def summarize(findings: list[Finding]) -> list[Finding]:
    """The worst finding per (rule, key), most severe first, then by iteration.

    "Worst" = highest severity, then highest score, then latest.
    """
    best: dict[tuple[str, str], Finding] = {}
    for f in findings:
        cur = best.get(f.identity)
        if cur is None or (f.rank, f.score, f.iteration) >= (cur.rank, cur.score, cur.iteration):
            best[f.identity] = f
    return sorted(best.values(), key=lambda f: (-f.rank, f.iteration, f.rule, f.key))
