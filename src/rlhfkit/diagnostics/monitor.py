"""Online and offline evaluation of the rules.

`Monitor.observe` is called once per iteration by a trainer (on the main process only). It
runs every rule on the history so far and returns the findings that are *news*: a problem
reported for the first time, or one that got worse since it was last reported (higher severity,
or a score ``worsen_margin`` above the last reported one). A problem that stays silent for
``rearm_after`` iterations counts as resolved and is reported again if it returns.

`diagnose` replays a whole history through a Monitor, so a finished run gets exactly the
findings it would have shown online.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History
from rlhfkit.diagnostics.rules import RULES, Rule
from rlhfkit.diagnostics.thresholds import Thresholds

log = logging.getLogger(__name__)


class Monitor:
    """Runs the rules after each iteration and reports new or worsened findings.

    Args:
        thresholds: rule thresholds (defaults: ``Thresholds()``).
        path: diagnostics.jsonl to append reported findings to (parent created), or None.
        rules: names of the rules to run (default: all in ``RULES``).
        strict: re-raise a rule's exception. By default a failing rule is logged once and
            skipped: monitoring must never stop a training run.
        history: earlier metric rows (each with "iteration") to start from, e.g. when
            resuming; the rules are replayed over them silently so old problems are not
            reported again.
        defaults: run-level values for metrics the rows may lack, e.g.
            ``{"params/max_grad_norm": 5.0}`` from the run's config (see `rundir.run_defaults`).
    """

    def __init__(self, thresholds: Thresholds | None = None, path: str | Path | None = None, *,
                 rules: Iterable[str] | None = None, strict: bool = False,
                 history: Iterable[Mapping[str, Any]] | None = None,
                 defaults: Mapping[str, float] | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self.path = Path(path) if path is not None else None
        self.strict = strict
        names = list(RULES) if rules is None else list(rules)
        unknown = [n for n in names if n not in RULES]
        if unknown:
            raise ValueError(f"unknown diagnostics rule(s) {unknown}; known: {sorted(RULES)}")
        self.rules: list[Rule] = [RULES[n] for n in names]
        self.history = History(defaults=defaults)
        self.findings: list[Finding] = []  # everything reported, in order
        self._last: dict[tuple[str, str], Finding] = {}  # last reported per identity
        self._last_seen: dict[tuple[str, str], int] = {}  # observation index it last held
        self._step = 0
        self._failed: set[str] = set()
        for row in history or ():
            self._observe(int(row["iteration"]), row, report=False)

    # ---- public ---------------------------------------------------------------------------
    def observe(self, iteration: int, metrics: Mapping[str, Any]) -> list[Finding]:
        """Add one iteration's metrics; return (and append to ``path``) the new/worse findings."""
        reported = self._observe(int(iteration), metrics, report=True)
        if reported and self.path is not None:
            self._append(reported)
        return reported

    def evaluate(self) -> list[Finding]:
        """Every finding that holds at the current iteration (no repetition control)."""
        out: list[Finding] = []
        for r in self.rules:
            try:
                out += r(self.history, self.thresholds)
            except Exception:
                if self.strict:
                    raise
                if r.name not in self._failed:
                    self._failed.add(r.name)
                    log.exception("diagnostics rule %r failed and is skipped", r.name)
        return out

    # ---- internals --------------------------------------------------------------------------
    def _observe(self, iteration: int, metrics: Mapping[str, Any], report: bool) -> list[Finding]:
        self.history.append(iteration, metrics)
        self._step += 1
        news: list[Finding] = []
        for f in self.evaluate():
            ident = f.identity
            last = self._last.get(ident)
            seen = self._last_seen.get(ident)
            resolved = seen is not None and self._step - seen > self.thresholds.rearm_after
            self._last_seen[ident] = self._step
            if last is None or resolved or self._worse(f, last):
                self._last[ident] = f
                news.append(f)
        if report:
            self.findings += news
            return news
        return []

    def _worse(self, new: Finding, old: Finding) -> bool:
        if new.rank != old.rank:
            return new.rank > old.rank
        return new.score > old.score * (1.0 + self.thresholds.worsen_margin) + 1e-12

    def _append(self, findings: list[Finding]) -> None:
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                for f in findings:
                    fh.write(json.dumps(f.to_dict()) + "\n")
        except OSError as e:  # never stop training because a log file cannot be written
            log.warning("could not write %s: %s", self.path, e)


def diagnose(history: Iterable[Mapping[str, Any]], thresholds: Thresholds | None = None, *,
             rules: Iterable[str] | None = None, strict: bool = False,
             defaults: Mapping[str, float] | None = None) -> list[Finding]:
    """Findings of a whole metric history, exactly as a Monitor would have reported them online.

    ``history``: rows with an integer "iteration" key plus metrics (metrics.jsonl), in order.
    ``defaults``: run-level values for metrics the rows lack (``RunData.defaults``).
    Use `rlhfkit.diagnostics.summarize` to keep only the worst finding per rule.
    """
    monitor = Monitor(thresholds, rules=rules, strict=strict, defaults=defaults)
    for row in history:
        monitor.observe(int(row["iteration"]), row)
    return monitor.findings
