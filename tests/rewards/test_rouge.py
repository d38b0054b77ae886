"""ROUGE-1/2/L (`rlhfkit.rewards.rouge.rouge_scores`, rouge-score underneath) and their place in `rlhfkit eval`."""

from __future__ import annotations

import json
import math

import pytest

from rlhfkit.commands.evaluate import EvalConfig, evaluate, format_report
from rlhfkit.core.config import build_config
from rlhfkit.rewards.rouge import rouge_l, rouge_scores


def f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r)


def test_rouge_golden_on_the_rouge_score_readme_example():
    # rouge-score's README: target 'The quick brown fox jumps over the lazy dog',
    # prediction 'The quick brown dog jumps on the log.'. Tokens (lower-cased, punctuation dropped,
    # Porter-stemmed: jumps -> jump on both sides):
    #   target     the quick brown fox jump over the lazi dog   (9)
    #   prediction the quick brown dog jump on the log          (8)
    # ROUGE-1: clipped unigram overlap the x2, quick, brown, dog, jump = 6: P = 6/8, R = 6/9 -> 12/17
    # ROUGE-2: bigrams 'the quick', 'quick brown' shared, of 7 and 8: P = 2/7, R = 2/8 -> 4/15
    # ROUGE-L: LCS 'the quick brown jump the' = 5: P = 5/8, R = 5/9 -> 10/17
    got = rouge_scores(["The quick brown dog jumps on the log."], ["The quick brown fox jumps over the lazy dog"])
    assert got["rouge_1"] == pytest.approx(f1(6 / 8, 6 / 9)) == pytest.approx(12 / 17)
    assert got["rouge_2"] == pytest.approx(f1(2 / 7, 2 / 8)) == pytest.approx(4 / 15)
    assert got["rouge_l"] == pytest.approx(f1(5 / 8, 5 / 9)) == pytest.approx(10 / 17)
    assert set(got) == {"rouge_1", "rouge_2", "rouge_l"}


def test_rouge_stems_averages_pairs_and_rejects_mismatched_lists():
    # Stemmed: 'a cat run' vs 'the cat were run': cat, run shared; P = 2/3, R = 2/4 -> 4/7 (0 unstemmed)
    stemmed = rouge_scores(["A cat runs"], ["The cats were running"])
    assert stemmed["rouge_1"] == pytest.approx(4 / 7) and stemmed["rouge_l"] == pytest.approx(4 / 7)
    assert stemmed["rouge_2"] == 0.0  # 'cat run' is not a bigram of the reference
    both = rouge_scores(["A cat runs", "same words here"], ["The cats were running", "same words here"])
    assert both["rouge_1"] == pytest.approx((4 / 7 + 1.0) / 2) and both["rouge_2"] == pytest.approx((0 + 1.0) / 2)
    assert rouge_l(["A cat runs"], ["The cats were running"]) == stemmed["rouge_l"]
    assert all(math.isnan(v) for v in rouge_scores([], []).values())
    with pytest.raises(ValueError, match="2 predictions vs 1 references"):
        rouge_scores(["a", "b"], ["a"])


def test_eval_reports_rouge_1_2_l_of_the_completions(tmp_path, monkeypatch):
    import rlhfkit.commands.evaluate as ev

    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Describe the fox.", "response": "The quick brown fox jumps over the lazy dog"},
        {"prompt": "Describe the cat.", "response": "The cats were running"},
        {"prompt": "No reference here."},
    ]))
    completions = ["The quick brown dog jumps on the log.", "A cat runs", "anything"]
    monkeypatch.setattr(ev, "run_model", lambda spec, records, cfg: {"completions": completions})
    cfg = build_config(EvalConfig, dict(model="M", prompts=str(data), rewards=["length:3"], out_dir=str(tmp_path / "e")))
    report = evaluate(cfg)
    # the two records with a response: the README example and the stemming example above
    assert report["model"]["rouge_1"] == pytest.approx((12 / 17 + 4 / 7) / 2)
    assert report["model"]["rouge_2"] == pytest.approx((4 / 15 + 0) / 2)
    assert report["model"]["rouge_l"] == pytest.approx((10 / 17 + 4 / 7) / 2)
    table = format_report(report)
    assert f"{'rouge_2':32s}{(4 / 15) / 2:14.4f}" in table
    off = build_config(EvalConfig, dict(model="M", prompts=str(data), rewards=["length:3"], rouge=False,
                                        out_dir=str(tmp_path / "f")))
    assert not any(k.startswith("rouge") for k in evaluate(off)["model"])
