"""Metric sinks: TensorBoard (when installed) and Weights & Biases (when installed and asked for).

``make_sinks(run_dir, tensorboard=None, wandb=False, ...)`` returns objects with
``.log(step, metrics)``, ``.log_samples(step, rows)``, ``.resume(step)`` and ``.close()``. Both
backends get the same metric names (the keys of metrics.jsonl), the run's config and the sample
completions as a table. Sinks never stop training: a sink whose backend fails while logging is
disabled with a warning.

- TensorBoard: ``tensorboard=None`` (auto) logs to ``run_dir/tensorboard`` when
  ``torch.utils.tensorboard`` imports (it needs the ``tensorboard`` package:
  ``pip install 'rlhfkit[tensorboard]'``); ``True`` requires it (UserError when missing);
  ``False`` turns it off. The config and each iteration's samples are text (markdown tables).
- W&B: only with ``wandb=True`` (UserError when not installed). Offline-safe: the mode comes
  from ``WANDB_MODE``; when that is unset and no ``WANDB_API_KEY`` is set, it runs in offline mode
  (files under run_dir/wandb, sync later with ``wandb sync``) so it never waits for a login.

Resume (``--resume``): a resumed run logs again the steps after its checkpoint. TensorBoard
reopens its writer with ``purge_step``, so the events an interrupted process wrote from that
step on are dropped and each step shows once, with the resumed run's values. W&B steps only
increase: the run folder keeps the W&B run id and the last step sent (run_dir/wandb/rlhfkit.json),
the resumed run continues the same W&B run and sends only the steps after that one.
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

    def log_samples(self, step: int, rows: list[dict]) -> None: ...

    def resume(self, step: int) -> None: ...

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
    """Scalars, config and samples to ``<run_dir>/tensorboard`` via torch.utils.tensorboard.SummaryWriter."""

    def __init__(self, logdir: Path, writer_cls: Any, config: Mapping[str, Any] | None = None) -> None:
        self.logdir, self._cls = logdir, writer_cls
        self._writer: Any = None
        self._off = False
        fresh = not any(Path(logdir).glob("events.out.tfevents.*"))
        # A session start at step 0 in a fresh folder: TensorBoard purges only on a *second* start
        # (the resume's); a folder that has events gets its writer when logging or resuming starts.
        self._purge_step: int | None = 0 if fresh else None
        if fresh and config:
            text = markdown_table(["key", "value"], config_rows(config))
            self._safe(lambda w: w.add_text("config", text, 0))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        def write(w):
            for key, value in numeric(metrics).items():
                w.add_scalar(key, value, global_step=int(step))

        self._safe(write)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        columns, cells = sample_table(rows)
        self._safe(lambda w: w.add_text("samples", markdown_table(columns, cells), int(step)))

    def resume(self, step: int) -> None:
        """Drop what an earlier process wrote at ``step`` and later (the resumed run writes it again)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._purge_step = int(step)

    def _safe(self, write: Any) -> None:
        if self._off:
            return
        try:
            if self._writer is None:
                self._writer = self._cls(log_dir=str(self.logdir), purge_step=self._purge_step)
            write(self._writer)
        except Exception as e:  # a logging backend must not stop training
            log.warning("TensorBoard logging failed and is turned off: %s", e)
            self._writer, self._off = None, True

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


class WandbSink:
    """Metrics, config and samples to a Weights & Biases run (offline unless credentials or
    WANDB_MODE say otherwise); one W&B run per run folder, continued on resume."""

    STATE = "rlhfkit.json"  # under run_dir/wandb: {"id": W&B run id, "last_step": last step sent}

    def __init__(self, wandb_module: Any, run_dir: Path, project: str | None, config: dict | None) -> None:
        mode = os.environ.get("WANDB_MODE")
        if not mode:
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.mode = mode
        self._wandb = wandb_module
        self._state_path = Path(run_dir) / "wandb" / self.STATE
        state = _read_json(self._state_path)
        self.run_id = state.get("id") or _new_id(wandb_module)
        self.last_step: int = state.get("last_step", -1)
        self._skip_to = -1  # steps <= this were sent by an earlier process (set by resume)
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        self._run = wandb_module.init(project=project or os.environ.get("WANDB_PROJECT") or "rlhfkit",
                                      name=run_dir.name, dir=str(run_dir), config=dict(config or {}),
                                      mode=mode, id=self.run_id, resume="allow")
        self._save_state()

    def resume(self, step: int) -> None:
        """The steps from ``step`` to the last one sent are not sent again (W&B steps only increase)."""
        self._skip_to = self.last_step

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._send(step, lambda: {k: v for k, v in numeric(metrics).items() if math.isfinite(v)})

    def log_samples(self, step: int, rows: list[dict]) -> None:
        if rows:
            columns, cells = sample_table(rows)
            self._send(step, lambda: {"samples": self._wandb.Table(columns=columns, data=cells)})

    def _send(self, step: int, data: Any) -> None:
        """Log ``data()`` at ``step`` unless an earlier process sent that step already."""
        if self._run is None or step <= self._skip_to:
            return
        try:
            self._run.log(data(), step=int(step))
        except Exception as e:
            log.warning("W&B logging failed and is turned off: %s", e)
            self._run = None
            return
        if step > self.last_step:
            self.last_step = int(step)
            self._save_state()

    def _save_state(self) -> None:
        self._state_path.write_text(json.dumps({"id": self.run_id, "last_step": self.last_step}))

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

    def log_samples(self, step: int, rows: list[dict]) -> None:
        pass  # the tracker writes samples.jsonl itself

    def resume(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- shared by the sinks


def sample_table(rows: list[dict]) -> tuple[list[str], list[list[Any]]]:
    """(columns, cells) of sample rows: every key in first-seen order, missing cells None."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return columns, [[r.get(c) for c in columns] for r in rows]


def config_rows(config: Mapping[str, Any]) -> list[list[Any]]:
    return [[k, v] for k, v in config.items()]


def markdown_table(columns: list[str], cells: list[list[Any]]) -> str:
    """A markdown table (TensorBoard's text tab renders it); cells on one line, pipes escaped."""
    def cell(v: Any) -> str:
        return " ".join(str(v).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in cells])


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _new_id(wandb_module: Any) -> str:
    util = getattr(wandb_module, "util", None)
    if util is not None and hasattr(util, "generate_id"):
        return util.generate_id()
    import uuid

    return uuid.uuid4().hex[:8]


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
            sinks.append(TensorBoardSink(run_dir / "tensorboard", writer_cls, config))
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
