"""Data specs: where records come from, written as one string on the command line or in YAML.

    SPEC    = SOURCE [ "?" OPTION { "&" OPTION } ]
    SOURCE  = builtin:NAME | hf:ORG/NAME | ORG/NAME | PATH
    OPTION  = config=NAME | split=NAME | revision=REV | columns=TO:FROM[,TO:FROM...]
              | keep=COLUMN[,COLUMN...] | streaming=true|false | take=N | words=N

``ORG/NAME`` is a Hub dataset id when no such local path exists (and it has no data-file
suffix); ``hf:`` says so explicitly. Options apply to Hub ids and local files alike, except
``config``, ``revision`` and ``streaming`` (Hub only). ``words=N`` cuts each prompt to its first
N words (IMDB-style reviews as openers for the sentiment task). ``keep=a,b`` keeps only those columns
of each record once its split is chosen (TRL's ``columns`` of a ``datasets:`` entry, applied
before ``columns`` renames). Examples::

    prompts='hf:openai/gsm8k?config=main&columns=prompt:question'
    data='HuggingFaceH4/ultrafeedback_binarized?split=train_prefs'
    prompts='my.csv?columns=prompt:instruction'
    prompts='hf:stanfordnlp/imdb?columns=prompt:text&words=8'

Quote a spec with ``?`` or ``&`` on the shell. docs/data-formats.md has one example per format.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import DataError

HUB_PREFIX = "hf:"
BUILTIN_PREFIX = "builtin:"
OPTIONS = ("config", "split", "revision", "columns", "keep", "streaming", "take", "words")
HUB_ONLY = ("config", "revision", "streaming")
# A Hub id: "name" or "org/name" (letters, digits, '-', '_', '.'); no data-file suffix.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet", ".gz")


@dataclass(frozen=True)
class DataSpec:
    """A parsed data spec. ``kind`` is "builtin", "hub" or "file"; ``name`` the built-in name,
    Hub id or path; ``columns`` maps a record field to the source column it is read from."""

    text: str
    kind: str
    name: str
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    columns: tuple[tuple[str, str], ...] = ()
    keep: tuple[str, ...] = ()
    streaming: bool = False
    take: int | None = None
    words: int | None = None


def parse_spec(text: str) -> DataSpec:
    """Parse ``text`` (see the module docstring); DataError names the spec and what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"data spec must be 'builtin:NAME', a Hub id or a file path, got {text!r}")
    source, opts = _split_options(text)
    if source.startswith(BUILTIN_PREFIX):
        if opts:
            raise DataError(f"{_show(text)}: built-in data sets take no '?' options")
        return DataSpec(text, "builtin", source[len(BUILTIN_PREFIX):].strip())
    if source.startswith(HUB_PREFIX):
        kind, name = "hub", source[len(HUB_PREFIX):].strip()
        if not _HUB_ID.match(name):
            raise DataError(f"{_show(text)}: {name!r} is not a Hub dataset id (expected ORG/NAME)")
    else:
        kind, name = ("hub" if looks_like_hub_id(source) else "file"), source
    if kind == "file":
        hub_only = [k for k in HUB_ONLY if k in opts]
        if hub_only:
            raise DataError(f"{_show(text)}: option {hub_only[0]!r} applies to Hub datasets only (hf:ORG/NAME)")
    return DataSpec(text, kind, name, config=opts.get("config"), split=opts.get("split"),
                    revision=opts.get("revision"), columns=_columns(opts.get("columns"), text),
                    keep=_keep(opts.get("keep"), text),
                    streaming=_flag(opts.get("streaming"), "streaming", text),
                    take=_count(opts.get("take"), "take", text),
                    words=_count(opts.get("words"), "words", text))


def looks_like_hub_id(source: str) -> bool:
    """True for ``org/name`` that is no local path and has no data-file suffix."""
    if not _HUB_ID.match(source) or "/" not in source or source.lower().endswith(_DATA_SUFFIXES):
        return False
    try:
        return not Path(source).exists()
    except (OSError, ValueError):
        return False


def _show(text: str) -> str:
    """The spec as an error message quotes it: as typed, or repr() where it holds control characters
    (a newline would break the one-line message)."""
    return text if text.isprintable() else repr(text)


def _split_options(text: str) -> tuple[str, dict[str, str]]:
    """(source, options). A '?' is part of the path when the whole text names an existing file."""
    if "?" not in text or _exists(text):
        return text.strip(), {}
    source, query = text.split("?", 1)
    opts: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        key = key.strip()
        if key not in OPTIONS:
            close = difflib.get_close_matches(key, OPTIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DataError(f"{_show(text)}: unknown option {key!r}{hint}; expected one of: {', '.join(OPTIONS)}")
        if not eq or not value.strip():
            raise DataError(f"{_show(text)}: option {key!r} needs a value ({key}=...)")
        if key in opts:
            raise DataError(f"{_show(text)}: option {key!r} is given twice")
        opts[key] = value.strip()
    return source.strip(), opts


def _exists(text: str) -> bool:
    try:
        return Path(text).exists()
    except (OSError, ValueError):
        return False


def _keep(value: str | None, text: str) -> tuple[str, ...]:
    """``keep=a,b`` as ("a", "b"); empty names or one named twice are a DataError."""
    if value is None:
        return ()
    names = tuple(name.strip() for name in value.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise DataError(f"{_show(text)}: keep expects column names separated by commas, each once "
                        f"(e.g. keep=prompt,answer), got {value!r}")
    return names


def _columns(value: str | None, text: str) -> tuple[tuple[str, str], ...]:
    """``prompt:question,answer:solution`` -> (("prompt", "question"), ("answer", "solution"))."""
    if value is None:
        return ()
    pairs = []
    for item in value.split(","):
        to, sep, src = item.partition(":")
        if not sep or not to.strip() or not src.strip():
            raise DataError(f"{_show(text)}: columns expects FIELD:COLUMN pairs separated by commas "
                            f"(e.g. columns=prompt:question), got {item!r}")
        pairs.append((to.strip(), src.strip()))
    targets = [t for t, _ in pairs]
    dupes = sorted({t for t in targets if targets.count(t) > 1})
    if dupes:
        raise DataError(f"{_show(text)}: columns maps field {dupes[0]!r} twice")
    return tuple(pairs)


def _flag(value: str | None, key: str, text: str) -> bool:
    if value is None:
        return False
    v = value.lower()
    if v not in ("true", "false", "1", "0", "yes", "no"):
        raise DataError(f"{_show(text)}: option {key!r} must be true or false, got {value!r}")
    return v in ("true", "1", "yes")


def _count(value: str | None, key: str, text: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise DataError(f"{_show(text)}: option {key!r} must be a positive integer, got {value!r}")
    return int(value)
