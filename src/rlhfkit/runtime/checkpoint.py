"""Checkpoints every trainer writes and resumes from: atomic, complete or absent.

Layout of one checkpoint, RUN/checkpoints/step-N (N = iterations or optimiser steps done):

  trainable.safetensors  parameters with requires_grad: LoRA adapters + value/score head, or all
                         weights under full fine-tuning (frozen base weights come from `model`);
                         whole tensors, gathered from the shards under FSDP2; the step is in its
                         metadata ({"step": "N"}: weights copied in from another step are caught)
  state.pt               optimiser (under FSDP2 its whole state keyed by parameter name:
                         `optimizer_format`), lr scheduler, data position, torch.Generator states,
                         KL controller, counters, the before-training evaluation
  rng-rank{R}.pt         python, numpy, torch CPU (and CUDA) RNG states of process R (gathered from
                         every process and written by process 0, like every other file: the
                         checkpoint is whole on process 0's disk, shared storage or not)
  config.yaml            the configuration at save time
  meta.json              written last; a folder without it is not a checkpoint. It records the step,
                         and the size and sha256 of every other file

Files are written into checkpoints/.tmp-step-N, fsynced, and the folder is renamed to step-N in
one `os.replace`, so a crash (even kill -9) leaves either the whole checkpoint or none of it.
Old checkpoints are renamed to .del-step-N before they are deleted, for the same reason.

Finding and checking checkpoints (which one a resume takes) is core/run_files.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlhfkit.core.disk import out_of_space, write_atomic
from rlhfkit.core.run_files import CHECKPOINTS, CONFIG, META, STATE, WEIGHTS, checkpoints, file_digest
from rlhfkit.errors import UserError
from rlhfkit.runtime import fsdp2

TRAINING_LOGS = ("metrics.jsonl", "samples.jsonl", "diagnostics.jsonl")
# Test hook: "N" makes the write of step-N sleep after its files are written and before the rename,
# so a test can kill -9 the process at exactly that point.
PAUSE_ENV = "RLHFKIT_TEST_CHECKPOINT_PAUSE"


def rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


# ----------------------------------------------------------------------------- writing


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def trainable_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> CPU copy of every parameter that trains (tied weights appear once)."""
    return {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _plain_rng(state: dict) -> dict:
    """RNG states as plain Python/tensor values, so torch.load(weights_only=True) can read them."""
    out = dict(state)
    if "numpy" in out:
        kind, keys, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    return out


def _numpy_rng(state: dict) -> dict:
    out = dict(state)
    if "numpy" in out:
        kind, keys, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = (kind, keys.numpy().astype("uint32"), pos, has_gauss, cached)
    return out


def _pause_for_tests(step: int) -> None:
    if os.environ.get(PAUSE_ENV) == str(step):
        time.sleep(600)


def _retire(path: Path) -> None:
    """Delete a checkpoint folder without ever leaving a half-deleted step-N behind."""
    doomed = path.with_name(f".del-{path.name}-{time.time_ns()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_leftovers(root: Path) -> None:
    """Remove .tmp-*/.del-* folders a crash left behind."""
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith((".tmp-", ".del-")):
                shutil.rmtree(p, ignore_errors=True)


def write_checkpoint(run_dir: Path, step: int, *, model: torch.nn.Module, state: dict, config_text: str,
                     rank: int = 0, world_size: int = 1, keep: int = 2,
                     barrier: Callable[[], None] = lambda: None, meta: dict | None = None,
                     weights: dict[str, torch.Tensor] | None = None,
                     rng_states: list[dict] | None = None) -> Path:
    """Write RUN/checkpoints/step-`step` atomically and keep the newest `keep` checkpoints.

    Called on every process; process 0 writes every file (no other process touches the folder, so
    it may be on process 0's own disk): the weights, the state and the RNG state of each process,
    `rng_states` in rank order (runtime/distributed.py `gathered`; None: this process's own, for
    one process). `barrier` (e.g. accelerator.wait_for_everyone) orders the steps across processes.
    `weights`: the trainable weights when `model`'s are sharded (runtime/fsdp2.py `trainable_weights`).
    """
    root = Path(run_dir) / CHECKPOINTS
    tmp = root / f".tmp-step-{step}"
    try:
        with out_of_space(tmp, Path(run_dir)):
            return _write_checkpoint(run_dir, step, model=model, state=state, config_text=config_text, rank=rank,
                                     world_size=world_size, keep=keep, barrier=barrier, meta=meta, weights=weights,
                                     rng_states=rng_states)
    except BaseException:
        if rank == 0:  # a full disk, a signal, ...: no half-written folder stays behind
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_checkpoint(run_dir: Path, step: int, *, model: torch.nn.Module, state: dict, config_text: str,
                      rank: int, world_size: int, keep: int, barrier: Callable[[], None], meta: dict | None,
                      weights: dict[str, torch.Tensor] | None, rng_states: list[dict] | None) -> Path:
    from rlhfkit.core.seeding import rng_state

    root = Path(run_dir) / CHECKPOINTS
    tmp, final = root / f".tmp-step-{step}", root / f"step-{step}"
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    if rank == 0:
        from safetensors.torch import save_file

        for r, rng in enumerate(rng_states if rng_states is not None else [rng_state()]):
            torch.save(_plain_rng(rng), tmp / rng_file(r))
            _fsync_file(tmp / rng_file(r))

        save_file(trainable_tensors(model) if weights is None else weights, str(tmp / WEIGHTS),
                  metadata={"step": str(step)})
        torch.save(state, tmp / STATE)
        (tmp / CONFIG).write_text(config_text)
        for name in (WEIGHTS, STATE, CONFIG):
            _fsync_file(tmp / name)
    barrier()
    if rank == 0:
        rngs = 1 if rng_states is None else len(rng_states)
        files = [WEIGHTS, STATE, CONFIG] + [rng_file(r) for r in range(rngs)]
        info = {"step": step, "world_size": world_size, "files": files, "time": time.time(), **(meta or {}),
                "sizes": {f: (tmp / f).stat().st_size for f in files},
                "sha256": {f: file_digest(tmp / f) for f in files}}
        (tmp / META).write_text(json.dumps(info, indent=2))
        _fsync_file(tmp / META)
        _fsync_dir(tmp)
        _pause_for_tests(step)
        if final.exists():  # the same step saved again (e.g. a resumed run that did nothing new)
            _retire(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in checkpoints(run_dir)[:-keep] if keep > 0 else []:
            _retire(old)
    barrier()
    return final


# ----------------------------------------------------------------------------- reading


def read_trainable(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / WEIGHTS))


def load_trainable(model: torch.nn.Module, path: Path, saved: dict[str, torch.Tensor] | None = None) -> None:
    """Copy the saved trainable parameters (`saved`: the weights already read from checkpoint
    `path`, else read now) into `model`; a mismatch is a one-line UserError."""
    saved = read_trainable(path) if saved is None else saved
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
    if missing or unexpected:
        raise UserError(f"resume: {path} does not fit this model (missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}): was it saved with another model, lora or lora_layers setting?")
    for name, p in params.items():  # a sharded parameter's shape is its whole shape
        if p.shape != saved[name].shape:
            raise UserError(f"resume: {path}: {name} has shape {tuple(saved[name].shape)}, the model "
                            f"{tuple(p.shape)} (another lora_r or model?)")
    if fsdp2.is_sharded(model):
        fsdp2.load_weights(model, saved)
        return
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(saved[name])


def load_state(path: Path) -> dict:
    return torch.load(path / STATE, map_location="cpu", weights_only=True)


def load_rng(path: Path, rank: int) -> dict | None:
    f = path / rng_file(rank)
    return _numpy_rng(torch.load(f, map_location="cpu", weights_only=True)) if f.is_file() else None


# ----------------------------------------------------------------------------- stateful objects


def get_state(obj: Any) -> Any:
    """Saveable state of a torch.Generator, a dict (copied) or anything with state_dict()."""
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, dict):
        return dict(obj)
    return obj.state_dict()


def set_state(obj: Any, state: Any) -> None:
    """Inverse of `get_state`. A dict only gets the keys it lacks: values the running trainer has
    already set from its current config win, results from before the checkpoint are carried over."""
    if isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif isinstance(obj, dict):
        for k, v in state.items():
            obj.setdefault(k, v)
    else:
        obj.load_state_dict(state)


# ----------------------------------------------------------------------------- run logs


def truncate_logs(run_dir: Path, step: int) -> list[dict]:
    """Keep only rows with iteration < `step` in the run's jsonl logs (a resumed run writes the
    later ones again); returns the kept metrics rows. A torn last line is dropped. Each file is
    replaced in one rename (a full disk leaves it as it was, with one line naming it)."""
    kept_metrics: list[dict] = []
    for name in TRAINING_LOGS:
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        keep = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("iteration"), int) and row["iteration"] < step:
                keep.append(line)
                if name == "metrics.jsonl":
                    kept_metrics.append(row)
        write_atomic(path, "".join(line + "\n" for line in keep), Path(run_dir))
    return kept_metrics


# ----------------------------------------------------------------------------- one training loop
