"""Reading a run folder's checkpoints (runtime/checkpoint.py writes them): which step-N folders are
complete, which one a resume takes, and what makes one unusable.

A resume takes the newest checkpoint that passes `checkpoint_problem`: every file present and
readable with its recorded size and sha256, the step in meta.json that of the folder name, and
every file of the structure the resume reads (meta.json an object of typed fields; state.pt the
state dict of that step; the weights' own step, recorded in their safetensors metadata; RNG states;
config.yaml a mapping). A newer one that fails is skipped with a notice naming the file
(`resumable_checkpoint`). A checkpoint written before sizes and sha256 were recorded is taken with
a notice that it cannot be verified (`unverified_notice`): only the structure and steps are checked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHECKPOINTS = "checkpoints"
META, WEIGHTS, STATE, CONFIG = "meta.json", "trainable.safetensors", "state.pt", "config.yaml"


def step_of(path: Path) -> int | None:
    """N of a folder named step-N, else None."""
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def read_meta(path: Path) -> dict:
    """meta.json of checkpoint folder `path`; OSError, ValueError (not JSON) or TypeError (not an
    object, or `files` not a list of plain file names) when it cannot be used."""
    meta = json.loads((path / META).read_text())
    if not isinstance(meta, dict):
        raise TypeError(f"a JSON {type(meta).__name__}, not an object")
    files = meta.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) and f and Path(f).name == f and f != ".."
                                              for f in files):
        raise TypeError("'files' is not a list of file names")
    return meta


def is_complete(path: Path) -> bool:
    """A step-N folder whose meta.json exists and names files that all exist."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError, TypeError):
        return False
    return all((path / f).is_file() for f in meta["files"])


def file_digest(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _meta_problem(path: Path, meta: dict) -> str | None:
    """What is wrong with the fields of a parsed meta.json (types, step, required files), or None."""
    step, sizes, digests = meta.get("step"), meta.get("sizes", {}), meta.get("sha256", {})
    if not isinstance(step, int) or isinstance(step, bool) or step != step_of(path):
        return f"{path / META} says step {step!r}, the folder step-{step_of(path)}"
    if not (isinstance(sizes, dict) and all(isinstance(v, int) for v in sizes.values())
            and isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values())):
        return f"{path / META} has malformed 'sizes' or 'sha256' (not a mapping of file names to numbers / hashes)"
    missing = [f for f in (WEIGHTS, STATE, CONFIG) if f not in meta["files"]]
    if missing:
        return f"{path / META} does not list {', '.join(missing)}"
    return None


def checkpoint_problem(path: Path) -> str | None:
    """What makes checkpoint folder `path` unusable, naming the file, or None: meta.json unreadable
    or malformed, a file missing or unreadable, of another size or sha256 than recorded, of another
    structure than the resume reads (`file_problem`), a step that is not the folder's."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError, TypeError) as e:
        return f"{path / META} is unreadable ({type(e).__name__}{': ' + str(e) if isinstance(e, TypeError) else ''})"
    problem = _meta_problem(path, meta)
    if problem:
        return problem
    sizes, digests = meta.get("sizes", {}), meta.get("sha256", {})
    for name in meta["files"]:
        f = path / name
        if not f.is_file():
            return f"{f} is missing"
        try:
            if name in sizes and f.stat().st_size != sizes[name]:
                return f"{f} has {f.stat().st_size} bytes, {sizes[name]} were written (truncated or replaced)"
            if name in digests and file_digest(f) != digests[name]:
                return f"{f} does not match the sha256 recorded when it was written (changed or damaged)"
            problem = file_problem(f, meta["step"])
        except OSError as e:  # e.g. PermissionError: a file the user cannot read
            return f"{f} is unreadable ({type(e).__name__}: {e.strerror or e})"
        if problem:
            return f"{f} {problem}"
    return None


def unverified_notice(path: Path) -> str | None:
    """For a checkpoint whose meta.json records no size or sha256 for some file (written by an
    older rlhfkit): a notice that it cannot be verified, else None."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError, TypeError):
        return None
    sizes, digests = meta.get("sizes") or {}, meta.get("sha256") or {}
    if all(f in sizes and f in digests for f in meta["files"]):
        return None
    try:
        weights_step = _weights_step(path / WEIGHTS)
    except Exception:  # noqa: BLE001 - checked by checkpoint_problem already
        weights_step = None
    how = ("the step recorded in its weights" if weights_step is not None
           else "the step in state.pt; its weights record none, so weights copied from another step go unnoticed")
    return (f"[resume] {path.name} has no recorded sizes and sha256 (written by an older rlhfkit): its files cannot "
            f"be verified, only their structure and {how}; resuming from it")


# ----------------------------------------------------------------------------- file structure


def _weights_step(path: Path) -> int | None:
    """The step recorded in a trainable.safetensors' metadata (None: written before it was recorded).
    Reads the header only; raises on a file that is not safetensors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        list(f.keys())
        step = (f.metadata() or {}).get("step")
    if step is None:
        return None
    if not step.isdigit():
        raise ValueError(f"step {step!r} in its metadata")
    return int(step)


STATE_FIELDS = {"optimizer": dict, "scheduler": dict, "objects": dict}


def state_problem(state: object, step: int) -> str | None:
    """What state.pt's unpickled value lacks of the checkpoint state (runtime/checkpointer.py
    Checkpointer.state), or None."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not the checkpoint's state dict"
    if state.get("step") != step or not isinstance(state.get("step"), int):
        return f"is from step {state.get('step')!r}, but the checkpoint is step-{step} (files of two checkpoints mixed?)"
    for key, kind in STATE_FIELDS.items():
        if not isinstance(state.get(key), kind):
            return f"has no {key} state ({key!r}: {type(state.get(key)).__name__})"
    optimizer = state["optimizer"]
    if not (isinstance(optimizer.get("state"), dict) and isinstance(optimizer.get("param_groups"), list)):
        return "has no optimiser state ('state' and 'param_groups')"
    if not isinstance(state.get("optimizer_format", "torch"), str):
        return "has a malformed optimizer_format"
    return None


def _rng_problem(state: object) -> str | None:
    """What an rng-rank{R}.pt lacks of the RNG states (core/seeding.rng_state, as saved), or None."""
    import torch

    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not RNG states"
    if not isinstance(state.get("torch"), torch.Tensor) or state["torch"].dtype != torch.uint8:
        return "has no torch RNG state"
    if not (isinstance(state.get("python"), (tuple, list)) and len(state["python"]) == 3):
        return "has no python RNG state"
    if not (isinstance(state.get("numpy"), (tuple, list)) and len(state["numpy"]) == 5):
        return "has no numpy RNG state"
    return None


def file_problem(path: Path, step: int) -> str | None:
    """What is wrong with the structure of checkpoint file `path` of step `step` (the rest of a
    sentence that starts with its path), or None. OSError when it cannot be read. state.pt and RNG
    files are unpickled with torch.load(weights_only=True) (no code runs; state.pt memory-mapped)."""
    import torch
    import yaml

    name = path.name
    try:
        if name == WEIGHTS:
            saved = _weights_step(path)
            return None if saved in (None, step) else f"holds the weights of step {saved}, not of step-{step}"
        if name == STATE:
            return state_problem(torch.load(path, map_location="cpu", weights_only=True, mmap=True), step)
        if name.startswith("rng-rank") and name.endswith(".pt"):
            return _rng_problem(torch.load(path, map_location="cpu", weights_only=True))
        if name == CONFIG:
            config = yaml.safe_load(path.read_text())
            return None if isinstance(config, dict) else f"holds a {type(config).__name__}, not a configuration"
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - pickle, zip, safetensors, yaml, unicode errors of a damaged file
        return f"is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    return None


def resumable_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint of a run folder that passes `checkpoint_problem` (None: none does), and
    one notice per newer checkpoint skipped, naming what is wrong with it."""
    root = Path(run_dir) / CHECKPOINTS
    found = sorted(((step_of(p), p) for p in root.iterdir() if p.is_dir() and step_of(p) is not None),
                   reverse=True) if root.is_dir() else []
    notices = []
    for _, path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            notices = [f"{n}; resuming from {path.name} instead" for n in notices]
            unverified = unverified_notice(path)
            return path, notices + [unverified] if unverified else notices
        notices.append(f"[resume] skipping {path.name}: {problem}")
    return None, notices


def checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary and half-deleted folders are ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return [p for _, p in sorted(found) if is_complete(p)]


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint folder was written after (its meta.json's, else its name's)."""
    try:
        step = json.loads((Path(path) / META).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    return step if isinstance(step, int) else (step_of(Path(path)) or 0)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    found = checkpoints(run_dir)
    return found[-1] if found else None
