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

# Importing the modules registers their rules (order = report order).
from rlhfkit.diagnostics.rules import (  # noqa: E402,F401
    common,
    distill,
    generation,
    grpo,
    ppo,
    preference,
    sft,
)
from rlhfkit.diagnostics.rules.registry import RULES, Rule, finding, rule

__all__ = ["RULES", "Rule", "rule", "finding"]
