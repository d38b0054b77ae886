"""What an evaluation runs on is said exactly: held-out records, training records (the data has no
held-out split), or records held back by eval_fraction; nothing is held back silently."""

from __future__ import annotations

import json

from rlhfkit.data.sft import load_sft_examples
from rlhfkit.data.splits import eval_phrase, split_for_eval

NO_SPLIT = "(the data has no held-out split; eval_dataset= or eval_split= to give one)"


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_a_file_without_a_split_is_evaluated_on_its_training_rows_and_says_so(tmp_path):
    data = _write(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(8)])
    train, held, source = split_for_eval(load_sft_examples, data, None, 0.0, seed=0)
    assert (len(train), len(held), source) == (8, 8, "training")  # all 8 trained on: none held back
    assert held == train
    assert eval_phrase(len(held), "examples", source) == f"8 training examples {NO_SPLIT}"
    assert eval_phrase(8, "prompts", "training") == f"8 training prompts {NO_SPLIT}"


def test_held_back_rows_are_named_with_the_fraction(tmp_path):
    data = _write(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(8)])
    train, held, source = split_for_eval(load_sft_examples, data, None, 0.1, seed=0)
    assert (len(train), len(held), source) == (7, 1, "held-back")  # ceil(0.1 x 8) = 1 of 8
    assert eval_phrase(1, "examples", source, 0.1) == ("1 examples held back from training (eval_fraction 0.1; the "
                                                        "data has no held-out split)")


def test_eval_split_and_eval_data_are_held_out(tmp_path):
    rows = [{"prompt": f"q{i}", "response": "a", "split": ["train", "validation"][i % 2]} for i in range(6)]
    data = _write(tmp_path / "d.jsonl", rows)
    train, held, source = split_for_eval(load_sft_examples, data, None, 0.0, seed=0, eval_split="validation")
    assert ([r["prompt"] for r in held], source) == (["q1", "q3", "q5"], "held-out")
    assert eval_phrase(3, "examples", source) == "3 held-out examples"
    other = _write(tmp_path / "e.jsonl", [{"prompt": "x", "response": "y"}])
    plain = _write(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "response": "a"} for i in range(4)])
    train, held, source = split_for_eval(load_sft_examples, plain, other, 0.0, seed=0)
    assert (len(train), [r["prompt"] for r in held], source) == (4, ["x"], "held-out")
