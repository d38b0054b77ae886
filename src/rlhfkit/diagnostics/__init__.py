"""Training-health diagnostics: rules over the metric history, online and offline.

    from rlhfkit.diagnostics import Finding, Monitor, diagnose, Thresholds

    monitor = Monitor(path=run_dir / "diagnostics.jsonl")
    for it in range(n):
        ...
        for f in monitor.observe(it, metrics):   # only new or worsened findings
            print(f.one_line())

    findings = diagnose(rows)                   # offline, over metrics.jsonl rows

Rules live in `rlhfkit.diagnostics.rules` (``RULES``), thresholds in `Thresholds`; the
terminal display in `rlhfkit.diagnostics.console`, TensorBoard/W&B in
`rlhfkit.diagnostics.sinks`, the HTML report in `rlhfkit.diagnostics.report`, and the
`rlhfkit doctor` / `rlhfkit report` commands in `rlhfkit.commands.doctor`.
See docs/diagnostics.md for every rule and threshold with its reasoning.
"""

from rlhfkit.diagnostics.findings import SEVERITIES, Finding, summarize
from rlhfkit.diagnostics.monitor import Monitor, diagnose
from rlhfkit.diagnostics.rules import RULES, Rule
from rlhfkit.diagnostics.thresholds import Thresholds

__all__ = ["Finding", "Monitor", "diagnose", "Thresholds", "RULES", "Rule", "SEVERITIES", "summarize"]
