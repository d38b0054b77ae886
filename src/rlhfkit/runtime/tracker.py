"""Run folder and metric logging shared by every trainer.

runs/<name>/config.yaml      the resolved config
runs/<name>/metrics.jsonl    one JSON object per iteration, with an integer "iteration" key
runs/<name>/samples.jsonl    a few completions per iteration with their rewards
runs/<name>/diagnostics.jsonl training-health findings (rlhfkit.diagnostics)
runs/<name>/summary.json     before/after evaluation
runs/<name>/checkpoints/     step-N folders to resume from (rlhfkit.runtime.checkpoint)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlhfkit.core.disk import append_text, write_atomic
from rlhfkit.diagnostics import Monitor
from rlhfkit.diagnostics.console import RunConsole
from rlhfkit.diagnostics.sinks import make_sinks


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep them visible rather than crash
    return v


def read_config(run_dir: Path) -> dict | None:
    """The run's config.yaml (written before the tracker starts), for the sinks; None if absent."""
    import yaml

    try:
        data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def logging_due(iteration: int, every: int, total: int) -> bool:
    """Whether 0-based `iteration` of `total` is shown and sent to the sinks with logging_steps=`every`:
    the first, every `every`-th (1-based, as transformers counts) and the last."""
    return every <= 1 or iteration == 0 or (iteration + 1) % every == 0 or iteration + 1 >= total


class Tracker:
    """Writes metrics/samples files, shows progress and findings, feeds optional sinks."""

    def __init__(self, run_dir: Path, total_iterations: int, quiet: bool = False, is_main: bool = True,
                 tensorboard: bool | None = None, wandb: bool = False, config: dict | None = None,
                 logging_steps: int = 1):
        self.run_dir = Path(run_dir)
        self.total = total_iterations
        self.logging_steps = logging_steps  # console and sinks every N (metrics.jsonl: every one)
        self.is_main = is_main
        self.quiet = quiet
        self.console = None
        self.monitor = None
        self.sinks: list = []
        self.logged = 0  # metric rows this process logged
        self.last_row: dict | None = None  # the newest metrics row (summary.json's final_metrics)
        if not is_main:
            return
        self.console = RunConsole(total_iterations, quiet=quiet)
        self.monitor = Monitor(path=self.run_dir / "diagnostics.jsonl")
        config = config if config is not None else read_config(self.run_dir)
        self.sinks = make_sinks(self.run_dir, tensorboard=tensorboard, wandb=wandb, config=config)

    def resume(self, history: list[dict]) -> None:
        """Continue a run from a checkpoint: the diagnostics rules replay the metric rows kept before
        it silently, so they judge the same history as an uninterrupted run and repeat no finding;
        the sinks drop or skip what an earlier process logged after the last kept row (it is logged
        again), so no step appears twice."""
        start = 1 + max((r["iteration"] for r in history if isinstance(r.get("iteration"), int)), default=-1)
        for sink in self.sinks:
            sink.resume(start)
        if self.monitor is not None:
            self.monitor = Monitor(path=self.run_dir / "diagnostics.jsonl", history=history)

    def phase(self, name: str, total: int | None = None):
        if self.console is not None:
            return self.console.phase(name, total)
        return _NullPhase()

    def print(self, msg: str) -> None:
        if not self.is_main:
            return
        if self.console is not None:
            self.console.print(msg)
        else:
            print(msg, flush=True)

    def log(self, iteration: int, metrics: dict[str, float]) -> list:
        if not self.is_main:
            return []
        row = {"iteration": iteration, **{k: _clean(v) for k, v in metrics.items()}}
        append_text(self.run_dir / "metrics.jsonl", json.dumps(row) + "\n", self.run_dir)
        self.logged += 1
        self.last_row = row
        findings = self.monitor.observe(iteration, metrics) if self.monitor is not None else []
        if not logging_due(iteration, self.logging_steps, self.total) and not findings:
            if self.console is not None:
                self.console.count_iteration(iteration)
            return findings
        for sink in self.sinks:
            sink.log(iteration, metrics)
        if self.console is not None:
            self.console.log_iteration(iteration, metrics)
            if findings:
                self.console.show_findings(findings)
        elif not self.quiet:
            keys = [k for k in metrics if k.startswith(("rollout/reward_mean", "loss/", "params/approx_kl"))]
            print(f"it {iteration}: " + " ".join(f"{k}={metrics[k]:.4g}" for k in keys), flush=True)
        return findings

    def log_sinks(self, step: int, metrics: dict[str, float]) -> None:
        """Metrics for TensorBoard / W&B only (the held-out evaluation before and after training),
        not a metrics.jsonl row."""
        if self.is_main:
            for sink in self.sinks:
                sink.log(step, metrics)

    def log_samples(self, iteration: int, rows: list[dict]) -> None:
        if not self.is_main:
            return
        append_text(self.run_dir / "samples.jsonl",
                    "".join(json.dumps({"iteration": iteration, **r}) + "\n" for r in rows), self.run_dir)
        for sink in self.sinks:
            sink.log_samples(iteration, rows)

    def write_json(self, name: str, data: dict) -> None:
        if self.is_main:
            write_atomic(self.run_dir / name, json.dumps(data, indent=2), self.run_dir)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class _NullPhase:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def advance(self, n: int = 1) -> None:
        pass
