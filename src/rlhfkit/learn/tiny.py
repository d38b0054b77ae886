"""A policy that visibly learns in seconds: a tiny random Llama trained with PPO to use vowels
(docs/learn/00-watch-it-learn.md, entry 0).

The model is built in code, offline: a byte-level BPE tokenizer of 320 tokens trained on four
sentences (SmolLM2's special tokens, eos == pad, a ChatML template) and a 2-layer Llama of hidden
size 32 (about 30k weights), random. Its answers are random tokens, and the share of vowels among
their characters (the reward, `vowel_share`) starts near 0.12. PPO with full fine-tuning, lr 1e-2
and no KL penalty raises it within ten iterations of 16 answers of 6 tokens: `rlhfkit ppo`'s own
trainer, the same code a real run uses, on a model small enough for seconds on 2 CPU cores.

    python -m rlhfkit.learn.tiny                 # 12 iterations, the reward printed per iteration
    python -m rlhfkit.learn.tiny --iterations 4  # a shorter run
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Write a short review of the new cafe. It was great, lovely coffee and kind staff.",
    "The film was terrible and boring. I hated the ending but loved the music.",
    "What is 3 + 4? The answer is 7. Sam has 5 apples and buys 2 more.",
    "user assistant system: Continue this story about a lighthouse keeper at night.",
] * 4
PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]
VOWELS = frozenset("aeiou")


def build_tokenizer():
    """A byte-level BPE tokenizer of 320 tokens: unk <|endoftext|> (0), bos <|im_start|> (1),
    eos == pad <|im_end|> (2), with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(vocab_size: int, seed: int = 0, layers: int = 2):
    """A random Llama (hidden 32, 4 heads, 2 key/value heads, tied embeddings), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    """Write the tiny model and its tokenizer to `path` (usable as `model=PATH` by every command)."""
    tok = build_tokenizer()
    build_tiny_model(len(tok), seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def vowel_share(prompts: Sequence[str], completions: Sequence[str], **info: Any) -> list[float]:
    """The reward: the share of a completion's characters that are the vowels a, e, i, o, u
    (0 for an empty one). `rlhfkit ppo reward=python:rlhfkit.learn.tiny:vowel_share` takes it."""
    return [sum(ch in VOWELS for ch in c) / max(1, len(c)) for c in completions]


def watch_it_learn(workdir: Path, *, iterations: int = 12, seed: int = 0) -> list[float]:
    """Train the tiny model with PPO on `vowel_share` in `workdir` (model, prompts and the run
    folder `runs/vowels` are written there); return the mean reward of each iteration's rollout,
    one float per iteration."""
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import PPOConfig, train

    workdir = Path(workdir)
    prompts = workdir / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS), encoding="utf-8")
    cfg = build_config(PPOConfig, dict(
        model=str(save_tiny_model(workdir / "tiny-llama", seed)), prompts=str(prompts),
        reward="python:rlhfkit.learn.tiny:vowel_share", iterations=iterations, seed=seed,
        lora=False, lr=1e-2, warmup_steps=1, kl_coef=0.0, rollout_batch_size=16, mini_batch_size=8,
        micro_batch_size=8, max_new_tokens=6, num_eval_prompts=0, dtype="fp32",
        output_dir=str(workdir / "runs"), run_name="vowels", overwrite=True, quiet=True, tensorboard=False))
    train(cfg)
    rows = (workdir / "runs" / "vowels" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(row)["rollout/score_mean"] for row in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlhfkit.learn.tiny",
        description="Train a tiny random Llama with PPO to use vowels and print the reward per iteration "
                    "(about 30 s on 2 CPU cores).")
    parser.add_argument("--iterations", type=int, default=12, help="PPO iterations (default 12)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model, the data order and sampling")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the model, prompts and run folder runs/vowels (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations: expected an integer >= 1, got {args.iterations}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: expected a folder, got the file {args.out}")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        scores = watch_it_learn(out, iterations=args.iterations, seed=args.seed)
    # metrics.jsonl, the doctor and the report count iterations from 0; the trainer's progress line from 1
    print(f"iteration  vowel share  (from 0, as in metrics.jsonl: the progress line 'it 1/{len(scores)}' is iteration 0)")
    for i, score in enumerate(scores):
        print(f"{i:9d}  {score:.3f}")
    print(f"before {scores[0]:.3f}, after {scores[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
