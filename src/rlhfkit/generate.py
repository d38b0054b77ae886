"""`rlhfkit generate`: sample completions from a model; helpers reused by eval and trainers."""

from __future__ import annotations

import argparse

import torch

from rlhfkit.rollout import SamplingParams, generate
from rlhfkit.runtime.seeding import seed_everything


def generate_texts(model, tokenizer, formatted: list[str], params: SamplingParams, seed: int,
                   batch_size: int = 16) -> list[str]:
    """Completions for chat-formatted prompt texts, reproducible for a given seed."""
    torch.manual_seed(seed)
    return generate(model, tokenizer, formatted, params, batch_size=batch_size).completions


def sample_and_score(model, tokenizer, records: list[dict], formatted: list[str], reward_fn, params: SamplingParams,
                     seed: int, batch_size: int = 16, dtype: str = "fp32") -> tuple[list[str], list[float]]:
    """Sample one completion per prompt and score it with `reward_fn`."""
    from rlhfkit.rewards import score_batch
    from rlhfkit.trainers.common import autocast, info_lists

    device = next(model.parameters()).device
    with autocast(dtype, device):
        completions = generate_texts(model, tokenizer, formatted, params, seed, batch_size)
    prompts = [r["prompt"] if isinstance(r["prompt"], str) else str(r["prompt"]) for r in records]
    scores = score_batch(reward_fn, prompts, completions, info_lists(records))
    return completions, [float(s) for s in scores]


def load_for_inference(model: str, dtype: str = "fp32"):
    """(model, tokenizer) for sampling: a model folder, an rlhfkit run output, or the default."""
    from rlhfkit.models import load_causal_lm, load_tokenizer

    lm = load_causal_lm(model, dtype=dtype, trainable=False)  # first: "not a causal LM" wins over tokenizer errors
    tok = load_tokenizer(model, padding_side="left")
    return lm, tok


def sample_texts(model: str, prompts: list[str], num_samples: int, max_new_tokens: int = 64,
                 temperature: float = 1.0, seed: int = 0) -> list[list[str]]:
    """`num_samples` completions for each raw prompt (chat-formatted here). Returns [prompt][sample]."""
    from rlhfkit.data.chat import format_prompt

    lm, tok = load_for_inference(model)
    formatted = [format_prompt(tok, p) for p in prompts]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    out: list[list[str]] = [[] for _ in prompts]
    for k in range(num_samples):
        for i, text in enumerate(generate_texts(lm, tok, formatted, params, seed + k)):
            out[i].append(text)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlhfkit generate", description="Sample completions from a model.")
    p.add_argument("--model", default="smollm2-135m-instruct", help="model folder, run output (runs/NAME/final) or the default")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    p.add_argument("--num-samples", type=int, default=1, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    a = p.parse_args(argv)
    seed_everything(a.seed)
    outs = sample_texts(a.model, a.prompt, a.num_samples, a.max_new_tokens, a.temperature, a.seed)
    for prompt, samples in zip(a.prompt, outs):
        print(f"### {prompt}")
        for s in samples:
            print(f"- {s}")
    return 0
