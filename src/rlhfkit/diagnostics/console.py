"""Terminal display of a training run: progress bars per phase, a metrics table per iteration,
findings as they appear.

    console = RunConsole(total_iterations=100)
    for it in range(100):
        with console.phase("rollout", total=n_batches) as bar:
            ...; bar.advance()
        with console.phase("update", total=n_minibatches) as bar:
            ...; bar.advance()
        console.log_iteration(it, metrics)
        console.show_findings(monitor.observe(it, metrics))

Bars (an overall "iterations" bar plus the current phase, each with ETA) are drawn only on an
interactive terminal and not in quiet mode; elsewhere (CI logs, files, quiet) phases are no-ops
and each iteration is one plain line. The live display stops whenever no phase is open, so an
exception or a forgotten ``close()`` never leaves the terminal in a bad state.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import fmt, to_float

# (metric, short name) in display order: the "key metrics" of every trainer.
KEY_METRICS: tuple[tuple[str, str], ...] = (
    ("rollout/reward_mean", "reward"),
    ("rollout/score_mean", "score"),
    ("rollout/solved_fraction", "solved"),
    ("rollout/group_reward_std", "group_std"),
    ("rollout/kl", "kl"),
    ("rollout/entropy", "entropy"),
    ("rollout/response_length", "length"),
    ("rollout/stop_fraction", "stop"),
    ("loss/policy", "pg_loss"),
    ("loss/value", "vf_loss"),
    ("loss/sft", "loss"),
    ("eval/loss", "eval_loss"),
    ("eval/perplexity", "ppl"),
    ("loss/dpo", "dpo_loss"),
    ("rewards/accuracy", "acc"),
    ("rewards/margin", "margin"),
    ("logps/chosen", "logp_chosen"),
    ("loss/rm", "rm_loss"),
    ("rm/accuracy", "rm_acc"),
    ("rm/margin", "rm_margin"),
    ("params/policy_clip_frac", "clip"),
    ("params/approx_kl", "approx_kl"),
    ("params/grad_norm", "grad_norm"),
    ("params/kl_coef", "kl_coef"),
    ("params/lr", "lr"),
    ("throughput/tokens_per_s", "tok/s"),
)
SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "critical": "bold red"}


def key_metrics(metrics: Mapping[str, Any], limit: int = 16) -> list[tuple[str, float]]:
    """(short name, value) of the key metrics present; the first ``limit`` numeric metrics when
    none of them is."""
    out = []
    for key, short in KEY_METRICS:
        value = to_float(metrics.get(key))
        if value is not None:
            out.append((short, value))
    if not out:
        for key, raw in metrics.items():
            value = to_float(raw)
            if key != "iteration" and value is not None:
                out.append((key.rsplit("/", 1)[-1], value))
    return out[:limit]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Phase:
    """A progress bar for one phase; ``advance`` is a no-op when bars are off."""

    def __init__(self, owner: RunConsole, name: str, total: int | None) -> None:
        self._owner = owner
        self.name = name
        self.total = total
        self._task: TaskID | None = owner._open_phase(self)
        self._closed = False

    def advance(self, n: int = 1) -> None:
        if self._task is not None and self._owner._progress is not None:
            self._owner._progress.advance(self._task, n)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._owner._close_phase(self)

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False


class RunConsole:
    """Progress bars, per-iteration metric tables and findings for one training run.

    Args:
        total_iterations: iterations planned (for the overall bar and the ETA).
        quiet: plain one-line-per-iteration output, no bars (for log files).
        console: the rich Console to write to (default: stdout).
        bars: force progress bars on/off (default: on for an interactive terminal unless quiet).
    """

    def __init__(self, total_iterations: int, quiet: bool = False, *, console: Console | None = None,
                 bars: bool | None = None) -> None:
        self.total_iterations = max(0, int(total_iterations))
        self.quiet = quiet
        self.console = console or Console(highlight=False)
        self.bars = (not quiet and self.console.is_terminal) if bars is None else bars
        self._progress: Progress | None = None
        self._iter_task: TaskID | None = None
        self._open: list[Phase] = []
        self._created = time.monotonic()
        self._t0: float | None = None  # start of the first phase (model loading excluded from s/it)
        self._done = 0

    # ---- context manager ---------------------------------------------------------------------
    def __enter__(self) -> RunConsole:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Close open phases and stop the live display."""
        for phase in list(self._open):
            phase.close()
        self._stop()

    # ---- phases ------------------------------------------------------------------------------
    def phase(self, name: str, total: int | None = None) -> Phase:
        """Start a progress bar for a phase (rollout, scoring, update); use as a context manager
        or call ``.close()``. ``total=None`` shows an indeterminate bar."""
        return Phase(self, name, total)

    def _open_phase(self, phase: Phase) -> TaskID | None:
        if self._t0 is None:
            self._t0 = time.monotonic()
        if not self.bars:
            return None
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.console, transient=True, speed_estimate_period=3600.0,
            )
            self._iter_task = self._progress.add_task("iterations", total=self.total_iterations or None,
                                                      completed=self._done)
        if not self._open:
            self._progress.start()
        self._open.append(phase)
        return self._progress.add_task(phase.name, total=phase.total)

    def _close_phase(self, phase: Phase) -> None:
        if phase in self._open:
            self._open.remove(phase)
        if self._progress is not None and phase._task is not None:
            self._progress.remove_task(phase._task)
        if not self._open:
            self._stop()

    def _stop(self) -> None:
        if self._progress is not None and self._progress.live.is_started:
            self._progress.stop()

    # ---- per-iteration output ----------------------------------------------------------------
    def _timing(self, iteration: int) -> str:
        """``s/it`` over the iterations this process ran, and the ETA of those left after `iteration`
        (0-based), so a resumed run counts from where it resumed."""
        if self._done == 0:
            return ""
        start = self._t0 if self._t0 is not None else self._created
        per_it = (time.monotonic() - start) / self._done
        text = f"{per_it:.1f} s/it"
        left = self.total_iterations - (iteration + 1)
        if self.total_iterations and left > 0:
            text += f", ETA {_duration(per_it * left)}"
        return text

    def count_iteration(self, iteration: int) -> None:
        """One iteration done, not shown (logging_steps): the progress bar and the time estimate move."""
        self._done += 1
        if self._progress is not None and self._iter_task is not None:
            self._progress.update(self._iter_task, completed=iteration + 1)

    def log_iteration(self, iteration: int, metrics: Mapping[str, Any]) -> None:
        """Show the key metrics of one iteration: a compact table, or one plain line when quiet."""
        self.count_iteration(iteration)
        pairs = key_metrics(metrics)
        total = f"/{self.total_iterations}" if self.total_iterations else ""
        timing = self._timing(iteration)
        shown = iteration + 1  # counted from 1 on screen ("3/3" is the last); metrics.jsonl keeps 0-based rows
        if self.quiet:
            line = f"it {shown}{total} " + " ".join(f"{k}={fmt(v)}" for k, v in pairs)
            self.console.print(line + (f" | {timing}" if timing else ""), markup=False,
                               highlight=False, soft_wrap=True)
            return
        cols = max(1, min(len(pairs), (self.console.width - 4) // 24)) if pairs else 1
        table = Table(title=f"iteration {shown}{total}" + (f" | {timing}" if timing else ""),
                      title_justify="left", show_header=False, box=None, padding=(0, 1), expand=False)
        for _ in range(cols):
            table.add_column(style="dim", justify="right", no_wrap=True)
            table.add_column(justify="left", no_wrap=True, min_width=9)
        for start in range(0, len(pairs), cols):
            chunk = pairs[start:start + cols]
            cells: list[str] = []
            for name, value in chunk:
                cells += [name, fmt(value)]
            cells += [""] * (2 * cols - len(cells))
            table.add_row(*cells)
        self.console.print(table)

    def show_findings(self, findings: Iterable[Finding]) -> None:
        """Print findings, one block each, coloured by severity (plain text in quiet mode)."""
        for f in findings:
            if self.quiet:
                self.console.print(f"{f.one_line()} -> {f.action}", markup=False, highlight=False,
                                   soft_wrap=True)
                continue
            head = Text(f"{f.severity.upper():>8} ", style=SEVERITY_STYLE.get(f.severity, ""))
            head.append(f"{f.rule} @ it {f.iteration}: ", style="bold")
            head.append(f.message)
            self.console.print(head)
            self.console.print(Text(f"         -> {f.action}", style="dim"))

    def print(self, msg: str) -> None:
        """Print a message (above the bars when they are shown); no rich markup is interpreted, and
        a long line stays one line (a log file is not wrapped at the console's 80 columns)."""
        self.console.print(msg, markup=False, highlight=False, soft_wrap=True)


def closing_line(run_dir: Any) -> str:
    """The last line of a run: where it is and what to run next."""
    return (f"[done] {run_dir}; next: rlhfkit doctor {run_dir} | rlhfkit report {run_dir} | "
            f"rlhfkit export {run_dir} --out DIR")
