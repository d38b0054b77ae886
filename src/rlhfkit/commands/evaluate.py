"""`rlhfkit eval`: evaluate a model (and optionally a reference model) on a prompt set.

Steps:
  1. prompts   `split` of `prompts` (a seeded subset of num_prompts)
  2. generate  one completion per prompt per model: greedy (temperature=0) or sampled
  3. score     every reward in `rewards` (functions or reward models): mean and std per model
  4. compare   win rate of model vs ref_model per reward: (wins + ties / 2) / n, same prompts
  5. tasks     accuracy on verifiable prompts (records with answer/answer_value, e.g. arithmetic);
               perplexity of the reference responses and ROUGE-1/2/L of the completions against them
               (records with a `response`, e.g. SFT data)
  6. write     OUT/report.json and OUT/samples.jsonl
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rlhfkit.commands.evaluate_config import EvalConfig, parse_rewards
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import format_example
from rlhfkit.data.prompts import info_lists, load_prompts
from rlhfkit.data.sft import tokenize_examples
from rlhfkit.errors import UserError
from rlhfkit.models.response_nll import ResponseNLL, mean_nll
from rlhfkit.rewards import arithmetic, get_reward, score_batch
from rlhfkit.rewards.rouge import rouge_scores

# ----------------------------------------------------------------------------- pure helpers


def win_rate(model_scores: list[float], ref_scores: list[float]) -> dict:
    """Pairwise comparison on the same prompts: win_rate = (wins + ties / 2) / n."""
    if len(model_scores) != len(ref_scores):
        raise ValueError(f"{len(model_scores)} model scores vs {len(ref_scores)} reference scores")
    wins = sum(a > b for a, b in zip(model_scores, ref_scores))
    ties = sum(a == b for a, b in zip(model_scores, ref_scores))
    n = len(model_scores)
    return {"wins": wins, "ties": ties, "losses": n - wins - ties, "n": n,
            "win_rate": (wins + 0.5 * ties) / n if n else float("nan")}






def mean_std(xs: list[float]) -> dict:
    n = len(xs)
    if not n:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    m = sum(xs) / n
    return {"mean": m, "std": math.sqrt(sum((x - m) ** 2 for x in xs) / n), "n": n}


# ----------------------------------------------------------------------------- model passes


def run_model(spec: str, records: list[dict], cfg: EvalConfig) -> dict:
    """Completions (step 2) and the reference-response perplexity (step 5) of one model."""
    import torch

    from rlhfkit.rollout import SamplingParams
    from rlhfkit.rollout.prompt_fit import enforce_prompt_limit, prompt_token_limit
    from rlhfkit.rollout.texts import generate_texts, load_for_inference

    model, tok = load_for_inference(spec, cfg.dtype)
    device = next(model.parameters()).device
    formatted = [format_example(tok, r.get("messages") or r["prompt"], "", cfg.chat_template, cfg.system_prompt)[0]
                 for r in records]
    limit, how = prompt_token_limit(model, cfg.max_new_tokens, cfg.max_prompt_length)
    enforce_prompt_limit(tok, [(formatted, getattr(records, "where", None))], limit, cfg.prompt_overflow, how)
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, 0, 1.0, (tok.eos_token_id,), limit)
    t0 = time.time()
    with autocast(cfg.dtype, device), torch.no_grad():
        completions = generate_texts(model, tok, formatted, params, cfg.seed, cfg.batch_size)
    out = {"completions": completions, "generate_s": time.time() - t0}
    refs = [r for r in records if isinstance(r.get("response"), str) and r["response"].strip()]
    if cfg.perplexity and refs:
        examples, _ = tokenize_examples(tok, refs, cfg, 1024)
        if examples:
            nll, n = mean_nll(ResponseNLL(model), examples, tok.pad_token_id, 8, cfg.dtype, device)
            out.update({"perplexity": math.exp(min(nll, 50.0)), "response_nll": nll, "response_tokens": n})
    del model
    return out


def model_metrics(run: dict, records: list[dict], scores: dict[str, list[float]], cfg: EvalConfig) -> dict:
    """Reward mean/std per reward, accuracy, perplexity, ROUGE-1/2/L, mean length for one model."""
    m: dict = {f"reward/{name}": mean_std(s) for name, s in scores.items()}
    comps = run["completions"]
    m["response_words"] = mean_std([len(c.split()) for c in comps])["mean"]
    verifiable = [i for i, r in enumerate(records) if r.get("answer") is not None or r.get("answer_value") is not None]
    if verifiable:
        acc = arithmetic([records[i]["prompt"] for i in verifiable], [comps[i] for i in verifiable],
                         answer=[records[i].get("answer") for i in verifiable],
                         answer_value=[records[i].get("answer_value") for i in verifiable])
        m["accuracy"] = sum(acc) / len(acc)
        m["accuracy_n"] = len(acc)
    if "perplexity" in run:
        m["perplexity"] = run["perplexity"]
    refs = [i for i, r in enumerate(records) if isinstance(r.get("response"), str) and r["response"].strip()]
    if cfg.rouge and refs:
        m.update(rouge_scores([comps[i] for i in refs], [records[i]["response"] for i in refs]))
    return m


# ----------------------------------------------------------------------------- main


def evaluate(cfg: EvalConfig) -> dict:
    """Run the evaluation; writes OUT/report.json and OUT/samples.jsonl and returns the report."""
    from rlhfkit.core.seeding import seed_everything

    t0 = time.time()
    seed_everything(cfg.seed)
    records = load_prompts(cfg.prompts, split=cfg.split, limit=cfg.num_prompts, seed=cfg.seed)  # 1.
    if not records:
        raise UserError(f"prompts: {cfg.prompts} has no prompts in split {cfg.split}")
    rewards = [(name, get_reward(spec)) for name, spec in parse_rewards(cfg.rewards)]
    runs = {"model": run_model(cfg.model, records, cfg)}  # 2.
    if cfg.ref_model:
        runs["reference"] = run_model(cfg.ref_model, records, cfg)
    prompts = [str(r["prompt"]) for r in records]
    info = info_lists(records)
    scores = {who: {name: score_batch(fn, prompts, run["completions"], info) for name, fn in rewards}  # 3.
              for who, run in runs.items()}
    report: dict = {"config": {"model": cfg.model, "ref_model": cfg.ref_model, "prompts": cfg.prompts,
                               "split": cfg.split, "temperature": cfg.temperature,
                               "max_new_tokens": cfg.max_new_tokens, "rewards": dict(parse_rewards(cfg.rewards))},
                    "n": len(records)}
    for who, run in runs.items():  # 5.
        report[who] = model_metrics(run, records, scores[who], cfg)
    if cfg.ref_model:  # 4.
        report["win_rate"] = {name: win_rate(scores["model"][name], scores["reference"][name]) for name, _ in rewards}
    report["seconds"] = time.time() - t0
    out = Path(cfg.out_dir)  # 6.
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "samples.jsonl", "w") as f:
        for i, r in enumerate(records):
            row = {"prompt": r["prompt"], "completion": runs["model"]["completions"][i],
                   "scores": {n: scores["model"][n][i] for n, _ in rewards}}
            if cfg.ref_model:
                row["ref_completion"] = runs["reference"]["completions"][i]
                row["ref_scores"] = {n: scores["reference"][n][i] for n, _ in rewards}
            if isinstance(r.get("response"), str):
                row["reference_response"] = r["response"]
            f.write(json.dumps(row) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(format_report(report), flush=True)
    return report


def format_report(report: dict) -> str:
    """A small text table: one row per metric, one column per model."""
    cols = ["model"] + (["reference"] if report.get("reference") else [])
    keys = [k for k in report["model"] if k != "accuracy_n"]
    lines = [f"{'metric':32s}" + "".join(f"{c:>14s}" for c in cols)]
    for k in keys:
        cells = []
        for c in cols:
            v = report[c].get(k)
            v = v["mean"] if isinstance(v, dict) else v
            cells.append(f"{v:14.4f}" if isinstance(v, (int, float)) else f"{'-':>14s}")
        lines.append(f"{k:32s}" + "".join(cells))
    for name, w in (report.get("win_rate") or {}).items():
        lines.append(f"{'win rate vs reference: ' + name:32s}{w['win_rate']:14.3f}  "
                     f"({w['wins']} wins, {w['ties']} ties, {w['losses']} losses)")
    return "\n".join(lines)
