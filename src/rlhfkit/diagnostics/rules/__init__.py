"""The rule registry: one small pure function per training-health rule.

A rule reads the metric history up to the current iteration and returns the findings that
hold *now* (usually zero or one). It never keeps state: repetition control (report once, again
when worse) is the Monitor's job. A rule whose metrics are missing returns nothing, so every
rule can run on every trainer's metrics.

Add a rule::

    @rule("my_rule", metrics=("params/foo",), trainers=("ppo",), summary="foo too high")
    def my_rule(h: History, t: Thresholds) -> list[Finding]:
        ...

then add its threshold(s) to `Thresholds`, a section to docs/diagnostics.md and a firing and a
silent case to tests/diagnostics/test_rules.py (a test fails until you do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History
from rlhfkit.diagnostics.thresholds import Thresholds

RuleFn = Callable[[History, Thresholds], list[Finding]]


@dataclass(frozen=True)
class Rule:
    """A registered rule: its function plus what it reads (for docs and `doctor --rules`)."""

    name: str
    func: RuleFn
    metrics: tuple[str, ...]
    trainers: tuple[str, ...]
    summary: str

    def __call__(self, h: History, t: Thresholds) -> list[Finding]:
        return self.func(h, t)


RULES: dict[str, Rule] = {}


def rule(name: str, metrics: tuple[str, ...], trainers: tuple[str, ...], summary: str) -> Callable[[RuleFn], RuleFn]:
    """Register ``func`` under ``name``. ``metrics``: what it reads (any trainer that logs them)."""

    def register(func: RuleFn) -> RuleFn:
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        RULES[name] = Rule(name, func, metrics, trainers, summary)
        return func

    return register


def finding(name: str, severity: str, h: History, message: str, evidence: dict, action: str,
            score: float = 1.0, key: str = "") -> list[Finding]:
    """A one-element list with a Finding at the current iteration (rules return lists)."""
    return [Finding(rule=name, severity=severity, iteration=h.iteration, message=message,
                    evidence=evidence, action=action, key=key, score=float(score))]


# Importing the modules registers their rules (order = report order).
from rlhfkit.diagnostics.rules import (  # noqa: E402,F401
    common,
    generation,
    grpo,
    ppo,
    preference,
    sft,
)

__all__ = ["RULES", "Rule", "rule", "finding"]
