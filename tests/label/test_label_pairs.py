"""The scale mapping and the pairs file: validation with file:line errors, sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfkit.errors import DataError, UserError
from rlhfkit.label.pairs import (
    Pair,
    build_pairs,
    is_pair_id,
    pair_id_for,
    read_pairs,
    sample_pairs,
    write_pairs,
)
from rlhfkit.label.scale import margin_from_mean, score_from_choice, strength_from_mean


@pytest.mark.parametrize(
    ("choice", "left", "score"),
    [(1, "a", 2), (2, "a", 1), (3, "a", 0), (4, "a", -1), (5, "a", -2),
     (1, "b", -2), (2, "b", -1), (3, "b", 0), (4, "b", 1), (5, "b", 2)],
)
def test_score_from_choice(choice: int, left: str, score: int) -> None:
    assert score_from_choice(choice, left) == score


def test_score_from_choice_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        score_from_choice(0, "a")
    with pytest.raises(ValueError):
        score_from_choice(1, "left")


def test_strength_and_margin() -> None:
    assert [strength_from_mean(m) for m in (2, -2, 1.5, 1.49, 1, -0.5)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5]
    assert margin_from_mean(-2) == 1.0 and margin_from_mean(1) == 0.5 and margin_from_mean(1.5, scale=2) == 1.5


def test_read_write_round_trip(tmp_path: Path) -> None:
    pairs = [Pair("x1", "p", "a <b>", "b", "m1", "m2"), Pair("x2", "q", "", "c")]
    write_pairs(pairs, tmp_path / "p.jsonl")
    assert read_pairs(tmp_path / "p.jsonl") == pairs


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"pair_id": "a1", "prompt": "p", "response_a": "x", "response_b": "y"})


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"pair_id": "a2", "prompt": "p", "response_a": "x"}), "missing field(s) response_b"),
        (json.dumps({"pair_id": "a2", "prompt": "p", "response_a": 3, "response_b": "y"}), "'response_a' must be a string"),
        (json.dumps({"pair_id": "../etc", "prompt": "p", "response_a": "x", "response_b": "y"}), "pair_id '../etc'"),
        (json.dumps({"pair_id": "a2", "prompt": "  ", "response_a": "x", "response_b": "y"}), "prompt is empty"),
        (json.dumps({"pair_id": "a2", "prompt": "p", "response_a": "x", "response_b": "x "}), "identical"),
        # Invisible characters (default-ignorable: zero width space, word joiner, BOM, soft hyphen,
        # variation selector) used to make an empty prompt or two equal responses look different.
        (json.dumps({"pair_id": "a2", "prompt": "\u200b", "response_a": "x", "response_b": "y"}), "prompt is empty"),
        (json.dumps({"pair_id": "a2", "prompt": " \u2060\ufeff\u00ad\ufe0f ", "response_a": "x", "response_b": "y"}),
         "prompt is empty"),
        (json.dumps({"pair_id": "a2", "prompt": "p", "response_a": "x", "response_b": "x\u200b"}), "identical"),
        (GOOD, "duplicate pair_id 'a1' (first on line 1)"),
    ],
)
def test_read_pairs_reports_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = _write(tmp_path, [GOOD, "", bad_line])
    with pytest.raises(DataError) as err:
        read_pairs(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert message in str(err.value)


def test_read_pairs_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        read_pairs(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="no pairs"):
        read_pairs(_write(tmp_path, [""]))


def test_build_pairs_drops_identical_and_duplicates() -> None:
    pairs, dropped = build_pairs(["p1", "p2", "p1"], ["x", "same", "x"], ["y", "same\n", "y"], "m", "m")
    assert dropped == 2
    assert [(p.prompt, p.response_a, p.response_b) for p in pairs] == [("p1", "x", "y")]
    assert pairs[0].pair_id == pair_id_for("p1", "x", "y") != pair_id_for("p1", "y", "x")


def fake_sampler(calls: list):
    def sample_texts(model, prompts, num_samples, max_new_tokens=64, temperature=1.0, seed=0):
        calls.append((model, num_samples, max_new_tokens, temperature, seed))
        return [[f"{model}:{p}:{k}" for k in range(num_samples)] for p in prompts]

    return sample_texts


def test_sample_pairs_one_model_draws_two_samples() -> None:
    calls: list = []
    pairs, dropped = sample_pairs(["hi", "yo"], fake_sampler(calls), "m1", max_new_tokens=8, seed=3)
    assert calls == [("m1", 2, 8, 1.0, 3)] and dropped == 0
    assert [(p.response_a, p.response_b, p.model_a, p.model_b) for p in pairs] == [
        ("m1:hi:0", "m1:hi:1", "m1", "m1"), ("m1:yo:0", "m1:yo:1", "m1", "m1")]


def test_sample_pairs_two_models_draw_one_each() -> None:
    calls: list = []
    pairs, _ = sample_pairs(["hi"], fake_sampler(calls), "m1", "m2")
    assert [c[:2] for c in calls] == [("m1", 1), ("m2", 1)]
    assert (pairs[0].response_a, pairs[0].response_b, pairs[0].model_b) == ("m1:hi:0", "m2:hi:0", "m2")


def test_sample_pairs_checks_sampler_output() -> None:
    with pytest.raises(UserError, match="expected 2 text"):
        sample_pairs(["hi"], lambda *a, **k: [["only one"]], "m1")


# --------------------------------------------------------------------------- one pair_id rule, bad bytes


@pytest.mark.parametrize("pair_id", ["a1\n", "a1\r\n", "\na1", "a1 ", "a" * 129, "-a1", "a/1"])
def test_pair_id_rule_is_a_full_match(tmp_path: Path, pair_id: str) -> None:
    """'$' used to accept an id ending in a newline that the API then refused forever."""
    assert not is_pair_id(pair_id)
    line = json.dumps({"pair_id": pair_id, "prompt": "p", "response_a": "x", "response_b": "y"})
    with pytest.raises(DataError, match=r"pairs.jsonl:2: pair_id .* must be 1-128 characters"):
        read_pairs(_write(tmp_path, [GOOD, line]))


def test_pair_ids_the_file_accepts_are_the_ids_the_api_accepts() -> None:
    from pydantic import TypeAdapter, ValidationError

    from rlhfkit.label.app import PairId

    api = TypeAdapter(PairId)
    for pair_id in ["a1", "A.b:c-d_e", "9" * 128, "a1\n", "a" * 129, "_a", "a b"]:
        try:
            api.validate_python(pair_id)
            api_ok = True
        except ValidationError:
            api_ok = False
        assert api_ok == is_pair_id(pair_id), pair_id


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"pair_id": "a2", "prompt": "caf\xff", "response_a": "x", "response_b": "y"}\n',
         "not UTF-8 (byte 0xff at column 33)"),  # 32 bytes before it: '{"pair_id": "a2", "prompt": "caf'
        (b'{"pair_id": "a2", "prompt": "p", "response_a": "\\ud800", "response_b": "y"}\n',
         r"field 'response_a' holds a lone surrogate (\ud800), which is not text"),
        (b'{"pair_id": "a2", "prompt": "p", "response_a": "x", "response_b": "y", "model_a": "\\udfff"}\n',
         r"field 'model_a' holds a lone surrogate (\udfff), which is not text"),
    ],
)
def test_bad_bytes_and_lone_surrogates_get_file_and_line(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_bytes((GOOD + "\n").encode() + raw)
    with pytest.raises(DataError) as err:
        read_pairs(path)
    assert str(err.value) == f"{path}:2: {message}"


def test_a_utf8_bom_at_the_start_is_accepted_and_a_real_surrogate_pair_is_text(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    emoji = json.dumps({"pair_id": "e1", "prompt": "\U0001f600?", "response_a": "\ud83d\ude00", "response_b": "no"})
    path.write_bytes(b"\xef\xbb\xbf" + (GOOD + "\n" + emoji + "\n").encode())
    assert [(p.pair_id, p.response_a) for p in read_pairs(path)] == [("a1", "x"), ("e1", "\U0001f600")]
