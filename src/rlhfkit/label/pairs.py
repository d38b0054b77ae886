"""The pairs file: one JSON object per line, two responses to one prompt.

Format (JSONL, UTF-8)::

    {"pair_id": "3f2a9c01d4e7", "prompt": "...", "response_a": "...", "response_b": "...",
     "model_a": "smollm2-135m-instruct", "model_b": "smollm2-135m-instruct"}

``pair_id``, ``prompt``, ``response_a`` and ``response_b`` are required; ``model_a`` and
``model_b`` are optional strings. Unknown keys are ignored. Every problem (bytes that are not
UTF-8, a lone surrogate such as ``"\\ud800"``, bad JSON or fields) is reported as
``FILE:LINE: message``. ``pair_id`` follows one rule everywhere (file, database, API):
``is_pair_id``, a full-string match.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rlhfkit.errors import DataError, UserError
from rlhfkit.label.files import write_lines_atomic
from rlhfkit.label.identity import is_default_ignorable

PAIR_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
PAIR_ID_RULE = "1-128 characters of letters, digits, '_.:-', starting with a letter or digit"
REQUIRED = ("pair_id", "prompt", "response_a", "response_b")
OPTIONAL = ("model_a", "model_b")


@dataclass(frozen=True)
class Pair:
    """One comparison: a prompt and two responses (A and B as in the file, not as shown)."""

    pair_id: str
    prompt: str
    response_a: str
    response_b: str
    model_a: str = ""
    model_b: str = ""

    def to_json(self) -> str:
        """The pair as one JSONL line (no trailing newline)."""
        return json.dumps(asdict(self), ensure_ascii=False)


def is_pair_id(value: str) -> bool:
    """The one pair_id rule: the *whole* string must match (``$`` would accept a final newline)."""
    return PAIR_ID_RE.fullmatch(value) is not None


def _lone_surrogate(text: str) -> str | None:
    """The first code point that cannot be stored as UTF-8 (a lone surrogate), if any."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"\\u{ord(text[e.start]):04x}"
    return None


def _ignorable(ch: str) -> bool:
    return unicodedata.category(ch) == "Cf" or is_default_ignorable(ch)


def visible(text: str) -> str:
    """``text`` without default-ignorable characters and surrounding white space: what a reader
    sees (a prompt of only U+200B is empty; "x" and "x\u200b" are the same response)."""
    return "".join(ch for ch in text if not _ignorable(ch)).strip()


def parse_pair(obj: object, where: str) -> Pair:
    """Validate one decoded JSON line; ``where`` ("FILE:LINE") prefixes every error."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    for key in REQUIRED + OPTIONAL:
        if key in obj and not isinstance(obj[key], str):
            raise DataError(f"{where}: field '{key}' must be a string, got {type(obj[key]).__name__}")
        if key in obj and (bad := _lone_surrogate(obj[key])) is not None:
            raise DataError(f"{where}: field '{key}' holds a lone surrogate ({bad}), which is not text")
    if not is_pair_id(obj["pair_id"]):
        raise DataError(f"{where}: pair_id {obj['pair_id']!r} must be {PAIR_ID_RULE}")
    if not visible(obj["prompt"]):
        raise DataError(f"{where}: prompt is empty (or only invisible characters)")
    if visible(obj["response_a"]) == visible(obj["response_b"]):
        raise DataError(f"{where}: response_a and response_b are identical (nothing to compare)")
    return Pair(**{k: obj[k] for k in REQUIRED}, **{k: obj.get(k, "") for k in OPTIONAL})


def _decode(raw: bytes, where: str, first: bool) -> str:
    """One line of the file as text; a UTF-8 BOM is accepted at the very start."""
    try:
        return raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None


def _load_json(line: str, where: str) -> object:
    """One JSON value, or a ``FILE:LINE`` error: bad syntax, nesting deeper than the parser's
    recursion limit (``[`` x 100000), an integer longer than Python converts (4300 digits)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise DataError(f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError as e:  # int() refusing a number of thousands of digits
        raise DataError(f"{where}: invalid JSON ({str(e).split(';')[0]})") from None


def read_pairs(path: str | os.PathLike[str]) -> list[Pair]:
    """Read and validate a pairs file; blank lines are skipped, duplicate pair_ids rejected."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: pairs file not found")
    pairs: list[Pair] = []
    first_line: dict[str, int] = {}
    with path.open("rb") as f:  # bytes: a bad byte is reported with its line, not as a traceback
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            line = _decode(raw, where, first=lineno == 1)
            if not line.strip():
                continue
            pair = parse_pair(_load_json(line, where), where)
            if pair.pair_id in first_line:
                raise DataError(
                    f"{where}: duplicate pair_id {pair.pair_id!r} (first on line {first_line[pair.pair_id]})"
                )
            first_line[pair.pair_id] = lineno
            pairs.append(pair)
    if not pairs:
        raise DataError(f"{path}: no pairs in file")
    return pairs


def write_pairs(pairs: Sequence[Pair], path: str | os.PathLike[str]) -> None:
    """Write pairs as JSONL atomically (a uniquely named temporary file renamed into place)."""
    write_lines_atomic(Path(path), (pair.to_json() for pair in pairs))


def pair_id_for(prompt: str, response_a: str, response_b: str) -> str:
    """A stable id from the content, so the same pair always gets the same id."""
    digest = hashlib.sha256("\x1f".join((prompt, response_a, response_b)).encode("utf-8"))
    return digest.hexdigest()[:16]


def build_pairs(
    prompts: Sequence[str],
    responses_a: Sequence[str],
    responses_b: Sequence[str],
    model_a: str,
    model_b: str,
) -> tuple[list[Pair], int]:
    """Zip prompts with two responses each; returns (pairs, number dropped).

    Pairs whose two responses are identical carry no preference signal and are dropped, as
    are exact duplicates of an earlier pair.
    """
    if not (len(prompts) == len(responses_a) == len(responses_b)):
        raise ValueError("prompts and responses must have the same length")
    pairs: list[Pair] = []
    seen: set[str] = set()
    for prompt, ra, rb in zip(prompts, responses_a, responses_b):
        pid = pair_id_for(prompt, ra, rb)
        if visible(ra) == visible(rb) or pid in seen:
            continue
        seen.add(pid)
        pairs.append(Pair(pid, prompt, ra, rb, model_a, model_b))
    return pairs, len(prompts) - len(pairs)


SampleFn = Callable[..., list[list[str]]]


def sample_pairs(
    prompts: Sequence[str],
    sample_texts: SampleFn,
    model_a: str,
    model_b: str | None = None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
) -> tuple[list[Pair], int]:
    """Sample two responses per prompt: two from ``model_a``, or one from each model.

    ``sample_texts(model, prompts, num_samples, max_new_tokens=, temperature=, seed=)`` returns
    one list of ``num_samples`` strings per prompt (``rlhfkit.rollout.texts.sample_texts``).
    """
    kw = {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}
    prompts = list(prompts)
    if model_b is None:
        outs = sample_texts(model_a, prompts, 2, **kw)
        _check_shape(outs, len(prompts), 2, model_a)
        return build_pairs(prompts, [o[0] for o in outs], [o[1] for o in outs], model_a, model_a)
    outs_a = sample_texts(model_a, prompts, 1, **kw)
    outs_b = sample_texts(model_b, prompts, 1, **kw)
    _check_shape(outs_a, len(prompts), 1, model_a)
    _check_shape(outs_b, len(prompts), 1, model_b)
    return build_pairs(prompts, [o[0] for o in outs_a], [o[0] for o in outs_b], model_a, model_b)


def _check_shape(outs: list[list[str]], n_prompts: int, n_samples: int, model: str) -> None:
    """Fail loudly if a sampler returned the wrong number of texts."""
    if len(outs) != n_prompts or any(len(o) < n_samples for o in outs):
        raise UserError(
            f"sampling from {model} returned {len(outs)} result(s) for {n_prompts} prompt(s); "
            f"expected {n_samples} text(s) each"
        )
