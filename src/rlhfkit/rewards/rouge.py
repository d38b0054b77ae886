"""ROUGE F1 of generated text against references, for `rlhfkit eval` and SFT's held-out evaluation."""

from __future__ import annotations

ROUGE_TYPES = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_l": "rougeL"}  # report key -> rouge-score name


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F1 of predictions against references (Lin 2004).

    Computed by Google's `rouge-score` package (the reimplementation of ROUGE-1.5.5) with Porter
    stemming, one pair at a time, then averaged over pairs: {"rouge_1", "rouge_2", "rouge_l"}, each
    in [0, 1]; NaN for no pairs. ROUGE-L is the sentence-level LCS score (`rougeL`, not the
    newline-split `rougeLsum`). Its tokenizer keeps lower-cased ASCII letters and digits only.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions vs {len(references)} references")
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES.values()), use_stemmer=True)
    sums = dict.fromkeys(ROUGE_TYPES, 0.0)
    for pred, ref in zip(predictions, references):
        scores = scorer.score(ref, pred)  # score(target, prediction)
        for key, name in ROUGE_TYPES.items():
            sums[key] += scores[name].fmeasure
    n = len(predictions)
    return {key: total / n if n else float("nan") for key, total in sums.items()}


def rouge_l(predictions: list[str], references: list[str]) -> float:
    """Mean ROUGE-L F1 (rouge-score, Porter stemming); see :func:`rouge_scores`."""
    return rouge_scores(predictions, references)["rouge_l"]
