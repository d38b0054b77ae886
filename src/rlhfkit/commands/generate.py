"""`rlhfkit generate`: sample completions from a model (the sampling itself: rollout/texts.py)."""

from __future__ import annotations

import argparse

from rlhfkit.core.argv import OptionsHelpFormatter, parse_command_line
from rlhfkit.core.seeding import seed_everything
from rlhfkit.rollout.texts import sample_texts


def build_parser() -> argparse.ArgumentParser:
    """The options of `rlhfkit generate`."""
    p = argparse.ArgumentParser(formatter_class=OptionsHelpFormatter, prog="rlhfkit generate", description="Sample completions from a model.")
    p.add_argument("--model", default="smollm2-135m-instruct", help="model folder, run output (runs/NAME/final) or the default")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    p.add_argument("--num-samples", type=int, default=1, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature; 0 = greedy (default: 1, or the model's own with "
                        "--model-generation-config)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="weights and matmuls while sampling: auto = bf16 where bf16 matmuls are fast (AVX-512 BF16, "
                        "recent GPUs), else fp32")
    p.add_argument("--model-generation-config", action="store_true",
                   help="sample with the model folder's own generation_config.json (its temperature, top-k/top-p, "
                        "repetition penalty, ...); by default only rlhfkit's settings apply: the full distribution "
                        "at --temperature, as in training")
    return p


def main(argv: list[str]) -> int:
    a = parse_command_line(build_parser(), argv)
    seed_everything(a.seed)
    temperature = 1.0 if a.temperature is None and not a.model_generation_config else a.temperature
    outs = sample_texts(a.model, a.prompt, a.num_samples, a.max_new_tokens, temperature, a.seed,
                        use_model_config=a.model_generation_config, dtype=a.dtype)
    for prompt, samples in zip(a.prompt, outs):
        print(f"### {prompt}")
        for s in samples:
            print(f"- {s}")
    return 0
