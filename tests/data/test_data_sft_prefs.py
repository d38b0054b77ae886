"""load_sft_examples and load_preferences: normalisation and validation."""

from __future__ import annotations

import json

import pytest

from rlhfkit.data import load_preferences, load_sft_examples
from rlhfkit.errors import DataError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------- SFT


def test_builtin_instructions_have_short_helpful_responses():
    train = load_sft_examples("builtin:instructions")
    test = load_sft_examples("builtin:instructions", "test")
    assert len(train) + len(test) >= 150
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all(isinstance(r["response"], str) and 2 <= len(r["response"].split()) <= 80 for r in train + test)
    assert len({r["task"] for r in train}) >= 6  # explain, list, rewrite, summarise, classify, math, ...


def test_builtin_arithmetic_sft_targets_are_the_numbers():
    rows = load_sft_examples("builtin:arithmetic", limit=5)
    assert all(r["response"] == str(r["answer_value"]) for r in rows)


def test_prompt_only_builtins_are_rejected_for_sft():
    with pytest.raises(DataError, match="builtin:reviews has prompts only"):
        load_sft_examples("builtin:reviews")


def test_prompt_response_and_completion_alias(tmp_path):
    path = write_jsonl(
        tmp_path / "s.jsonl",
        [{"prompt": "Hi", "response": "Hello!"}, {"prompt": "Bye", "completion": "See you."}],
    )
    assert load_sft_examples(path) == [
        {"prompt": "Hi", "response": "Hello!"},
        {"prompt": "Bye", "response": "See you."},
    ]


def test_chat_messages_become_prompt_messages_and_response(tmp_path):
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    row = load_sft_examples(write_jsonl(tmp_path / "s.jsonl", [{"messages": conv}]))[0]
    assert row["prompt"] == conv[:2]
    assert row["response"] == "Paris."
    assert row["messages"] == conv


@pytest.mark.parametrize(
    "row, match",
    [
        ({"prompt": "Hi"}, r"missing field 'response' \(expected one of: response, completion, messages\)"),
        ({"response": "x"}, r"missing field 'prompt' \(expected one of: prompt, messages, text\)"),
        ({"prompt": "Hi", "response": ""}, "field 'response' must be a non-empty string"),
        (
            {"messages": [{"role": "user", "content": "Hi"}]},
            "field .messages. must end with an assistant turn",
        ),
        ({"messages": [{"role": "assistant", "content": "Hi"}]}, "field .messages. has no user turn before"),
    ],
)
def test_bad_sft_records_name_the_line(tmp_path, row, match):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "ok", "response": "ok"}, row])
    with pytest.raises(DataError, match=rf"s\.jsonl:2: {match}"):
        load_sft_examples(path)


# --------------------------------------------------------------------------- preferences


def test_csv_preferences_with_numeric_strings_and_blank_cells(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(
        "prompt,chosen,rejected,margin,scores\n"
        'Say hi,Hello!,Go away.,0.5,"[1.0, -0.5]"\n'
        "Say bye,Goodbye!,Whatever.,,\n"
    )
    rows = load_preferences(str(path))
    assert rows[0] == {
        "prompt": "Say hi",
        "chosen": "Hello!",
        "rejected": "Go away.",
        "margin": 0.5,
        "scores": [1.0, -0.5],
    }
    assert rows[1] == {"prompt": "Say bye", "chosen": "Goodbye!", "rejected": "Whatever."}


def test_jsonl_preferences_with_strength_and_score_object(tmp_path):
    row = {
        "prompt": "Q",
        "chosen": "good",
        "rejected": "bad",
        "strength": 1,
        "scores": {"chosen": 2, "rejected": 0},
    }
    out = load_preferences(write_jsonl(tmp_path / "p.jsonl", [row]))[0]
    assert out["strength"] == 1.0 and isinstance(out["strength"], float)
    assert out["scores"] == {"chosen": 2.0, "rejected": 0.0}


def test_trl_conversational_preferences(tmp_path):
    row = {
        "prompt": [{"role": "user", "content": "Pick a color."}],
        "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "No."}],
    }
    out = load_preferences(write_jsonl(tmp_path / "p.jsonl", [row]))[0]
    assert (out["prompt"], out["chosen"], out["rejected"]) == ("Pick a color.", "Blue.", "No.")
    assert out["messages"] == row["prompt"]


@pytest.mark.parametrize(
    "row, match",
    [
        ({"prompt": "Q", "chosen": "same", "rejected": "same "}, "'chosen' and 'rejected' are identical"),
        ({"prompt": "Q", "chosen": "", "rejected": "b"}, "field 'chosen' must be a non-empty string"),
        ({"prompt": "Q", "chosen": "a", "rejected": 3}, "field 'rejected' must be a string, got a number"),
        ({"prompt": "Q", "chosen": "a"}, "missing field 'rejected'"),
        ({"chosen": "a", "rejected": "b"}, "missing field 'prompt'"),
        ({"prompt": "Q", "chosen": "a", "rejected": "b", "margin": "big"}, "field 'margin' must be a number"),
        (
            {"prompt": "Q", "chosen": "a", "rejected": "b", "strength": float("nan")},
            "field 'strength' must be a finite number",
        ),
        (
            {"prompt": "Q", "chosen": "a", "rejected": "b", "scores": "oops"},
            "field 'scores' must be a list or object",
        ),
        (
            {"prompt": "Q", "chosen": "a", "rejected": "b", "scores": [1, "x"]},
            "field 'scores' must be a number",
        ),
    ],
)
def test_bad_preferences_name_the_line_and_field(tmp_path, row, match):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q", "chosen": "a", "rejected": "b"}, row])
    with pytest.raises(DataError, match=rf"p\.jsonl:2: {match}"):
        load_preferences(path)


def test_builtin_preferences_point_to_prefs_make():
    with pytest.raises(DataError, match="rlhfkit prefs make"):
        load_preferences("builtin:reviews")
