"""`rlhfkit prefs make` (pairing rules, file schema) and `rlhfkit eval` (metrics, report files)."""

from __future__ import annotations

import json

import pytest

from rlhfkit.commands.evaluate import EvalConfig, evaluate, parse_rewards, win_rate
from rlhfkit.commands.prefs import PrefsConfig, build_pairs, make_preferences
from rlhfkit.commands.prefs import main as prefs_main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.rewards.rouge import rouge_l

# A deterministic scorer: the number of letters 'e' in the completion.
SCORER = "def score(prompts, completions, **kw):\n    return [float(c.count('e')) for c in completions]\n"


def test_build_pairs_golden():
    comps = ["a", "b", "a", "  ", "c", "d"]
    scores = [0.1, 0.9, 0.5, 1.0, 0.1, 0.4]
    # "a" keeps its first score (0.1); the blank one is dropped; ranking b .9, d .4, a .1, c .1
    assert build_pairs(comps, scores) == [("b", "c", 0.9, 0.1)]
    assert build_pairs(comps, scores, "all", min_gap=0.25) == [
        ("b", "d", 0.9, 0.4), ("b", "a", 0.9, 0.1), ("b", "c", 0.9, 0.1), ("d", "a", 0.4, 0.1), ("d", "c", 0.4, 0.1)]
    assert build_pairs(comps, scores, min_gap=0.8) == []  # 0.9 - 0.1 is not > 0.8
    assert build_pairs(["x", "y"], [0.3, 0.3]) == []  # ties never become pairs
    assert build_pairs(["x", "x "], [0.1, 0.9]) == []  # one distinct completion


def test_prefs_make_writes_the_documented_schema(tmp_path, tiny_model_dir):
    from rlhfkit.data.prefs import load_preferences

    (tmp_path / "scorer.py").write_text(SCORER)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"Write a review of thing {i}.",
                                             "split": "test" if i < 2 else "train"}) for i in range(8)))
    out = tmp_path / "p" / "prefs.jsonl"
    cfg = build_config(PrefsConfig, dict(model=str(tiny_model_dir), prompts=str(prompts), out=str(out), k=4,
                                         max_new_tokens=12, dtype="fp32", scorer=f"python:{tmp_path}/scorer.py:score"))
    summary = make_preferences(cfg)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["pairs"] == len(rows) >= 4 and summary["prompts"] == 8
    for r in rows:
        assert set(r) == {"prompt", "chosen", "rejected", "scores", "split", "scorer"}
        assert r["chosen"].strip() and r["rejected"].strip() and r["chosen"] != r["rejected"]
        assert r["scores"]["chosen"] == r["chosen"].count("e") > r["scores"]["rejected"] == r["rejected"].count("e")
        assert r["split"] == ("test" if r["prompt"] in ("Write a review of thing 0.", "Write a review of thing 1.")
                              else "train")
    assert len({r["prompt"] for r in rows}) == len(rows)  # best-worst: one pair per prompt
    loaded = load_preferences(str(out))  # the RM's loader accepts the file
    assert [p["chosen"] for p in loaded] == [r["chosen"] for r in rows]
    with pytest.raises(UserError, match="already exists"):
        make_preferences(cfg)


def test_prefs_cli_errors(capsys):
    assert prefs_main([]) == 0 and "rlhfkit prefs make" in capsys.readouterr().out
    with pytest.raises(UserError, match="unknown prefs command 'build'"):
        prefs_main(["build"])
    with pytest.raises(ConfigError, match=r"k \(1\) must be >= 2"):
        prefs_main(["make", "k=1"])


def test_win_rate_rouge_and_reward_names():
    assert win_rate([1.0, 2.0, 3.0, 0.0], [0.5, 2.0, 4.0, -1.0]) == {
        "wins": 2, "ties": 1, "losses": 1, "n": 4, "win_rate": 0.625}
    assert rouge_l(["the cat sat on the mat"], ["the cat sat on the mat"]) == 1.0
    assert rouge_l(["dogs bark"], ["the cat sat"]) == 0.0
    # LCS "the cat the mat" = 4 of 6 reference and 4 of 5 prediction tokens: F1 = 2PR/(P+R)
    assert rouge_l(["the cat saw the mat"], ["the cat sat on the mat"]) == pytest.approx(2 * 0.8 * (4 / 6) / (0.8 + 4 / 6))
    assert parse_rewards(["sentiment", "rm=model:runs/rm/final"]) == [
        ("sentiment", "sentiment"), ("rm", "model:runs/rm/final")]
    with pytest.raises(ConfigError, match="names must be unique"):
        parse_rewards(["a=sentiment", "a=length"])


def test_eval_metrics_from_fixed_completions(tmp_path, monkeypatch):
    """Accuracy, ROUGE-L, rewards and win rate computed from known completions (no model)."""
    import rlhfkit.commands.evaluate as ev

    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "What is 2 + 3?", "answer_value": 5, "response": "The answer is 5."},
        {"prompt": "What is 7 - 4?", "answer_value": 3, "response": "The answer is 3."},
        {"prompt": "What is 1 + 1?", "answer_value": 2, "response": "The answer is 2."},
    ]))
    outputs = {"M": ["The answer is 5.", "It is 3", "maybe 7"], "R": ["5", "no idea", "2"]}
    monkeypatch.setattr(ev, "run_model", lambda spec, records, cfg: {"completions": outputs[spec]})
    cfg = build_config(EvalConfig, dict(model="M", ref_model="R", prompts=str(data), rewards=["len=length:3"],
                                        out_dir=str(tmp_path / "ev")))
    report = evaluate(cfg)
    assert report["model"]["accuracy"] == pytest.approx(2 / 3) and report["reference"]["accuracy"] == pytest.approx(2 / 3)
    assert report["model"]["rouge_l"] == pytest.approx(
        (1.0 + rouge_l(["It is 3"], ["The answer is 3."]) + rouge_l(["maybe 7"], ["The answer is 2."])) / 3)
    # length:3 reward = -min(1, |words - 3| / 3): model 4, 3, 2 words -> -1/3, 0, -1/3
    assert report["model"]["reward/len"]["mean"] == pytest.approx(-2 / 9)
    # reference 1, 2, 1 words -> -2/3, -1/3, -2/3: the model wins all three
    assert report["win_rate"]["len"] == {"wins": 3, "ties": 0, "losses": 0, "n": 3, "win_rate": 1.0}
    rows = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert rows[1]["completion"] == "It is 3" and rows[1]["ref_completion"] == "no idea"
    assert rows[1]["scores"]["len"] == 0.0 and rows[1]["reference_response"] == "The answer is 3."
    assert json.loads((tmp_path / "ev" / "report.json").read_text())["n"] == 3


def test_eval_perplexity_matches_manual_cross_entropy(tmp_path, tiny_model_dir):
    import math

    import torch
    import torch.nn.functional as F

    from rlhfkit.data.chat import format_example
    from rlhfkit.models import load_causal_lm, load_tokenizer

    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": "What is 3 + 4?", "response": "The answer is 7."},
            {"prompt": "Write a short review of the new cafe.", "response": "Great coffee."}]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = build_config(EvalConfig, dict(model=str(tiny_model_dir), prompts=str(data), rewards=["length"],
                                        dtype="fp32", max_new_tokens=6, out_dir=str(tmp_path / "ev")))
    report = evaluate(cfg)
    tok, lm = load_tokenizer(str(tiny_model_dir)), load_causal_lm(str(tiny_model_dir), trainable=False)
    total, n = 0.0, 0
    for r in rows:
        p, full = format_example(tok, r["prompt"], r["response"])
        ids = tok(full, return_tensors="pt", add_special_tokens=False)["input_ids"]
        k = len(tok(p, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logits = lm(ids).logits[0, k - 1 : -1]
        total += F.cross_entropy(logits, ids[0, k:], reduction="sum").item()
        n += ids.shape[1] - k
    assert report["model"]["perplexity"] == pytest.approx(math.exp(total / n), rel=1e-4)
    assert "rouge_l" in report["model"] and "accuracy" not in report["model"]
