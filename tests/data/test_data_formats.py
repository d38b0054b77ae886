"""Data specs (source?options) and the record formats people already have, from local files.

Hub ids are in test_data_hub.py (they need `datasets`); nothing here does.
"""

from __future__ import annotations

import json

import pytest

from rlhfkit.data import load_preferences, load_prompts, load_sft_examples
from rlhfkit.data.formats import hh_messages, opener, split_conversations, split_hh
from rlhfkit.data.spec import looks_like_hub_id, parse_spec
from rlhfkit.errors import DataError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def user(text):
    return {"role": "user", "content": text}


def bot(text):
    return {"role": "assistant", "content": text}


# --------------------------------------------------------------------------- spec syntax


def test_spec_parses_source_and_every_option():
    s = parse_spec("hf:openai/gsm8k?config=main&split=test[:10]&revision=abc&columns=prompt:question,x:y"
                   "&streaming=true&take=5&words=8")
    assert (s.kind, s.name, s.config, s.split, s.revision) == ("hub", "openai/gsm8k", "main", "test[:10]", "abc")
    assert s.columns == (("prompt", "question"), ("x", "y"))
    assert (s.streaming, s.take, s.words) == (True, 5, 8)
    assert parse_spec("builtin:reviews").kind == "builtin"
    plain = parse_spec("HuggingFaceH4/ultrafeedback_binarized?split=train_prefs")
    assert (plain.kind, plain.name, plain.split) == ("hub", "HuggingFaceH4/ultrafeedback_binarized", "train_prefs")


def test_plain_org_name_is_a_hub_id_only_when_no_such_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert looks_like_hub_id("org/name")
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not looks_like_hub_id("org/name")  # an existing local folder wins
    assert not looks_like_hub_id("data/missing.jsonl")  # a data file name: "no such file", not a Hub lookup
    assert not looks_like_hub_id("name") and not looks_like_hub_id("/abs/path")
    assert parse_spec("org/name?take=3").kind == "file"


def test_question_mark_in_an_existing_file_name_is_part_of_the_path(tmp_path):
    path = write_jsonl(tmp_path / "what?.jsonl", [{"prompt": "a"}])
    assert parse_spec(path).name == path
    assert load_prompts(path) == [{"prompt": "a"}]


@pytest.mark.parametrize("spec, message", [
    ("p.jsonl?colums=prompt:q", "p.jsonl?colums=prompt:q: unknown option 'colums' (did you mean 'columns'?); "
                                "expected one of: config, split, revision, columns, keep, streaming, take, words"),
    ("p.jsonl?config=main", "p.jsonl?config=main: option 'config' applies to Hub datasets only (hf:ORG/NAME)"),
    ("hf:a/b?columns=prompt", "hf:a/b?columns=prompt: columns expects FIELD:COLUMN pairs separated by commas "
                              "(e.g. columns=prompt:question), got 'prompt'"),
    ("hf:a/b?columns=p:x,p:y", "hf:a/b?columns=p:x,p:y: columns maps field 'p' twice"),
    ("hf:a/b?take=0", "hf:a/b?take=0: option 'take' must be a positive integer, got '0'"),
    ("hf:a/b?streaming=maybe", "hf:a/b?streaming=maybe: option 'streaming' must be true or false, got 'maybe'"),
    ("hf:a/b?split=", "hf:a/b?split=: option 'split' needs a value (split=...)"),
    ("hf:a/b?take=1&take=2", "hf:a/b?take=1&take=2: option 'take' is given twice"),
    ("builtin:reviews?take=3", "builtin:reviews?take=3: built-in data sets take no '?' options"),
    ("hf:a b", "hf:a b: 'a b' is not a Hub dataset id (expected ORG/NAME)"),
])
def test_spec_errors_are_one_line_and_name_the_spec(spec, message):
    with pytest.raises(DataError) as err:
        parse_spec(spec)
    assert str(err.value) == message


# --------------------------------------------------------------------------- column mapping, take, words


def test_columns_map_a_csv_column_and_a_missing_one_names_the_columns_found(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text("instruction,id\nSay hi.,1\nSay bye.,2\n", encoding="utf-8")
    assert load_prompts(f"{path}?columns=prompt:instruction") == [
        {"prompt": "Say hi.", "id": "1"}, {"prompt": "Say bye.", "id": "2"}]
    with pytest.raises(DataError) as err:
        load_prompts(f"{path}?columns=prompt:instructions")
    assert str(err.value) == f"{path}:2: columns=prompt:instructions: missing field 'instructions'; found: instruction, id"


def test_take_reads_the_first_records_of_a_file(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    assert [r["prompt"] for r in load_prompts(f"{path}?take=2")] == ["p0", "p1"]


def test_imdb_style_text_becomes_an_opener_of_n_words(tmp_path):
    review = "I rented this movie<br /><br />because my   friend said it was the best film of the year."
    path = write_jsonl(tmp_path / "imdb.jsonl", [{"text": review, "label": 1}])
    rows = load_prompts(f"{path}?columns=prompt:text&words=6")
    assert rows == [{"prompt": "I rented this movie because my", "label": 1}]
    assert opener("a<br/>b  c", 2) == "a b"
    with pytest.raises(DataError, match="missing field 'prompt'"):  # `text` alone is not a prompt
        load_prompts(path)


def test_pinned_split_selects_records_of_a_local_file(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "split": "train"}, {"prompt": "b", "split": "dev"}])
    assert load_prompts(f"{path}?split=dev") == [{"prompt": "b"}]
    assert load_prompts(f"{path}?split=dev", split="test") == [{"prompt": "b"}]  # pinned wins


# --------------------------------------------------------------------------- TRL formats


def test_trl_standard_and_conversational_formats(tmp_path):
    conv_prompt = [user("Capital of France?")]
    assert load_prompts(write_jsonl(tmp_path / "a.jsonl", [{"prompt": "Hi."}])) == [{"prompt": "Hi."}]
    assert load_prompts(write_jsonl(tmp_path / "b.jsonl", [{"prompt": conv_prompt}]))[0]["prompt"] == "Capital of France?"
    sft = load_sft_examples(write_jsonl(tmp_path / "c.jsonl", [
        {"prompt": "Hi", "completion": "Hello!"},
        {"prompt": conv_prompt, "completion": [bot("Paris.")]},
    ]))
    assert [(r["prompt"], r["response"]) for r in sft] == [("Hi", "Hello!"), (conv_prompt, "Paris.")]
    pairs = load_preferences(write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."},
        {"prompt": conv_prompt, "chosen": [bot("Paris.")], "rejected": [bot("Lyon.")]},
    ]))
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in pairs] == [
        ("Hi", "Hello!", "Go away."), ("Capital of France?", "Paris.", "Lyon.")]


def test_trl_implicit_prompt_conversations_share_their_beginning(tmp_path):
    head = [{"role": "system", "content": "Be brief."}, user("Capital of France?")]
    row = {"chosen": head + [bot("Paris.")], "rejected": head + [bot("Lyon.")]}
    pair = load_preferences(write_jsonl(tmp_path / "p.jsonl", [row]))[0]
    assert (pair["prompt"], pair["messages"], pair["chosen"], pair["rejected"]) == (
        "Capital of France?", head, "Paris.", "Lyon.")
    with pytest.raises(DataError, match="must share their messages up to a user turn"):
        split_conversations([user("a"), bot("b")], [user("c"), bot("d")], "x:1")
    with pytest.raises(DataError, match=r"field 'chosen' must add exactly one assistant turn after the shared prompt, "
                                        r"got 2 message\(s\) ending with a 'user' turn"):
        split_conversations(head + [bot("Paris."), user("More?")], head + [bot("Lyon.")], "x:1")


# --------------------------------------------------------------------------- Anthropic HH


def test_hh_pair_splits_at_the_last_shared_assistant_turn():
    chosen = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke.\n\nAssistant: Why did the chicken..."
    rejected = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke.\n\nAssistant: No."
    out = split_hh(chosen, rejected, "hh.jsonl:1")
    assert out == {"prompt": [user("Hi there"), bot("Hello!"), user("Tell me a joke.")],
                   "chosen": "Why did the chicken...", "rejected": "No."}
    # responses that start alike still split at the marker, not inside the shared first word
    assert split_hh("\n\nHuman: a\n\nAssistant: I love it", "\n\nHuman: a\n\nAssistant: I hate it", "w")[
        "chosen"] == "I love it"
    assert hh_messages("Human: no leading newlines", "w") == [user("no leading newlines")]


def test_hh_errors_name_the_record():
    with pytest.raises(DataError, match=r"^hh.jsonl:3: 'chosen' and 'rejected' share no"):
        split_hh("\n\nHuman: a\n\nAssistant: b", "\n\nHuman: c\n\nAssistant: d", "hh.jsonl:3")
    with pytest.raises(DataError, match="must start with '\\\\n\\\\nHuman:'"):
        hh_messages("Intro text\n\nHuman: a", "w")


def test_hh_file_loads_as_pairs_and_as_prompts(tmp_path):
    rows = [{"chosen": "\n\nHuman: What is 2+2?\n\nAssistant: 4.", "rejected": "\n\nHuman: What is 2+2?\n\nAssistant: 5."}]
    path = write_jsonl(tmp_path / "hh.jsonl", rows)
    pair = load_preferences(path)[0]
    assert (pair["prompt"], pair["messages"], pair["chosen"], pair["rejected"]) == (
        "What is 2+2?", [user("What is 2+2?")], "4.", "5.")
    assert load_prompts(path)[0]["prompt"] == "What is 2+2?"
    # plain strings without HH markers still need a prompt field
    with pytest.raises(DataError, match="missing field 'prompt'"):
        load_preferences(write_jsonl(tmp_path / "x.jsonl", [{"chosen": "a", "rejected": "b"}]))


# --------------------------------------------------------------------------- GSM8K, UltraFeedback


def test_gsm8k_question_answer_for_prompts_sft_and_the_arithmetic_reward(tmp_path):
    from rlhfkit.rewards import get_reward, score_batch

    row = {"question": "Sam has 3 apples and buys 4 more. How many now?", "answer": "3 + 4 = 7\n#### 7"}
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [row])
    prompt = load_prompts(path)[0]
    assert prompt == {"prompt": row["question"], "answer": row["answer"]}
    scores = score_batch(get_reward("arithmetic"), [prompt["prompt"]] * 2, ["It is 7.", "It is 8."],
                         {"answer": [row["answer"]] * 2})
    assert list(scores) == [1.0, 0.0]
    assert load_sft_examples(path) == [{"prompt": row["question"], "response": row["answer"]}]


def ultrafeedback_row(i):
    q = f"Question {i}?"
    return {"prompt": q, "prompt_id": f"id{i}", "chosen": [user(q), bot(f"Good {i}.")],
            "rejected": [user(q), bot(f"Bad {i}.")], "messages": [user(q), bot(f"Good {i}.")],
            "score_chosen": 8.0, "score_rejected": 3.5}


def test_ultrafeedback_binarized_rows_for_prefs_sft_and_prompts(tmp_path):
    path = write_jsonl(tmp_path / "uf.jsonl", [ultrafeedback_row(0)])
    pair = load_preferences(path)[0]
    # `messages` (which holds the chosen answer) is cut to the prompt turn: DPO formats it as the prompt
    assert (pair["prompt"], pair["messages"], pair["chosen"], pair["rejected"]) == (
        "Question 0?", [user("Question 0?")], "Good 0.", "Bad 0.")
    assert (pair["score_chosen"], pair["score_rejected"]) == (8.0, 3.5)
    sft = load_sft_examples(path)[0]
    assert (sft["prompt"], sft["response"]) == ([user("Question 0?")], "Good 0.")
    prompt = load_prompts(path)[0]
    assert (prompt["prompt"], prompt["messages"]) == ("Question 0?", [user("Question 0?")])
