"""The judged evaluation the preference trainers share (dpo, simpo, orpo, kto, online-dpo): samples
of the starting and the trained model on the same prompts with the same seed, scored by a judge
(a reward function or `model:PATH`), and the trained model's win rate over the starting model."""

from __future__ import annotations

from rlhfkit.core.seeding import EVAL_SEED_OFFSET
from rlhfkit.data.chat import format_prompts
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.texts import sample_and_score
from rlhfkit.runtime.run import Run

# Record fields that are data, not prompt information (not passed to the judge)
NOT_PROMPT_FIELDS = ("chosen", "rejected", "margin", "strength", "scores", "tie", "labeller", "labellers", "votes",
                     "pair_id", "completion", "label")


def eval_records(train: list[dict], held_out: list[dict], cfg) -> list[dict]:
    """Distinct prompts for the win rate: held-out pairs' prompts, else training prompts."""
    import random

    seen, out = set(), []
    for pair in held_out or train:
        key = str(pair.get("messages") or pair["prompt"])
        if key not in seen:
            seen.add(key)
            out.append({k: v for k, v in pair.items() if k not in NOT_PROMPT_FIELDS})
    if len(out) > cfg.num_eval_prompts:
        out = random.Random(cfg.seed).sample(out, cfg.num_eval_prompts)
    return out


def judged_samples(model, tok, records: list[dict], judge, cfg, seed: int) -> tuple[list[str], list[float]]:
    """eval_samples_per_prompt completions per record, scored by the judge (same seed -> same noise)."""
    recs = [r for r in records for _ in range(cfg.eval_samples_per_prompt)]
    formatted = format_prompts(tok, [r.get("messages") or r["prompt"] for r in recs], cfg)
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, 0, 1.0, (tok.eos_token_id,), cfg.max_prompt_length)
    return sample_and_score(model.policy, tok, recs, formatted, judge, params, seed, cfg.prompts_per_generate, cfg.dtype)


def win_rate(after: list[float], before: list[float]) -> dict[str, float]:
    """Share of samples where the trained model's judged score beats the starting model's (ties = 1/2)."""
    wins = sum(a > b for a, b in zip(after, before))
    ties = sum(a == b for a, b in zip(after, before))
    n = max(len(after), 1)
    return {"win_rate": (wins + 0.5 * ties) / n, "wins": wins, "ties": ties, "losses": len(after) - wins - ties}


def judge_before(run: Run, model, tok, records: list[dict], judge, judged: dict) -> None:
    """The starting model's judged scores on `records` into ``judged["before"]``, once per run (a resumed
    run has them from its checkpoint); seed cfg.seed + EVAL_SEED_OFFSET, as `judged_after`'s."""
    if records and "before" not in judged:
        with run.evaluation("before"), run.full_weights():
            judged["before"] = judged_samples(model, tok, records, judge, run.cfg, run.cfg.seed + EVAL_SEED_OFFSET)[1]


def judged_after(run: Run, model, tok, records: list[dict], judge, before: list[float], which: str) -> None:
    """The trained model's judged samples on `records` (none: nothing), their win rate over the starting
    model's (`before`, same seed), into the summary and samples.jsonl, as iteration `run.total` (after the
    last step: a resumed run cuts them with the steps it repeats, and logs them once again)."""
    if not records:
        return
    cfg = run.cfg
    with run.evaluation("after"), run.full_weights():  # a signal meanwhile stops the run after the logs below
        completions, after = judged_samples(model, tok, records, judge, cfg, cfg.seed + EVAL_SEED_OFFSET)
        wr = win_rate(after, before)
        mb, ma = sum(before) / len(before), sum(after) / len(after)
        run.print(f"[eval] judge {cfg.judge}: mean score {mb:.3f} before -> {ma:.3f} after "
                  f"({len(after)} samples on {len(records)} {which} prompts)")
        run.print(f"[eval] judged win rate over the starting model: {wr['win_rate']:.1%} "
                  f"(wins {wr['wins']}, ties {wr['ties']}, losses {wr['losses']})")
        run.summary.update({"judge": cfg.judge, "eval_before": mb, "eval_after": ma, **wr})
        recs = [r for r in records for _ in range(cfg.eval_samples_per_prompt)]
        run.tracker.log_samples(run.total, [{"prompt": str(r["prompt"]), "completion": c, "score": a,
                                             "score_before": b} for r, c, a, b in zip(recs, completions, after, before)])
