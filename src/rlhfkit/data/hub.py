"""Records from a Hugging Face Hub dataset through `datasets` (the optional extra ``data``).

``load_dataset`` keeps what it downloads in the standard cache (``HF_HOME`` /
``HF_DATASETS_CACHE``), so a dataset fetched once loads again with ``HF_HUB_OFFLINE=1``.
``streaming=true`` reads rows as they arrive instead of preparing the whole dataset on disk
first; with ``take=N`` only the first N rows are read.
"""

from __future__ import annotations

import itertools
from typing import Any

from rlhfkit.data.readers import INSTALL_HINT, Records, one_line_error
from rlhfkit.data.spec import HUB_PREFIX, DataSpec
from rlhfkit.errors import DataError

PAIRED = ("train", "test")  # split=None on a set with both: every record, tagged like the built-ins


def read_hub(spec: DataSpec, requested: str | None) -> Records:
    """Rows of the Hub dataset ``spec`` for ``requested`` ("train", "test" or None: every record).

    A split pinned in the spec (``?split=``) is used whatever is requested, like a local file
    without a ``split`` field. Otherwise "train"/"test" pick those splits (a set with one split
    serves "train"), and None gives train and test together, each row tagged with ``split``.
    """
    datasets = _import(spec)
    chosen = choose_splits(split_names(datasets, spec), spec.split, requested, spec.text)
    rows: list[dict] = []
    for name in chosen:
        part = _rows(datasets, spec, name)
        rows += [{**r, "split": name} for r in part] if len(chosen) > 1 else part
    source = spec.text if len(chosen) > 1 else f"{spec.text} [{chosen[0]}]"
    if not rows:
        raise DataError(f"{source}: no records found (the split is empty)")
    return Records(rows, source=source, unit="row")


def choose_splits(available: list[str], pinned: str | None, requested: str | None, shown: str) -> list[str]:
    """Which splits to read (see :func:`read_hub`); DataError lists the splits found."""
    found = f"found: {', '.join(available)}" if available else "no split names found"
    if pinned is not None:
        base = pinned.split("[", 1)[0]  # `train[:100]` slices the train split
        if available and base not in available:
            raise DataError(f"{shown}: no split {base!r} ({found})")
        return [pinned]
    if requested is None:
        if all(s in available for s in PAIRED):
            return list(PAIRED)
        requested = "train"
    if requested in available:
        return [requested]
    if requested == "train" and len(available) == 1:
        return available
    raise DataError(f"{shown}: no split {requested!r}; choose one with ?split=NAME ({found})")


def split_names(datasets: Any, spec: DataSpec) -> list[str]:
    """The dataset's split names, from the Hub or, offline, from the local cache."""
    builder = _call(spec, datasets.load_dataset_builder, spec.name, spec.config, revision=spec.revision)
    splits = builder.info.splits or getattr(builder.config, "data_files", None) or {}
    return list(splits)


def _rows(datasets: Any, spec: DataSpec, split: str) -> list[dict]:
    args = dict(path=spec.name, name=spec.config, revision=spec.revision)
    if spec.streaming:
        stream = _call(spec, datasets.load_dataset, **args, split=split, streaming=True)
        return _call(spec, lambda: list(itertools.islice(stream, spec.take)))
    if spec.take is not None and "[" not in split:
        split = f"{split}[:{spec.take}]"
    return _call(spec, lambda: datasets.load_dataset(**args, split=split).to_list())


def _call(spec: DataSpec, func, *args, **kwargs):
    """``func(...)`` with `datasets`' failures turned into one-line DataErrors."""
    try:
        return func(*args, **kwargs)
    except ConnectionError:
        local = "" if spec.text.startswith(HUB_PREFIX) else "no such local file, and as a Hub dataset: "
        raise DataError(
            f"{spec.text}: {local}not in the local datasets cache and the Hub cannot be reached (offline, "
            "e.g. HF_HUB_OFFLINE=1); load it once with network access, or give a local file"
        ) from None
    except Exception as e:  # DatasetNotFoundError, ValueError (config/split), arrow and fs errors alike
        raise DataError(f"{spec.text}: {one_line_error(e)}") from None


def _import(spec: DataSpec) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{spec.text}: Hub datasets need `datasets`: {INSTALL_HINT}") from None
    return datasets
