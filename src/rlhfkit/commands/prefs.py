"""`rlhfkit prefs make`: build a preference data set offline.

For every prompt: sample k completions from a model, score them with a scorer (a reward
function such as `sentiment`, or a reward model `model:PATH`), and pair the best with the
worst (or every pair whose scores differ by more than `min_gap`). Output: JSONL, one pair a line:

    {"prompt": "...", "chosen": "...", "rejected": "...",
     "scores": {"chosen": 0.91, "rejected": -0.34}, "split": "train", "scorer": "sentiment"}

`split` is the split of the prompt (built-in sets and files with a split field), so a reward
model can hold out the pairs of test prompts. `rlhfkit rm data=FILE` reads it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import check, option, retune
from rlhfkit.errors import UserError
from rlhfkit.trainers.options import SampleCommandArgs, TopPArgs

PAIR_MODES = ("best-worst", "all")


@dataclass
class PrefsConfig(TopPArgs, SampleCommandArgs):
    """Sample k completions per prompt, rank them with a scorer, write chosen/rejected pairs (JSONL)."""

    model = retune(help="model that writes the completions (a folder, a run's final/, or the default)")
    prompts = retune(help="prompts: builtin:reviews|stories|arithmetic|instructions or a JSONL/CSV/TXT file")
    num_prompts = retune(help="prompts per split, a seeded random subset (None = all)")
    temperature = retune(help="sampling temperature (> 0: the k samples must differ)")
    top_p = retune(help="nucleus sampling threshold")
    batch_size = retune(32)
    out: str = option("prefs.jsonl", "output JSONL file")
    overwrite: bool = option(False, "replace `out` if it exists")
    splits: list[str] = option(["train", "test"], "prompt splits to use; files without a split field count as 'train'")
    k: int = option(4, "completions sampled per prompt")
    pairs: str = option("best-worst", "best-worst: one pair per prompt (highest vs lowest score); all: every pair "
                        "of distinct completions whose scores differ by more than min_gap", PAIR_MODES)
    min_gap: float = option(0.0, "keep a pair only if score(chosen) - score(rejected) > min_gap")
    scorer: str = option("sentiment", "ranks the completions: sentiment | arithmetic | length[:N] | model:PATH | "
                         "python:module:function")

    def validate(self) -> None:
        check(self.k >= 2, f"k ({self.k}) must be >= 2: a pair needs two completions")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0 so the k samples differ")
        check(self.max_new_tokens >= 1 and self.batch_size >= 1, "max_new_tokens and batch_size must be >= 1")
        check(self.min_gap >= 0, f"min_gap ({self.min_gap}) must be >= 0")
        check(bool(self.splits) and all(s in ("train", "test") for s in self.splits),
              f"splits ({self.splits}) must be a non-empty list of train, test")


# ----------------------------------------------------------------------------- pairs


def build_pairs(completions: list[str], scores: list[float], mode: str = "best-worst",
                min_gap: float = 0.0) -> list[tuple[str, str, float, float]]:
    """(chosen, rejected, chosen score, rejected score) tuples from one prompt's k samples.

    Empty and duplicate completions (after stripping) are dropped first (a duplicate keeps the
    first score). A pair is kept only when the chosen score exceeds the rejected one by more
    than `min_gap`, so ties never become pairs.
    """
    seen: dict[str, float] = {}
    for c, s in zip(completions, scores):
        text = c.strip()
        if text and text not in seen:
            seen[text] = float(s)
    ranked = sorted(seen.items(), key=lambda kv: -kv[1])  # best first; stable for equal scores
    if len(ranked) < 2:
        return []
    if mode == "best-worst":
        candidates = [(ranked[0], ranked[-1])]
    elif mode == "all":
        candidates = [(ranked[i], ranked[j]) for i in range(len(ranked)) for j in range(i + 1, len(ranked))]
    else:
        raise ValueError(f"unknown pairs mode {mode!r}; expected one of {PAIR_MODES}")
    return [(a[0], b[0], a[1], b[1]) for a, b in candidates if a[1] - b[1] > min_gap]


def load_split_prompts(spec: str, splits: list[str], limit: int | None, seed: int) -> list[dict]:
    """Prompt records of the requested splits, each tagged with its `split`."""
    from rlhfkit.data.prompts import load_prompts
    from rlhfkit.data.sets import builtin_name

    if builtin_name(spec) is not None:
        return [{**r, "split": s} for s in splits for r in load_prompts(spec, split=s, limit=limit, seed=seed)]
    rows = load_prompts(spec, split=None)
    out = []
    for s in splits:
        part = [r for r in rows if r.get("split", "train") == s]
        if limit is not None and limit < len(part):
            import random

            keep = sorted(random.Random(seed).sample(range(len(part)), limit))
            part = [part[i] for i in keep]
        out += [{**r, "split": s} for r in part]
    return out


# ----------------------------------------------------------------------------- make


def pair_rows(records: list[dict], completions: list[str], scores: list[float],
              cfg: PrefsConfig) -> tuple[list[dict], int, list[float]]:
    """(output rows, prompts without a pair, score gaps) from k consecutive completions per record."""
    rows, skipped, gaps = [], 0, []
    for i, r in enumerate(records):
        sl = slice(i * cfg.k, (i + 1) * cfg.k)
        pairs = build_pairs(completions[sl], scores[sl], cfg.pairs, cfg.min_gap)
        skipped += not pairs
        for chosen, rejected, sc, sr in pairs:
            row = {"prompt": r["prompt"], "chosen": chosen, "rejected": rejected,
                   "scores": {"chosen": sc, "rejected": sr}, "split": r["split"], "scorer": cfg.scorer}
            if r.get("messages"):
                row["messages"] = r["messages"]
            rows.append(row)
            gaps.append(sc - sr)
    if not rows:
        raise UserError(f"no pairs: all {len(records)} prompts gave completions with equal scores "
                        f"(scorer {cfg.scorer}, min_gap {cfg.min_gap}); raise k or temperature")
    return rows, skipped, gaps


def write_jsonl_atomic(out: Path, rows: list[dict]) -> None:
    """One JSON object a line, written to a temporary file in the same folder and renamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(out)


def make_preferences(cfg: PrefsConfig) -> dict:
    """Sample, score and pair; writes cfg.out atomically. Returns a summary dict."""
    import torch

    from rlhfkit.core.precision import autocast
    from rlhfkit.core.seeding import seed_everything
    from rlhfkit.data.chat import format_example
    from rlhfkit.data.prompts import info_lists
    from rlhfkit.rewards import get_reward, score_batch
    from rlhfkit.rollout import SamplingParams
    from rlhfkit.rollout.prompt_fit import enforce_prompt_limit, prompt_token_limit
    from rlhfkit.rollout.texts import generate_texts, load_for_inference

    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        raise UserError(f"out: {out} already exists (pass overwrite=true to replace it)")
    t0 = time.time()
    seed_everything(cfg.seed)
    records = load_split_prompts(cfg.prompts, cfg.splits, cfg.num_prompts, cfg.seed)
    if not records:
        raise UserError(f"prompts: {cfg.prompts} has no prompts in splits {cfg.splits}")
    scorer = get_reward(cfg.scorer)
    model, tok = load_for_inference(cfg.model, cfg.dtype)
    # 1. sample: each prompt repeated k times (one batch of generate() samples them independently)
    formatted = [format_example(tok, r.get("messages") or r["prompt"], "", cfg.chat_template, cfg.system_prompt)[0]
                 for r in records]
    repeated = [f for f in formatted for _ in range(cfg.k)]
    limit, how = prompt_token_limit(model, cfg.max_new_tokens, cfg.max_prompt_length)
    enforce_prompt_limit(tok, [(formatted, lambda i: str(cfg.prompts))], limit, cfg.prompt_overflow, how)
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, 0, cfg.top_p, (tok.eos_token_id,), limit)
    device = next(model.parameters()).device
    with autocast(cfg.dtype, device), torch.no_grad():
        completions = generate_texts(model, tok, repeated, params, cfg.seed, cfg.batch_size)
    del model
    # 2. score with the scorer (extra prompt fields, e.g. `answer`, go to it as keyword lists)
    rep_records = [r for r in records for _ in range(cfg.k)]
    scores = score_batch(scorer, [str(r["prompt"]) for r in rep_records], completions,
                         info_lists([{k: v for k, v in r.items() if k != "split"} for r in rep_records]))
    # 3. pair and write
    rows, skipped, gaps = pair_rows(records, completions, scores, cfg)
    write_jsonl_atomic(out, rows)
    m = sum(scores) / len(scores)
    summary = {"out": str(out), "prompts": len(records), "pairs": len(rows), "prompts_without_pair": skipped,
               "completions": len(completions), "score_mean": m, "mean_gap": sum(gaps) / len(gaps),
               "pairs_by_split": {s: sum(r["split"] == s for r in rows) for s in cfg.splits},
               "seconds": time.time() - t0}
    print(f"[prefs] {len(rows)} pairs from {len(records)} prompts x {cfg.k} samples -> {out} "
          f"(mean score {m:.3f}, mean gap {summary['mean_gap']:.3f}, {skipped} prompts without a pair, "
          f"{summary['seconds']:.0f} s)", flush=True)
    return summary


USAGE = """usage: rlhfkit prefs make [CONFIG.yaml] [key=value ...]

Build preference pairs offline: sample k completions per prompt, rank them with a scorer.
Run 'rlhfkit prefs make --help' for every option."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] != "make":
        raise UserError(f"unknown prefs command '{argv[0]}'; expected 'rlhfkit prefs make key=value ...'")
    cfg = parse_args(PrefsConfig, argv[1:], "rlhfkit prefs make")
    if cfg is None:
        return 0
    make_preferences(cfg)
    return 0
