"""Read user data files into lists of dicts, with file:line error messages.

Supported: JSONL, JSON (a list of objects), CSV/TSV (header row), plain text
(one prompt per line), Parquet (needs pyarrow) and a folder written by
``datasets.save_to_disk`` (needs ``datasets``). Text formats may be gzipped
(``.jsonl.gz``). Every problem with the input becomes a one-line
:class:`~rlhfkit.errors.DataError`; nothing else escapes for any file content.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhfkit.errors import DataError

TEXT_FORMATS = (".jsonl", ".json", ".csv", ".tsv", ".txt")
SUPPORTED_FORMATS = TEXT_FORMATS + (".parquet",)
INSTALL_HINT = "pip install 'rlhfkit[data]'"
# Files whose presence marks a folder written by `datasets.save_to_disk`.
DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


class Records(list):
    """A list of record dicts that remembers where each record came from.

    ``where(i)`` gives the location of record ``i`` for error messages:
    ``path:LINE`` for line-based formats (JSONL, CSV, text) and
    ``path: record N`` / ``path: row N`` for the others.
    """

    def __init__(
        self,
        items: Iterable[dict] = (),
        *,
        source: str = "<data>",
        lines: Sequence[int] | None = None,
        unit: str = "record",
    ) -> None:
        super().__init__(items)
        self.source = source
        self.lines = list(lines) if lines is not None else None
        self.unit = unit

    def where(self, index: int) -> str:
        """Human-readable location of record ``index`` (0-based)."""
        if self.lines is not None and 0 <= index < len(self.lines):
            return f"{self.source}:{self.lines[index]}"
        return f"{self.source}: {self.unit} {index + 1}"

    def subset(self, indices: Iterable[int]) -> Records:
        """The records at ``indices``, keeping their locations."""
        idx = list(indices)
        lines = [self.lines[i] for i in idx] if self.lines is not None else None
        return Records((self[i] for i in idx), source=self.source, lines=lines, unit=self.unit)


def where(records: Sequence[dict], index: int, path: str | os.PathLike | None = None) -> str:
    """Location of ``records[index]``: file:line when known, else ``path: record N``."""
    if isinstance(records, Records):
        return records.where(index)
    return f"{path if path is not None else '<data>'}: record {index + 1}"


# --------------------------------------------------------------------------- reading


def read_records(path: str | os.PathLike, *, split: str | None = None) -> Records:
    """Read a data file (or saved ``datasets`` folder) into a non-empty list of dicts.

    The format is chosen by extension: ``.jsonl``, ``.json``, ``.csv``, ``.tsv``,
    ``.txt`` (each optionally ``.gz``) and ``.parquet``; a directory is read as a
    ``datasets.save_to_disk`` folder (``split`` picks one split of a DatasetDict;
    default ``train`` or the only split). Raises DataError for a missing file, an
    unknown format, malformed content or an empty result.
    """
    p = Path(path)
    shown = printable(str(path))
    try:
        is_dir, exists = p.is_dir(), p.exists()
    except (OSError, ValueError) as e:  # e.g. an embedded NUL byte or a name too long
        raise DataError(f"{shown!r}: not a usable path: {one_line_error(e)}") from None
    if is_dir:
        return _read_hf_folder(p, shown, split)
    if not exists:
        raise DataError(f"{shown}: no such file or directory")
    suffix, compressed = _format_of(p)
    if suffix == ".parquet":
        records = _read_parquet(p, shown)
    elif suffix in TEXT_FORMATS:
        text = _read_text(p, shown, compressed)
        reader = {
            ".jsonl": _parse_jsonl,
            ".json": _parse_json,
            ".csv": _parse_csv,
            ".tsv": _parse_tsv,
            ".txt": _parse_txt,
        }[suffix]
        records = reader(text, shown)
    else:
        raise DataError(
            f"{shown}: unsupported file type '{suffix or p.name}' "
            f"(expected one of: {', '.join(SUPPORTED_FORMATS)}, or a saved datasets folder)"
        )
    if not records:
        raise DataError(f"{shown}: no records found (the file is empty)")
    return records


def _format_of(p: Path) -> tuple[str, bool]:
    """(format suffix, gzipped?) from the file name, e.g. ``x.jsonl.gz`` -> (".jsonl", True)."""
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        return (suffixes[-2] if len(suffixes) > 1 else ".gz"), True
    return (suffixes[-1] if suffixes else ""), False


def _read_text(p: Path, shown: str, compressed: bool) -> str:
    """File contents as text; undecodable bytes give a DataError naming the line."""
    try:
        raw = p.read_bytes()
        if compressed:
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{shown}: cannot read: {one_line_error(e)}") from None
    try:
        # utf-8-sig: tolerate the byte-order mark some editors write.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{shown}:{line}: not valid UTF-8 text (byte {e.start})") from None
    nul = raw.find(b"\0")
    if nul >= 0:  # no text format holds one; a binary file (or UTF-16) read as text
        line = raw[:nul].count(b"\n") + 1
        raise DataError(f"{shown}:{line}: a NUL byte (byte {nul}): not a text file (a binary file, or UTF-16?)")
    return text


def _split_lines(text: str) -> list[str]:
    """Split on newlines only; str.splitlines would also split on U+2028 etc. inside JSON strings."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """object_pairs_hook: a JSON object, refusing a key given twice (the later would silently win)."""
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _is_valid_unicode(obj: Any) -> bool:
    """False when a string in `obj` holds a lone surrogate (a JSON escape such as \\ud800 with no pair)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _loads(text: str, where_: str) -> Any:
    """json.loads with every failure mode turned into a DataError: invalid JSON, a key given twice in
    one object, a lone surrogate escape (text that is not valid Unicode)."""
    try:
        obj = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise DataError(f"{where_}: key {str(e)!r} given twice in one object") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{where_}: invalid JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # huge integers, absurd nesting
        raise DataError(f"{where_}: invalid JSON: {one_line_error(e)}") from None
    if "\\u" in text and not _is_valid_unicode(obj):  # only an escape can make a surrogate in decoded text
        raise DataError(f"{where_}: not valid Unicode (a lone surrogate escape such as \\ud800)")
    return obj


def _parse_jsonl(text: str, shown: str) -> Records:
    items, lines = [], []
    for lineno, line in enumerate(_split_lines(text), start=1):
        if not line.strip():
            continue
        obj = _loads(line, f"{shown}:{lineno}")
        if not isinstance(obj, dict):
            raise DataError(f"{shown}:{lineno}: expected a JSON object, got {_json_type(obj)}")
        items.append(obj)
        lines.append(lineno)
    return Records(items, source=shown, lines=lines)


def _parse_json(text: str, shown: str) -> Records:
    if not text.strip():
        return Records(source=shown)
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise DataError(f"{shown}: key {str(e)!r} given twice in one object") from None
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            # Several top-level values: it is really JSON Lines with a .json name.
            return _parse_jsonl(text, shown)
        raise DataError(f"{shown}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{shown}: invalid JSON: {one_line_error(e)}") from None
    if "\\u" in text and not _is_valid_unicode(data):
        raise DataError(f"{shown}: not valid Unicode (a lone surrogate escape such as \\ud800)")
    if isinstance(data, dict):
        data = _columns(data, shown)
    if not isinstance(data, list):
        raise DataError(f"{shown}: expected a JSON list of objects, got {_json_type(data)}")
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise DataError(f"{shown}: record {i + 1}: expected a JSON object, got {_json_type(obj)}")
    return Records(data, source=shown, unit="record")


def _columns(data: dict, shown: str) -> list[dict]:
    """A JSON object of equal-length lists is a table by columns (as `datasets` reads one); any other
    object is refused: one object is not a data set (write ``[{...}]`` for a single record)."""
    lengths = {len(v) for v in data.values() if isinstance(v, list)}
    if data and len(lengths) == 1 and all(isinstance(v, list) for v in data.values()):
        return [dict(zip(data, row)) for row in zip(*data.values())]
    raise DataError(f"{shown}: expected a JSON list of records, got one object (keys: {', '.join(list(data)[:5])}); "
                    "write [{...}, ...], or an object of equal-length column lists")


def _parse_csv(text: str, shown: str, delimiter: str = ",") -> Records:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header: list[str] | None = None
    items: list[dict] = []
    lines: list[int] = []
    start = 1
    try:
        for row in reader:
            # A quoted field may span lines: the record starts where the previous one ended.
            lineno, start = start, reader.line_num + 1
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if header is None:
                header = [h.strip() for h in row]
                dupes = sorted({h for h in header if header.count(h) > 1})
                if dupes:
                    raise DataError(f"{shown}:{lineno}: duplicate column name {dupes[0]!r} in the header row")
                continue
            if len(row) != len(header):
                raise DataError(
                    f"{shown}:{lineno}: {len(row)} fields, expected {len(header)} "
                    f"(the header has {len(header)} columns)"
                )
            items.append(dict(zip(header, row)))
            lines.append(lineno)
    except csv.Error as e:
        raise DataError(f"{shown}:{reader.line_num}: malformed CSV: {one_line_error(e)}") from None
    return Records(items, source=shown, lines=lines)


def _parse_tsv(text: str, shown: str) -> Records:
    return _parse_csv(text, shown, delimiter="\t")


def _parse_txt(text: str, shown: str) -> Records:
    items, lines = [], []
    for lineno, line in enumerate(_split_lines(text), start=1):
        if line.strip():
            items.append({"prompt": line.strip()})
            lines.append(lineno)
    return Records(items, source=shown, lines=lines)


def _read_parquet(p: Path, shown: str) -> Records:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{shown}: reading Parquet needs pyarrow: {INSTALL_HINT}") from None
    try:
        rows = pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises several unrelated types for bad files
        raise DataError(f"{shown}: cannot read Parquet: {one_line_error(e)}") from None
    return Records(rows, source=shown, unit="row")


def _read_hf_folder(p: Path, shown: str, split: str | None) -> Records:
    if not any((p / m).exists() for m in DATASET_MARKERS):
        raise DataError(
            f"{shown}: is a directory but not a saved datasets folder "
            f"(expected one of: {', '.join(DATASET_MARKERS)})"
        )
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{shown}: reading a saved datasets folder needs `datasets`: {INSTALL_HINT}"
        ) from None
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as e:  # corrupt folder: arrow, json and fs errors alike
        raise DataError(f"{shown}: cannot load the saved dataset: {one_line_error(e)}") from None
    return dataset_records(ds, shown, split)


def dataset_records(ds: Any, shown: str, split: str | None) -> Records:
    """The rows of a datasets.Dataset, or of one split of a DatasetDict (`split`, else train, else
    its only split), as Records named `shown`."""
    if isinstance(ds, Mapping):  # DatasetDict
        names = sorted(ds.keys())
        chosen = split if split is not None else ("train" if "train" in ds else None)
        if chosen is None and len(names) == 1:
            chosen = names[0]
        if chosen is None:
            raise DataError(f"{shown}: has several splits; choose one of: {', '.join(names)}")
        if chosen not in ds:
            raise DataError(f"{shown}: no split {chosen!r} (expected one of: {', '.join(names)})")
        ds = ds[chosen]
        shown = f"{shown}[{chosen}]"
    return Records(ds.to_list(), source=shown, unit="row")


# --------------------------------------------------------------------------- validation


def require_fields(
    records: Sequence[Mapping[str, Any]],
    fields: Sequence[str | Sequence[str]],
    path: str | os.PathLike | None = None,
) -> None:
    """Check every record has each field; a tuple of names means "one of these".

    A field set to ``None`` (JSON null, an empty Parquet cell) counts as missing.
    Raises DataError like ``data.jsonl:17: missing field 'prompt' (expected one of: prompt, messages)``.
    """
    for i, rec in enumerate(records):
        for field in fields:
            names = (field,) if isinstance(field, str) else tuple(field)
            if any(rec.get(n) is not None for n in names):
                continue
            raise missing_field(where(records, i, path), rec, names)


def missing_field(where_: str, record: Mapping[str, Any], names: Sequence[str]) -> DataError:
    """``data.jsonl:3: missing field 'prompt' (expected one of: prompt, messages); found: text, id``."""
    hint = f" (expected one of: {', '.join(names)})" if len(names) > 1 else ""
    found = ", ".join(repr(k) if not isinstance(k, str) or not k.isidentifier() else k
                      for k, v in record.items() if v is not None)
    found = found if len(found) <= 100 else found[:97] + "..."
    have = f"found: {found}" if found else "the record has no fields"
    return DataError(f"{where_}: missing field {names[0]!r}{hint}; {have}")


def expect_text(value: Any, field: str, where_: str, *, allow_empty: bool = False) -> str:
    """``value`` as a string, or a DataError naming the field."""
    if not isinstance(value, str):
        raise DataError(f"{where_}: field {field!r} must be a string, got {_json_type(value)}")
    if not allow_empty and not value.strip():
        raise DataError(f"{where_}: field {field!r} must be a non-empty string")
    return value


def expect_float(value: Any, field: str, where_: str) -> float:
    """A finite number (numeric strings from CSV are accepted), or a DataError."""
    if isinstance(value, bool):
        raise DataError(f"{where_}: field {field!r} must be a number, got a boolean")
    try:
        out = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"{where_}: field {field!r} must be a number, got {_short(value)}") from None
    if not math.isfinite(out):
        raise DataError(f"{where_}: field {field!r} must be a finite number, got {out}")
    return out


def message_text(content: Any, where_: str, field: str = "messages") -> str:
    """Text of a chat message's content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(c, dict) for c in content):
        texts = [c.get("text") for c in content if c.get("type", "text") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise DataError(f"{where_}: field {field!r}: message content must be a string, got {_short(content)}")


def expect_messages(value: Any, where_: str, field: str = "messages") -> list[dict[str, str]]:
    """A chat conversation: a non-empty list of ``{"role", "content"}`` dicts with string values."""
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{where_}: field {field!r} must be a non-empty list of {{'role', 'content'}} objects, "
            f"got {_short(value)}"
        )
    out = []
    for j, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or "content" not in msg:
            raise DataError(
                f"{where_}: field {field!r}: message {j + 1} must be an object with 'role' and 'content', "
                f"got {_short(msg)}"
            )
        out.append({"role": msg["role"], "content": message_text(msg["content"], where_, field)})
    return out


# --------------------------------------------------------------------------- small helpers


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    """A one-line repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """``text`` as is, or its repr when it holds newlines or other control characters."""
    return text if text.isprintable() else repr(text)


def one_line_error(exc: BaseException) -> str:
    """First line of an exception's message (messages must stay one line)."""
    msg = str(exc).strip().splitlines()
    return msg[0] if msg else type(exc).__name__

