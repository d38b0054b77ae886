"""load_prompts and the built-in prompt sets."""

from __future__ import annotations

import json

import pytest

from rlhfkit.data import load_prompts
from rlhfkit.data.prompts import info_fields
from rlhfkit.data.sets import BUILTIN_NAMES
from rlhfkit.errors import ConfigError, DataError

MIN_SIZES = {"reviews": 200, "stories": 100, "instructions": 150, "arithmetic": 1000, "python-tasks": 150}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- built-in sets


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_splits_are_disjoint_sized_and_deterministic(name):
    spec = f"builtin:{name}"
    train, test = load_prompts(spec, "train"), load_prompts(spec, "test")
    assert len(train) + len(test) >= MIN_SIZES[name]
    assert 0.05 <= len(test) / (len(train) + len(test)) <= 0.2
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all(isinstance(r["prompt"], str) and r["prompt"].strip() for r in train + test)
    assert all("split" not in r for r in train)  # consumed by the loader, not passed to rewards
    assert load_prompts(spec, "train") == train  # same content, same order


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_split_none_returns_every_split_tagged(name):
    rows = load_prompts(f"builtin:{name}", None)
    train = load_prompts(f"builtin:{name}", "train")
    assert len(rows) == len(train) + len(load_prompts(f"builtin:{name}", "test"))
    assert [r["prompt"] for r in rows if r["split"] == "train"] == [r["prompt"] for r in train]


@pytest.mark.parametrize("name", ["reviews", "stories", "instructions", "python-tasks"])
def test_builtin_files_have_no_duplicate_prompts(name):
    rows = load_prompts(f"builtin:{name}", "train") + load_prompts(f"builtin:{name}", "test")
    prompts = [r["prompt"].lower() for r in rows]
    assert len(set(prompts)) == len(prompts)


def test_review_prompts_ask_for_a_review_without_taking_a_side():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyzer = SentimentIntensityAnalyzer()
    rows = load_prompts("builtin:reviews", "train") + load_prompts("builtin:reviews", "test")
    assert all("review" in r["prompt"].lower() for r in rows)
    # The PPO demo rewards VADER sentiment of the reply; a prompt that already
    # leans positive or negative would hand the policy the answer.
    scores = {r["prompt"]: analyzer.polarity_scores(r["prompt"])["compound"] for r in rows}
    leaning = {p: s for p, s in scores.items() if abs(s) > 0.05}
    assert not leaning
    assert len({r["category"] for r in rows}) >= 6  # products, films, books, places, apps, ...


def test_story_prompts_are_continuations():
    rows = load_prompts("builtin:stories", "train")
    assert all(r["prompt"].startswith(("Continue", "Write the next")) for r in rows)


def test_arithmetic_prompts_carry_answers_for_the_reward():
    rows = load_prompts("builtin:arithmetic", "test", limit=20)
    info = info_fields(rows)
    assert set(info) >= {"answer", "answer_value"}
    for row, ans, val in zip(rows, info["answer"], info["answer_value"]):
        assert ans.endswith(f"#### {val}")
        assert "Answer with just the number." in row["prompt"]


def test_unknown_builtin_and_split_errors():
    with pytest.raises(DataError, match=r"did you mean 'builtin:stories'\?"):
        load_prompts("builtin:storys")
    with pytest.raises(
        DataError, match=r"builtin:reviews: unknown split 'validation' \(expected one of: train, test\)"
    ):
        load_prompts("builtin:reviews", "validation")


# --------------------------------------------------------------------------- limit / seed


def test_limit_takes_a_seeded_subset():
    a = load_prompts("builtin:reviews", limit=10, seed=1)
    assert len(a) == 10
    assert a == load_prompts("builtin:reviews", limit=10, seed=1)
    assert a != load_prompts("builtin:reviews", limit=10, seed=2)
    everything = load_prompts("builtin:reviews")
    assert {r["prompt"] for r in a} <= {r["prompt"] for r in everything}
    assert load_prompts("builtin:reviews", limit=10_000) == everything


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_limit(bad):
    with pytest.raises(ConfigError, match="limit must be a positive integer"):
        load_prompts("builtin:reviews", limit=bad)


# --------------------------------------------------------------------------- local files


def test_local_jsonl_keeps_extra_fields(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": "2+2?", "answer": "#### 4"}, {"prompt": "3+3?", "answer": "#### 6"}]
    )
    rows = load_prompts(str(path))
    assert rows == [{"prompt": "2+2?", "answer": "#### 4"}, {"prompt": "3+3?", "answer": "#### 6"}]
    assert info_fields(rows) == {"answer": ["#### 4", "#### 6"]}


def test_local_chat_messages_use_last_user_turn(tmp_path):
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
    ]
    rows = load_prompts(str(write_jsonl(tmp_path / "c.jsonl", [{"messages": conv}])))
    assert rows[0]["prompt"] == "Name a fruit."
    assert rows[0]["messages"] == conv[:4]  # cut after the prompt turn, ready for format_prompt


def test_trl_style_conversational_prompt(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": [{"role": "user", "content": "Say hi."}]}])
    assert load_prompts(str(path)) == [
        {"prompt": "Say hi.", "messages": [{"role": "user", "content": "Say hi."}]}
    ]


def test_missing_prompt_names_file_line_and_choices(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"text": "no prompt"}])
    with pytest.raises(DataError) as err:
        load_prompts(str(path))
    assert str(err.value) == f"{path}:2: missing field 'prompt' (expected one of: prompt, messages); found: text"


@pytest.mark.parametrize(
    "row, match",
    [
        ({"prompt": 5}, "field 'prompt' must be a string, got a number"),
        ({"prompt": "   "}, "field 'prompt' must be a non-empty string"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "has no user turn"),
        ({"messages": "hello"}, "field 'messages' must be a non-empty list"),
    ],
)
def test_bad_prompt_records(tmp_path, row, match):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, row])
    with pytest.raises(DataError, match=rf"p\.jsonl:2: .*{match}"):
        load_prompts(str(path))


def test_local_split_field_selects_rows(tmp_path):
    rows = [
        {"prompt": "a", "split": "train"},
        {"prompt": "b", "split": "test"},
        {"prompt": "c", "split": "train"},
    ]
    path = str(write_jsonl(tmp_path / "p.jsonl", rows))
    assert [r["prompt"] for r in load_prompts(path, "train")] == ["a", "c"]
    assert load_prompts(path, "test") == [{"prompt": "b"}]
    with pytest.raises(DataError, match=r"no records with split 'dev' \(found: test, train\)"):
        load_prompts(path, "dev")


def test_local_file_without_split_field_is_used_whole(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("one\ntwo\n")
    assert load_prompts(str(path), "test") == [{"prompt": "one"}, {"prompt": "two"}]


def test_csv_prompts(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,answer\nWhat is 1 + 1?,2\n")
    assert load_prompts(str(path)) == [{"prompt": "What is 1 + 1?", "answer": "2"}]


def test_info_fields_fills_missing_with_none():
    rows = [{"prompt": "a", "answer": 1}, {"prompt": "b", "topic": "x"}]
    assert info_fields(rows) == {"answer": [1, None], "topic": [None, "x"]}


def test_missing_path_mentions_the_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="data spec must be"):
        load_prompts("")
