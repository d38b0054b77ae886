"""`rlhfkit tpo`: test-time preference optimisation (Li et al. 2025, "Test-Time Preference
Optimization: On-the-Fly Alignment via Iterative Textual Feedback"). No weight changes.

For every prompt (all prompts batched together):
  0. sample          N answers, score them with the reward: the pool
  for k = 1 .. K:
  1. textual loss      the policy compares the pool's best (chosen) and worst (rejected) answer: a critique
  2. textual gradient  it turns the critique into suggestions for the chosen answer
  3. textual update    it rewrites the chosen answer following the suggestions, N times; score; add to the pool
  answer             the best of the pool
Baselines, on the same prompts:
  plain      one sample: the mean score of round 0's answers (each is a plain sample)
  best-of-n  round 0's answers, then more plain samples until the prompt's generated tokens reach TPO's
             (critiques and suggestions included); the prefix of samples whose tokens are closest to
             TPO's is kept, and its best answer counts
Generated tokens are counted exactly: every token the model produced, a stop token included.
Writes OUT/results.jsonl (one line per prompt: every round's answers, scores and tokens, the
critiques and suggestions) and OUT/summary.json (the comparison and the prompts used).
"""

from __future__ import annotations

import json
import math
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.core.config import check, option, retune
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.trainers.options import OutDirArgs, PromptSplitArgs, SampleCommandArgs

LOSS_PROMPT = ("Here is a request and two answers to it.\n\nRequest: {query}\n\nAnswer A: {chosen}\n\n"
               "Answer B: {rejected}\n\nAnswer A was rated better than answer B. In two sentences, explain what "
               "makes answer A better, and what answer A could still do better.")
GRADIENT_PROMPT = ("Request: {query}\n\nAnswer: {chosen}\n\nFeedback: {critique}\n\nBased on the feedback, give "
                   "two short, concrete suggestions to improve the answer.")
UPDATE_PROMPT = ("Request: {query}\n\nDraft answer: {chosen}\n\nSuggestions: {suggestions}\n\nWrite an improved "
                 "answer to the request that follows the suggestions. Reply with the answer only.")
# template option -> (fields it may use, fields it must use)
TEMPLATE_FIELDS = {
    "loss_prompt": ({"query", "chosen", "rejected"}, {"chosen", "rejected"}),
    "gradient_prompt": ({"query", "chosen", "critique"}, {"critique"}),
    "update_prompt": ({"query", "chosen", "suggestions"}, {"suggestions"}),
}

Generate = Callable[[list[str], str], list[tuple[str, int]]]  # (formatted texts, "answer"|"feedback") -> (text, tokens)
Score = Callable[[list[int], list[str]], list[float]]  # (prompt index of each answer, answers) -> scores
Format = Callable[[str], str]  # a user message -> the text the model sees


@dataclass
class TPOConfig(OutDirArgs, PromptSplitArgs, SampleCommandArgs):
    """Test-time preference optimisation: refine answers with the policy's own textual feedback, no training."""

    model = retune(help="policy (a folder, a run's final/, or the default)")
    num_prompts = retune(16)
    temperature = retune(0.7, "sampling temperature of answers and rewrites")
    max_new_tokens = retune(help="length limit of an answer")
    max_prompt_length = retune(help="prompt tokens kept for generation (None: the model's context window minus the "
                               "length limit); longer critique and rewrite prompts keep their end")
    out_dir = retune("runs/tpo", "folder for results.jsonl and summary.json")
    reward: str = option("sentiment", "the score: sentiment | arithmetic | length[:N] | model:PATH | "
                         "python:module:function")
    num_candidates: int = option(4, "N, the search width: answers sampled in round 0 and rewrites per round")
    rounds: int = option(2, "K, the search depth: rounds of critique -> suggestions -> rewrites (0: best-of-N only)")
    feedback_temperature: float = option(0.7, "sampling temperature of critiques and suggestions (0 = greedy)")
    feedback_max_new_tokens: int = option(64, "length limit of a critique and of suggestions")
    loss_prompt: str = option(LOSS_PROMPT, "textual loss (asks for a critique); fields {query} {chosen} {rejected}")
    gradient_prompt: str = option(GRADIENT_PROMPT, "textual gradient (asks for suggestions); fields {query} "
                                  "{chosen} {critique}")
    update_prompt: str = option(UPDATE_PROMPT, "textual update (asks for a rewrite); fields {query} {chosen} "
                                "{suggestions}")
    baselines: bool = option(True, "also run best-of-N at TPO's generated tokens per prompt")

    def validate(self) -> None:
        check(self.num_candidates >= 2, f"num_candidates ({self.num_candidates}) must be >= 2: the critique "
              "compares the best and the worst answer of the pool")
        check(self.rounds >= 0, f"rounds ({self.rounds}) must be >= 0")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0: the N answers of a prompt "
              "would be identical")
        check(self.feedback_temperature >= 0, f"feedback_temperature ({self.feedback_temperature}) must be >= 0")
        check(min(self.max_new_tokens, self.feedback_max_new_tokens, self.batch_size) >= 1,
              "max_new_tokens, feedback_max_new_tokens and batch_size must be >= 1")
        for name in TEMPLATE_FIELDS:
            check_template(name, getattr(self, name))


# ----------------------------------------------------------------------------- pure helpers


def check_template(name: str, template: str) -> None:
    """ConfigError unless `template` uses only its allowed {fields} and all its required ones."""
    allowed, required = TEMPLATE_FIELDS[name]
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise ConfigError(f"{name}: not a format string ({e}); write a literal brace as {{{{ or }}}}") from None
    braces = lambda names: ", ".join("{" + f + "}" for f in sorted(names))  # noqa: E731
    check(fields <= allowed, f"{name}: unknown field {braces(fields - allowed)}; allowed: {braces(allowed)}")
    check(required <= fields, f"{name}: must contain {braces(required - fields)}")


def pick_pair(pool: list[dict]) -> tuple[dict, dict]:
    """(best, worst) answer of a pool by score; among equal scores the earliest."""
    best = max(pool, key=lambda c: c["score"])
    worst = min(pool, key=lambda c: c["score"])
    return best, worst


def closest_prefix(tokens: list[int], budget: int) -> int:
    """k >= 1 whose first-k token total is closest to `budget` (the smaller k on a tie)."""
    totals, run = [], 0
    for t in tokens:
        run += t
        totals.append(run)
    return min(range(1, len(totals) + 1), key=lambda k: (abs(totals[k - 1] - budget), k))


def pool_of(result: dict) -> list[dict]:
    """Every answer of every round of one prompt, in order."""
    return [c for r in result["rounds"] for c in r["candidates"]]


# ----------------------------------------------------------------------------- the search


def add_round(results: list[dict], idx: list[int], outs: list[tuple[str, int]], scores: list[float],
              rounds: list[dict]) -> None:
    """Append answer j of `outs` (for prompt idx[j]) with its score to that prompt's new round record."""
    for r, rec in zip(results, rounds):
        r["rounds"].append(rec)
        rec["candidates"] = []
    for i, (text, n), s in zip(idx, outs, scores):
        results[i]["rounds"][-1]["candidates"].append({"text": text, "score": float(s), "tokens": n})
        results[i]["tokens"] += n


def tpo_search(queries: list[str], formatted: list[str], fmt: Format, gen: Generate, score: Score,
               cfg: TPOConfig) -> list[dict]:
    """TPO on every prompt at once. queries: the prompt texts; formatted: as the model sees them."""
    n_cand = cfg.num_candidates
    idx = [i for i in range(len(queries)) for _ in range(n_cand)]  # N consecutive rows per prompt
    results = [{"prompt": q, "rounds": [], "tokens": 0} for q in queries]
    outs = gen([formatted[i] for i in idx], "answer")
    add_round(results, idx, outs, score(idx, [t for t, _ in outs]), [{"round": 0} for _ in queries])
    for k in range(1, cfg.rounds + 1):
        pairs = [pick_pair(pool_of(r)) for r in results]
        critiques = gen([fmt(cfg.loss_prompt.format(query=q, chosen=c["text"], rejected=w["text"]))
                         for q, (c, w) in zip(queries, pairs)], "feedback")
        suggestions = gen([fmt(cfg.gradient_prompt.format(query=q, chosen=c["text"], critique=crit))
                           for q, (c, _), (crit, _) in zip(queries, pairs, critiques)], "feedback")
        outs = gen([fmt(cfg.update_prompt.format(query=queries[i], chosen=pairs[i][0]["text"],
                                                 suggestions=suggestions[i][0])) for i in idx], "answer")
        recs = [{"round": k, "chosen": c["text"], "chosen_score": c["score"], "rejected": w["text"],
                 "rejected_score": w["score"], "critique": crit, "critique_tokens": nc, "suggestions": sug,
                 "suggestion_tokens": ns} for (c, w), (crit, nc), (sug, ns) in zip(pairs, critiques, suggestions)]
        for r, rec in zip(results, recs):
            r["tokens"] += rec["critique_tokens"] + rec["suggestion_tokens"]
        add_round(results, idx, outs, score(idx, [t for t, _ in outs]), recs)
    for r in results:
        best = pick_pair(pool_of(r))[0]
        rounds0 = r["rounds"][0]["candidates"]
        r["tpo"] = {"answer": best["text"], "score": best["score"], "tokens": r["tokens"],
                    "round": next(x["round"] for x in r["rounds"] if any(c is best for c in x["candidates"]))}
        r["plain"] = {"score": sum(c["score"] for c in rounds0) / len(rounds0),
                      "tokens": sum(c["tokens"] for c in rounds0) / len(rounds0)}
    return results


def best_of_n(results: list[dict], formatted: list[str], gen: Generate, score: Score) -> None:
    """Best-of-N at each prompt's TPO token count: round 0's answers, then more plain samples."""
    samples = [list(r["rounds"][0]["candidates"]) for r in results]
    while True:
        need = []
        for i, (r, s) in enumerate(zip(results, samples)):
            used = sum(c["tokens"] for c in s)
            if used < r["tokens"]:  # sample the expected number still needed, at the mean length so far
                need += [i] * max(1, math.ceil((r["tokens"] - used) / max(1.0, used / len(s))))
        if not need:
            break
        outs = gen([formatted[i] for i in need], "answer")
        for i, (text, n), s in zip(need, outs, score(need, [t for t, _ in outs])):
            samples[i].append({"text": text, "score": float(s), "tokens": n})
    for r, s in zip(results, samples):
        k = closest_prefix([c["tokens"] for c in s], r["tokens"])
        best = pick_pair(s[:k])[0]
        r["best_of_n"] = {"answer": best["text"], "score": best["score"], "samples": k,
                          "tokens": sum(c["tokens"] for c in s[:k]),
                          "extra_samples": s[len(r["rounds"][0]["candidates"]):]}  # after round 0's


def summarise(results: list[dict]) -> dict:
    """Means over prompts: score and generated tokens of each method, TPO vs best-of-N per prompt,
    the mean answer score of each round, and how often TPO's answer came from a rewrite."""
    from rlhfkit.commands.evaluate import win_rate

    n = len(results)

    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else float("nan")

    methods = [m for m in ("plain", "best_of_n", "tpo") if m in results[0]]
    out: dict = {"prompts": n, "methods": {m: {"score": mean(r[m]["score"] for r in results),
                                               "tokens": mean(r[m]["tokens"] for r in results)} for m in methods}}
    if "best_of_n" in methods:
        out["methods"]["best_of_n"]["samples"] = mean(r["best_of_n"]["samples"] for r in results)
        out["tpo_vs_best_of_n"] = win_rate([r["tpo"]["score"] for r in results],
                                           [r["best_of_n"]["score"] for r in results])
    out["round_mean_score"] = [mean(mean(c["score"] for c in r["rounds"][k]["candidates"]) for r in results)
                               for k in range(len(results[0]["rounds"]))]
    out["tpo_answer_from_rewrite"] = sum(r["tpo"]["round"] > 0 for r in results) / n
    return out


def format_summary(summary: dict) -> str:
    lines = [f"{'method':12s}{'score':>10s}{'tokens/prompt':>16s}"]
    for name, m in summary["methods"].items():
        lines.append(f"{name:12s}{m['score']:10.4f}{m['tokens']:16.1f}")
    rounds = ", ".join(f"{s:.4f}" for s in summary["round_mean_score"])
    lines.append(f"mean answer score per round (0 = plain samples): {rounds}")
    lines.append(f"TPO's answer is a rewrite for {summary['tpo_answer_from_rewrite']:.0%} of prompts")
    if "tpo_vs_best_of_n" in summary:
        w = summary["tpo_vs_best_of_n"]
        lines.append(f"TPO vs best-of-N: {w['wins']} wins, {w['ties']} ties, {w['losses']} losses "
                     f"(win rate {w['win_rate']:.3f})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- model plumbing and main


def model_generate(model, tok, cfg: TPOConfig) -> tuple[Generate, Callable[[], int]]:
    """`gen` for the search (a fresh seed per call, exact token counts from the response masks) and
    a counter of generate inputs cut to the prompt limit (long critique or rewrite prompts)."""
    import torch

    from rlhfkit.core.precision import autocast
    from rlhfkit.rollout import SamplingParams, generate
    from rlhfkit.rollout.prompt_fit import long_prompts, prompt_token_limit

    stop = (tok.eos_token_id,)
    params = {}
    for kind, new, temp in (("answer", cfg.max_new_tokens, cfg.temperature),
                            ("feedback", cfg.feedback_max_new_tokens, cfg.feedback_temperature)):
        limit, _ = prompt_token_limit(model, new, cfg.max_prompt_length)
        params[kind] = SamplingParams(new, temp, 0, 1.0, stop, limit)
    device = next(model.parameters()).device
    state = {"calls": 0, "cut": 0}

    def gen(texts: list[str], kind: str) -> list[tuple[str, int]]:
        p = params[kind]
        if p.max_prompt_length is not None:
            state["cut"] += len(long_prompts(tok, texts, p.max_prompt_length))
        torch.manual_seed(cfg.seed * 1_000_003 + state["calls"])
        state["calls"] += 1
        t0 = time.time()
        with autocast(cfg.dtype, device), torch.no_grad():
            rollout = generate(model, tok, texts, p, batch_size=cfg.batch_size)
        tokens = rollout.response_mask.sum(1).long().tolist()
        print(f"rlhfkit tpo: {kind}: {len(texts)} sequences, {sum(tokens)} tokens, {time.time() - t0:.1f} s", flush=True)
        return list(zip(rollout.completions, tokens))

    return gen, lambda: state["cut"]


def run(cfg: TPOConfig) -> dict:
    """Load, search, compare, write OUT/results.jsonl and OUT/summary.json; returns the summary."""
    from rlhfkit.core.seeding import seed_everything
    from rlhfkit.data.chat import format_prompts
    from rlhfkit.data.prompts import info_lists, load_prompts
    from rlhfkit.rewards import get_reward, score_batch
    from rlhfkit.rollout.prompt_fit import enforce_prompt_limit, prompt_token_limit
    from rlhfkit.rollout.texts import load_for_inference

    t0 = time.time()
    seed_everything(cfg.seed)
    records = load_prompts(cfg.prompts, split=cfg.split, limit=cfg.num_prompts, seed=cfg.seed)
    if not records:
        raise UserError(f"prompts: {cfg.prompts} has no prompts in split {cfg.split}")
    reward_fn = get_reward(cfg.reward)
    model, tok = load_for_inference(cfg.model, cfg.dtype)
    formatted = format_prompts(tok, [r.get("messages") or r["prompt"] for r in records], cfg)
    limit, how = prompt_token_limit(model, cfg.max_new_tokens, cfg.max_prompt_length)
    enforce_prompt_limit(tok, [(formatted, getattr(records, "where", None))], limit, cfg.prompt_overflow, how)
    queries = [str(r["prompt"]) for r in records]
    info = info_lists(records)

    def score(idx: list[int], answers: list[str]) -> list[float]:
        sub = {k: [v[i] for i in idx] for k, v in info.items()}
        return score_batch(reward_fn, [queries[i] for i in idx], answers, sub)

    gen, cut = model_generate(model, tok, cfg)
    results = tpo_search(queries, formatted, lambda text: format_prompts(tok, [text], cfg)[0], gen, score, cfg)
    if cfg.baselines:
        best_of_n(results, formatted, gen, score)
    summary = {**summarise(results), "inputs_cut_to_prompt_limit": cut(), "seconds": time.time() - t0,
               "config": {k: getattr(cfg, k) for k in ("model", "prompts", "split", "reward", "num_candidates",
                                                       "rounds", "temperature", "feedback_temperature",
                                                       "max_new_tokens", "feedback_max_new_tokens", "seed")},
               "prompts_used": {k: getattr(cfg, k) for k in TEMPLATE_FIELDS}}
    write_outputs(Path(cfg.out_dir), results, summary)
    print(format_summary(summary), flush=True)
    return summary


def write_outputs(out: Path, results: list[dict], summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
