"""docs/data-formats.md: every example record loads with the loader of its section, as the page says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlhfkit.data import load_preferences, load_prompts, load_sft_examples

DOC = Path(__file__).resolve().parents[2] / "docs" / "data-formats.md"
LOADERS = {"Prompts": load_prompts, "Supervised fine-tuning": load_sft_examples, "Preference pairs": load_preferences}
# (section, heading) -> (spec options, the fields read from the example)
EXPECTED = {
    ("Prompts", "TRL standard prompt"): ("", {"prompt": "Write a short review of a bakery."}),
    ("Prompts", "TRL conversational prompt"): ("", {"prompt": "Describe a sunrise."}),
    ("Prompts", "Chat messages"): ("", {"prompt": "Another one?"}),
    ("Prompts", "GSM8K"): ("", {"prompt": "Sam has 3 apples and buys 4 more. How many apples does Sam have?",
                                "answer": "3 + 4 = 7\n#### 7"}),
    ("Prompts", "IMDB-style text (sentiment task)"): ("?columns=prompt:text&words=8",
                                                      {"prompt": "I rented this movie because my friend said"}),
    ("Supervised fine-tuning", "Prompt and response (TRL prompt-completion)"): (
        "", {"prompt": "How many minutes are in 3 hours?", "response": "180 minutes."}),
    ("Supervised fine-tuning", "TRL conversational prompt-completion"): ("", {"response": "Paris."}),
    ("Supervised fine-tuning", "Chat messages"): ("", {"response": "Rome."}),
    ("Supervised fine-tuning", "GSM8K"): ("", {"response": "10 - 4 = 6\n#### 6"}),
    ("Supervised fine-tuning", "Plain text (TRL language modelling)"): (
        "", {"prompt": "", "text": "The bakery on the corner sells the best rye bread in town."}),
    ("Preference pairs", "TRL standard preference"): ("", {"chosen": "Lovely coffee and kind staff."}),
    ("Preference pairs", "TRL conversational preference"): ("", {"prompt": "Capital of Spain?", "rejected": "Seville."}),
    ("Preference pairs", "TRL implicit prompt (conversational)"): (
        "", {"prompt": "Capital of Portugal?", "chosen": "Lisbon.", "rejected": "Porto."}),
    ("Preference pairs", "Anthropic HH"): ("", {"prompt": "What is 2 + 2?", "chosen": "4.", "rejected": "5, probably."}),
    ("Preference pairs", "UltraFeedback binarized"): (
        "", {"prompt": "Name a prime number.", "chosen": "7.", "rejected": "9.",
             "messages": [{"role": "user", "content": "Name a prime number."}]}),
}


def examples() -> dict[tuple[str, str], str]:
    """(section, heading) -> the JSON line in its ```jsonl block."""
    out, section, heading = {}, None, None
    for block in re.split(r"^(##+ .*)$", DOC.read_text(encoding="utf-8"), flags=re.M):
        if block.startswith("### "):
            heading = block[4:].strip()
        elif block.startswith("## "):
            section = next((k for k in LOADERS if block[3:].startswith(k)), None)
        else:
            for line in re.findall(r"```jsonl\n(.*?)\n```", block, flags=re.S):
                out[(section, heading)] = line
    return out


def test_every_documented_format_is_checked():
    assert set(examples()) == set(EXPECTED)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_documented_example_loads_as_described(key, tmp_path):
    options, fields = EXPECTED[key]
    path = tmp_path / "example.jsonl"
    path.write_text(examples()[key] + "\n", encoding="utf-8")
    record = LOADERS[key[0]](f"{path}{options}")[0]
    assert {k: record[k] for k in fields} == fields
