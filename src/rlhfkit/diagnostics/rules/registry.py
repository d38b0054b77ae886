"""The rule registry itself (`RULES`, the `rule` decorator, `finding`); the package's __init__
imports the rule modules, which register their rules here."""

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
