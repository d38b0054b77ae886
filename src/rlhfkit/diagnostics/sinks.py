"""Metric sinks: TensorBoard (when installed) and Weights & Biases (when installed and asked for).

``make_sinks(run_dir, tensorboard=None, wandb=False, ...)`` returns objects with
``.log(step, metrics)`` and ``.close()``. Sinks never stop training: a sink whose backend fails
while logging is disabled with a warning.

- TensorBoard: ``tensorboard=None`` (auto) logs to ``run_dir/tensorboard`` when
  ``torch.utils.tensorboard`` imports (it needs the ``tensorboard`` package:
  ``pip install 'rlhfkit[tensorboard]'``); ``True`` requires it (UserError when missing);
  ``False`` turns it off.
- W&B: only with ``wandb=True`` (UserError when not installed). Offline-safe: the mode comes
  from ``WANDB_MODE``; when that is unset and no ``WANDB_API_KEY`` is set, it runs in offline mode
  (files under run_dir/wandb, sync later with ``wandb sync``) so it never waits for a login.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rlhfkit.diagnostics.history import to_float
from rlhfkit.errors import UserError

log = logging.getLogger(__name__)


class Sink(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics dict as floats (``iteration`` and strings dropped)."""
    out = {}
    for k, v in metrics.items():
        x = to_float(v)
        if k != "iteration" and x is not None:
            out[k] = x
    return out


class TensorBoardSink:
    """Scalars to ``<run_dir>/tensorboard`` via torch.utils.tensorboard.SummaryWriter."""

    def __init__(self, logdir: Path, writer_cls: Any) -> None:
        self.logdir = logdir
        self._writer = writer_cls(log_dir=str(logdir))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._writer is None:
            return
        try:
            for key, value in numeric(metrics).items():
                self._writer.add_scalar(key, value, global_step=int(step))
        except Exception as e:  # a logging backend must not stop training
            log.warning("TensorBoard logging failed and is turned off: %s", e)
            self._writer = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


class WandbSink:
    """Metrics to a Weights & Biases run (offline unless credentials or WANDB_MODE say otherwise)."""

    def __init__(self, wandb_module: Any, run_dir: Path, project: str | None, config: dict | None) -> None:
        mode = os.environ.get("WANDB_MODE")
        if not mode:
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.mode = mode
        self._wandb = wandb_module
        self._run = wandb_module.init(project=project or os.environ.get("WANDB_PROJECT") or "rlhfkit",
                                      name=run_dir.name, dir=str(run_dir), config=dict(config or {}),
                                      mode=mode)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._run is None:
            return
        try:
            self._run.log({k: v for k, v in numeric(metrics).items() if math.isfinite(v)}, step=int(step))
        except Exception as e:
            log.warning("W&B logging failed and is turned off: %s", e)
            self._run = None

    def close(self) -> None:
        if self._run is not None:
            try:
                self._run.finish()
            finally:
                self._run = None


class JsonlSink:
    """Appends ``{"iteration": step, **metrics}`` lines to a file (non-finite values as strings)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row: dict[str, Any] = {"iteration": int(step)}
        for k, v in numeric(metrics).items():
            row[k] = v if math.isfinite(v) else str(v)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def close(self) -> None:
        pass


def _summary_writer_cls() -> Any | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # ImportError, or a broken tensorboard install
        return None
    return SummaryWriter


def make_sinks(run_dir: str | Path, tensorboard: bool | None = None, wandb: bool = False,
               project: str | None = None, config: dict | None = None, *,
               metrics_jsonl: bool = False) -> list[Sink]:
    """The sinks for a run (see the module docstring). ``metrics_jsonl`` adds a JsonlSink writing
    run_dir/metrics.jsonl for trainers that do not write it themselves."""
    run_dir = Path(run_dir)
    sinks: list[Sink] = []
    if metrics_jsonl:
        sinks.append(JsonlSink(run_dir / "metrics.jsonl"))
    if tensorboard is not False:
        writer_cls = _summary_writer_cls()
        if writer_cls is None:
            if tensorboard:
                raise UserError("TensorBoard logging was asked for but the 'tensorboard' package is "
                                "not installed: pip install 'rlhfkit[tensorboard]'")
        else:
            sinks.append(TensorBoardSink(run_dir / "tensorboard", writer_cls))
    if wandb:
        try:
            import wandb as wandb_module
        except ImportError:
            raise UserError("W&B logging was asked for but 'wandb' is not installed: "
                            "pip install 'rlhfkit[wandb]'") from None
        try:
            sinks.append(WandbSink(wandb_module, run_dir, project, config))
        except Exception as e:  # network, auth: never block or stop the run for a logger
            log.warning("W&B could not start (%s); continuing without it", e)
    return sinks
