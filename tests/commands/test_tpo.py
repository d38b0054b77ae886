"""`rlhfkit tpo`: the search and its token accounting on a scripted model (arithmetic by hand), the
baselines at equal generated tokens, template checks, and a run of the command on the tiny Llama."""

from __future__ import annotations

import json

import pytest

from rlhfkit.cli import main
from rlhfkit.commands.tpo import (
    GRADIENT_PROMPT,
    LOSS_PROMPT,
    UPDATE_PROMPT,
    TPOConfig,
    best_of_n,
    closest_prefix,
    pick_pair,
    summarise,
    tpo_search,
)
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError


def test_closest_prefix_and_pick_pair():
    # running totals 4, 7, 12, 14: budget 10 -> |7 - 10| = 3 > |12 - 10| = 2 -> 3 samples
    assert closest_prefix([4, 3, 5, 2], 10) == 3
    assert closest_prefix([4, 3, 5, 2], 100) == 4 and closest_prefix([4, 3, 5, 2], 1) == 1
    assert closest_prefix([2, 2], 3) == 1  # totals 2 and 4 are equally far: the fewer samples
    pool = [{"text": "a", "score": 0.5}, {"text": "b", "score": 0.9}, {"text": "c", "score": 0.9},
            {"text": "d", "score": -1.0}, {"text": "e", "score": -1.0}]
    best, worst = pick_pair(pool)
    assert best["text"] == "b" and worst["text"] == "d"  # the earliest among equal scores


class ScriptedModel:
    """`gen` that returns scripted (text, tokens) per call and records what it was asked."""

    def __init__(self, script):
        self.script, self.calls = list(script), []

    def __call__(self, texts, kind):
        outs = self.script.pop(0)
        assert len(outs) == len(texts)
        self.calls.append((kind, texts))
        return outs


SCORES = {"good one": 0.8, "bad": -0.2, "warm and kind": 0.9, "meh": 0.0,
          "s1": 0.1, "s2": 0.85, "s3": 0.2, "s4": 0.3, "s5": 0.4, "s6": 0.99}


def test_search_and_best_of_n_accounting_by_hand():
    cfg = build_config(TPOConfig, {"num_candidates": 2, "rounds": 1})
    model = ScriptedModel([
        [("good one", 4), ("bad", 3)],  # round 0: two plain samples
        [("A is kind", 5)],  # critique (textual loss)
        [("be warmer", 6)],  # suggestions (textual gradient)
        [("warm and kind", 7), ("meh", 2)],  # two rewrites (textual update)
        [(f"s{i}", 4) for i in range(1, 7)],  # best-of-N: 27 - 7 = 20 tokens to go at 3.5 a sample -> 6
    ])
    fmt = "<u>{}</u>".format
    score = lambda idx, answers: [SCORES[a] for a in answers]  # noqa: E731
    results = tpo_search(["Review a cafe."], ["<u>Review a cafe.</u>"], fmt, model, score, cfg)
    r = results[0]
    # What the policy was shown: the best and the worst answer, then its critique, then its suggestions.
    assert model.calls[1] == ("feedback", [fmt(LOSS_PROMPT.format(query="Review a cafe.", chosen="good one",
                                                                   rejected="bad"))])
    assert model.calls[2][1] == [fmt(GRADIENT_PROMPT.format(query="Review a cafe.", chosen="good one",
                                                            critique="A is kind"))]
    assert model.calls[3] == ("answer", [fmt(UPDATE_PROMPT.format(query="Review a cafe.", chosen="good one",
                                                                  suggestions="be warmer"))] * 2)
    assert r["rounds"][1]["chosen_score"] == 0.8 and r["rounds"][1]["rejected"] == "bad"
    # tokens: answers 4 + 3, critique 5, suggestions 6, rewrites 7 + 2 = 27
    assert r["tpo"] == {"answer": "warm and kind", "score": 0.9, "tokens": 27, "round": 1}
    assert r["plain"] == {"score": pytest.approx((0.8 - 0.2) / 2), "tokens": 3.5}
    best_of_n(results, ["<u>Review a cafe.</u>"], model, score)
    assert model.calls[4] == ("answer", ["<u>Review a cafe.</u>"] * 6) and not model.script
    # round 0's 7 tokens + s1..s5 (5 x 4) = 27 = TPO's tokens; s6 (0.99) lies beyond the budget
    bon = r["best_of_n"]
    assert (bon["samples"], bon["tokens"], bon["answer"], bon["score"]) == (7, 27, "s2", 0.85)
    s = summarise(results)
    assert s["methods"]["tpo"] == {"score": 0.9, "tokens": 27}
    assert s["methods"]["best_of_n"] == {"score": 0.85, "tokens": 27, "samples": 7}
    assert s["methods"]["plain"]["score"] == pytest.approx(0.3) and s["methods"]["plain"]["tokens"] == 3.5
    assert s["tpo_vs_best_of_n"]["wins"] == 1 and s["tpo_answer_from_rewrite"] == 1.0
    assert s["round_mean_score"] == pytest.approx([0.3, 0.45])


def test_later_rounds_compare_the_best_and_worst_of_the_whole_pool():
    cfg = build_config(TPOConfig, {"num_candidates": 2, "rounds": 2})
    model = ScriptedModel([
        [("good one", 4), ("bad", 3)],
        [("c1", 1)], [("g1", 1)], [("meh", 2), ("s1", 2)],  # round 1: both rewrites worse than 'good one'
        [("c2", 1)], [("g2", 1)], [("s3", 2), ("s4", 2)],
    ])
    score = lambda idx, answers: [SCORES[a] for a in answers]  # noqa: E731
    results = tpo_search(["q"], ["Q"], str, model, score, cfg)
    # round 2 still critiques 'good one' (0.8) against 'bad' (-0.2), not round 1's 'meh' and 's1'
    assert model.calls[4][1] == [LOSS_PROMPT.format(query="q", chosen="good one", rejected="bad")]
    assert results[0]["tpo"] == {"answer": "good one", "score": 0.8, "tokens": 4 + 3 + 2 * (1 + 1 + 2 + 2),
                                 "round": 0}


def test_rounds_zero_is_best_of_n_on_round_zero():
    cfg = build_config(TPOConfig, {"num_candidates": 2, "rounds": 0})
    model = ScriptedModel([[("bad", 3), ("good one", 4), ("meh", 2), ("s3", 5)]])
    score = lambda idx, answers: [SCORES[a] for a in answers]  # noqa: E731
    results = tpo_search(["p", "q"], ["P", "Q"], str, model, score, cfg)
    best_of_n(results, ["P", "Q"], model, score)  # the budget is met already: no more samples
    assert [r["tpo"]["answer"] for r in results] == ["good one", "s3"] == [r["best_of_n"]["answer"] for r in results]
    assert [r["tpo"]["tokens"] for r in results] == [7, 7] and len(model.calls) == 1


@pytest.mark.parametrize("key, value, message", [
    ("loss_prompt", "{query} {chosen} {rejected} {score}", r"loss_prompt: unknown field \{score\}"),
    ("gradient_prompt", "{query} {chosen}", r"gradient_prompt: must contain \{critique\}"),
    ("update_prompt", "{suggestions} }", "update_prompt: not a format string"),
    ("num_candidates", 1, r"num_candidates \(1\) must be >= 2"),
    ("temperature", 0, r"temperature \(0.0\) must be > 0"),
])
def test_config_errors_name_the_option(key, value, message):
    with pytest.raises(ConfigError, match=message):
        build_config(TPOConfig, {key: value})


def test_tpo_command_on_the_tiny_model(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "score.py").write_text("def score(prompts, completions, **kw):\n"
                                       "    return [float(c.count('e')) for c in completions]\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Write a review of thing {i}."}) + "\n" for i in range(3)))
    out = tmp_path / "tpo"
    argv = ["tpo", f"model={tiny_model_dir}", f"prompts={prompts}", "num_prompts=null", "num_candidates=2",
            "rounds=1", "max_new_tokens=6", "feedback_max_new_tokens=5", "dtype=fp32", f"out_dir={out}",
            f"reward=python:{tmp_path}/score.py:score"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert [x["round"] for x in r["rounds"]] == [0, 1]
        answers = [c for x in r["rounds"] for c in x["candidates"]] + r["best_of_n"]["extra_samples"]
        assert len(answers) >= 4 and all(1 <= c["tokens"] <= 6 for c in answers)
        assert all(c["score"] == c["text"].count("e") for c in answers)  # the reward of the answer itself
        feedback = r["rounds"][1]["critique_tokens"] + r["rounds"][1]["suggestion_tokens"]
        assert 2 <= feedback <= 10
        assert r["tpo"]["tokens"] == sum(c["tokens"] for x in r["rounds"] for c in x["candidates"]) + feedback
        assert r["tpo"]["score"] == max(c["score"] for x in r["rounds"] for c in x["candidates"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 3 and summary["prompts_used"]["update_prompt"] == UPDATE_PROMPT
    assert set(summary["methods"]) == {"plain", "best_of_n", "tpo"}
    assert "TPO vs best-of-N" in capsys.readouterr().out


def test_bad_input_stops_before_writing(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["tpo", "reward=sentimnet", f"out_dir={out}"]) == 2
    assert "unknown reward 'sentimnet'" in capsys.readouterr().err and not out.exists()
    assert main(["tpo", f"prompts={tmp_path}/missing.jsonl", f"out_dir={out}"]) == 2
    assert not out.exists()
