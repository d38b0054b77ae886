"""Reading a run folder (runs/<name>/) written by the trainers, including one still running.

    config.yaml        resolved config (flat mapping)
    metrics.jsonl      one JSON object per iteration with an integer "iteration" key
    samples.jsonl      {"iteration", "prompt", "completion", "reward", "score"} rows
    diagnostics.jsonl  findings reported online (rlhfkit.diagnostics.Monitor)
    summary.json       before/after evaluation numbers (absent while running)

Other tools' logs load too (`foreign.py`): a TRL / transformers output folder (its
trainer_state.json, or the newest checkpoint-N's), a trainer_state.json file, or a JSONL file of
metric rows with a "step" key; their metric names are mapped to rlhfkit's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.diagnostics import foreign
from rlhfkit.diagnostics.findings import Finding
from rlhfkit.errors import DataError, UserError

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
DIAGNOSTICS_FILE = "diagnostics.jsonl"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"


@dataclass
class RunData:
    """Everything in one run folder; missing optional files give empty values."""

    path: Path
    metrics: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: list[Finding] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # e.g. "skipped a partial last line"
    source: str = "rlhfkit"  # or the kind of foreign log, e.g. "TRL PPO"

    @property
    def defaults(self) -> dict[str, float]:
        """Run-level values for metrics the history may lack (see `run_defaults`)."""
        return run_defaults(self.config)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def last_iteration(self) -> int | None:
        return self.metrics[-1]["iteration"] if self.metrics else None

    @property
    def finished(self) -> bool:
        """A run counts as finished once summary.json exists."""
        return self.summary is not None


def read_jsonl(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a JSONL file. A malformed *last* line is skipped (the writer may be mid-line in a
    running job) and noted; a malformed earlier line raises DataError naming file and line."""
    rows: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    for pos, (n, line) in enumerate(numbered):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if pos == len(numbered) - 1:
                if notes is not None:
                    notes.append(f"{path.name}: skipped an incomplete last line {n}")
                break
            raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def run_defaults(config: dict[str, Any]) -> dict[str, float]:
    """{"params/max_grad_norm": x} when the config sets a positive max_grad_norm, else {}: the clip
    threshold a history without params/max_grad_norm is judged against."""
    value = flatten(config).get("max_grad_norm")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return {"params/max_grad_norm": float(value)}
    return {}


def read_metrics(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """metrics.jsonl rows sorted by iteration; a repeated iteration (a resumed run) keeps the
    row written last. Rows without "iteration" but with "step" (another tool's log) are keyed
    by their step."""
    rows = read_jsonl(path, notes)
    if all("iteration" not in r for r in rows) and any(k in r for r in rows for k in foreign.STEP_KEYS):
        rows = foreign.with_iterations(rows)
    by_iteration: dict[int, dict[str, Any]] = {}
    for n, row in enumerate(rows, 1):
        it = row.get("iteration")
        if isinstance(it, float) and it.is_integer():
            it = int(it)
        if not isinstance(it, int) or isinstance(it, bool):
            raise DataError(f"{path}: row {n} has no integer 'iteration' key (got {it!r})")
        row["iteration"] = it
        by_iteration[it] = row
    return [by_iteration[i] for i in sorted(by_iteration)]


def _renamed(run: RunData, where: str) -> RunData:
    """Map another tool's metric names to rlhfkit's (no change for an rlhfkit log), with a note."""
    run.metrics, kind, used = foreign.rename(run.metrics)
    if kind is not None:
        run.source = kind
        run.notes.append(f"read a {kind} log ({where}); names mapped: {', '.join(used) or 'none'}")
    return run


def load_log_file(path: Path) -> RunData:
    """A single log file: a trainer_state.json or a JSONL file of metric rows."""
    notes: list[str] = []
    if path.name.endswith(".json"):
        try:
            rows = foreign.with_iterations(foreign.read_trainer_state(path))
        except (json.JSONDecodeError, ValueError) as e:
            raise DataError(f"{path}: not a trainer_state.json ({e})") from None
    else:
        rows = read_metrics(path, notes)
    return _renamed(RunData(path=path, metrics=rows, notes=notes), path.name)


def load_run(path: str | Path) -> RunData:
    """Load a run folder (or another tool's log, see the module docstring). UserError when it is
    neither a folder nor a file, or a folder without metrics.jsonl, diagnostics.jsonl or a
    trainer_state.json; DataError for malformed files."""
    root = Path(path)
    if root.is_file():
        return load_log_file(root)
    if not root.is_dir():
        raise UserError(f"run folder '{root}' does not exist (expected runs/<name>/)")
    metrics_path, diag_path = root / METRICS_FILE, root / DIAGNOSTICS_FILE
    if not metrics_path.exists() and not diag_path.exists():
        state = foreign.find_trainer_state(root)
        if state is not None:
            return load_log_file(state)
        raise UserError(f"'{root}' has no {METRICS_FILE} (nor a trainer_state.json): is it a run folder "
                        "(runs/<name>/)?")
    notes: list[str] = []
    metrics = read_metrics(metrics_path, notes) if metrics_path.exists() else []
    run = _renamed(RunData(path=root, metrics=metrics, notes=notes), METRICS_FILE)
    if (root / CONFIG_FILE).exists():
        import yaml

        try:
            config = yaml.safe_load((root / CONFIG_FILE).read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise DataError(f"{root / CONFIG_FILE}: not valid YAML ({e})") from None
        run.config = config if isinstance(config, dict) else {}
    if (root / SAMPLES_FILE).exists():
        run.samples = read_jsonl(root / SAMPLES_FILE, notes)
    if diag_path.exists():
        for n, row in enumerate(read_jsonl(diag_path, notes), 1):
            try:
                run.diagnostics.append(Finding.from_dict(row))
            except (KeyError, TypeError, ValueError) as e:
                raise DataError(f"{diag_path}: row {n} is not a finding ({e})") from None
    if (root / SUMMARY_FILE).exists():
        try:
            summary = json.loads((root / SUMMARY_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{root / SUMMARY_FILE}: not valid JSON ({e.msg})") from None
        run.summary = summary if isinstance(summary, dict) else {"value": summary}
    return run


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {"a.b.c": value} (for configs and summaries that are not flat)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out
