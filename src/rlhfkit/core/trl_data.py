"""TRL's data keys of a CLI config (``trl sft --config FILE.yaml``) as rlhfkit's data option.

TRL's scripts read ``dataset_name`` (+ ``dataset_config``, ``dataset_train_split``) or a
``datasets:`` mixture: a list of ``datasets.load_dataset`` calls (``path``, ``name``, ``data_dir``,
``data_files``, ``split``, ``columns``, ``fraction``), concatenated, each ``fraction`` a share of the
mixture (trl/scripts/utils.py get_dataset), with ``test_split_size`` splitting a test share off.
Here each entry becomes a data spec (data/spec.py: ``FILE?split=S``, ``org/name?config=C``), the
entries are joined with `` + `` (data/sets.py `mixture` reads them as TRL does) and the result is
the command's data option (``data``/``prompts``/``prefs``). ``columns`` keeps only those columns, as
TRL's ``select_columns`` does (the spec's ``keep=``). ``test_split_size`` becomes ``eval_fraction``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlhfkit.errors import ConfigError

MIX = " + "
# load_dataset's builders for local files: `path: json` + `data_files: FILE` reads FILE
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
ENTRY_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
TOP_KEYS = ("datasets", "dataset_config", "dataset_train_split", "streaming", "dataset_streaming", "test_split_size")


def data_option(fields: Iterable[str]) -> str | None:
    """The command's training-data option: data (SFT, RM, KTO), prompts (RL), prefs (DPO)."""
    fields = set(fields)
    return next((k for k in ("data", "prompts", "prefs") if k in fields), None)


def _entry_spec(entry: Any, i: int, streaming: bool = False) -> str:
    """One ``datasets:`` entry as a data spec, or a one-line ConfigError."""
    where = f"datasets[{i}]"
    if not isinstance(entry, dict) or not entry.get("path"):
        raise ConfigError(f"{where}: expected a mapping with path (and data_files, split, name, columns, fraction)")
    unknown = sorted(set(map(str, entry)) - set(ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (TRL's DatasetConfig has "
                          f"{', '.join(ENTRY_KEYS)})")
    if entry.get("data_dir"):
        raise ConfigError(f"{where}: data_dir is not read; give data_files (the files) or path (a folder or file)")
    split = entry.get("split") or "train"
    files = entry.get("data_files")
    if isinstance(files, dict):  # {"train": FILE, "test": FILE}: the split's file
        if split not in files:
            raise ConfigError(f"{where}: data_files has no {split!r} file (has {', '.join(map(str, files))})")
        files, split = files[split], "train"
    if files and str(entry["path"]) not in FILE_BUILDERS and entry["path"] is not None:
        raise ConfigError(f"{where}: data_files with path {entry['path']!r}: give path: json (or csv, parquet, "
                          "text) for local files, or path alone")
    sources = ([str(f) for f in files] if isinstance(files, (list, tuple)) else [str(files)]) if files else [
        str(entry["path"])]
    options = []
    if entry.get("name"):
        options.append(f"config={entry['name']}")
    if split != "train" or not files:  # a local file given as data_files is its train split whole
        options.append(f"split={split}")
    columns = entry.get("columns")
    if columns is not None:
        columns = [columns] if isinstance(columns, str) else columns
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c.strip() for c in columns):
            raise ConfigError(f"{where}: columns expects a list of column names, got {entry['columns']!r}")
        options.append(f"keep={','.join(c.strip() for c in columns)}")
    if entry.get("fraction") is not None:
        options.append(f"fraction={entry['fraction']}")
    if streaming:
        options.append("streaming=true")
    query = f"?{'&'.join(options)}" if options else ""
    return MIX.join(f"{source}{query}" for source in sources)


def trl_data_values(fields: Iterable[str], values: dict[str, Any]) -> dict[str, Any]:
    """`values` with TRL's data keys (`TOP_KEYS`) as the command's data option and eval_fraction."""
    fields = set(fields)
    given = [k for k in TOP_KEYS if k in values and k not in fields]
    if not given:
        return values
    values = dict(values)
    trl = {k: values.pop(k) for k in given}
    target = data_option(fields)
    if target is None:
        raise ConfigError(f"{', '.join(given)}: this command reads no training data")
    if "datasets" in trl:
        entries = trl["datasets"]
        if not isinstance(entries, list) or not entries:
            raise ConfigError("datasets: expected a list of datasets (each with path, and data_files, split, ...)")
        if any(k in values for k in (target, "dataset_name", "train_dataset", "data")):
            raise ConfigError(f"datasets and {target}: give one")
        streaming = bool(trl.get("streaming") or trl.get("dataset_streaming"))
        values[target] = MIX.join(_entry_spec(e, i, streaming) for i, e in enumerate(entries))
    elif trl.get("dataset_config") or trl.get("dataset_train_split") not in (None, "train"):
        name = next((k for k in (target, "dataset_name", "train_dataset", "data", "dataset") if k in values), None)
        if name is None:
            raise ConfigError("dataset_config / dataset_train_split: give dataset_name too")
        options = [f"config={trl['dataset_config']}"] if trl.get("dataset_config") else []
        if trl.get("dataset_train_split") not in (None, "train"):
            options.append(f"split={trl['dataset_train_split']}")
        values[name] = f"{values[name]}{'&' if '?' in str(values[name]) else '?'}{'&'.join(options)}"
    if (trl.get("streaming") or trl.get("dataset_streaming")) and "datasets" not in trl:
        values[target] = f"{values[target]}{'&' if '?' in str(values[target]) else '?'}streaming=true"
    if trl.get("test_split_size"):
        if "eval_fraction" not in fields:
            raise ConfigError("test_split_size: this command takes its held-out data from eval_dataset or a test split")
        values["eval_fraction"] = trl["test_split_size"]
    return values
