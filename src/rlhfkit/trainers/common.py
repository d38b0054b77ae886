"""Pieces every trainer shares: model set-up, optimiser, prompt stream, evaluation."""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass

import torch

from rlhfkit.runtime.config import option


@dataclass
class ModelArgs:
    model: str = option("smollm2-135m-instruct", "policy: 'smollm2-135m-instruct' (built in) or a local HF model folder")
    dtype: str = option("auto", "compute dtype. bf16: frozen base weights in bf16 and bf16 autocast (4x faster matmuls "
                        "on CPUs with AVX-512 BF16 and on GPUs; 3x slower on CPUs without); trainable weights and "
                        "optimiser state stay fp32. auto: bf16 where it is fast, else fp32", ("auto", "fp32", "bf16"))
    lora: bool = option(True, "train LoRA adapters (the reference is then the adapter-disabled base); false = full fine-tuning")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = option(0.0, "LoRA dropout; keep 0 for RL so rollouts and updates see the same policy")
    lora_target_modules: list | None = option(None, "module names to adapt; None chooses attention+MLP projections")
    lora_layers: int | None = option(None, "adapt only the top N transformer layers (None: all). Backward then stops "
                                     "below the lowest adapted layer: a large CPU speed-up for a small loss in capacity")
    chat_template: bool = option(True, "format prompts with the tokenizer's chat template when it has one")
    system_prompt: str | None = option(None, "optional system message for chat-formatted prompts")


@dataclass
class SamplingArgs:
    temperature: float = option(1.0, "sampling temperature; log-probs, reference and entropy use the same T")
    top_k: int = option(0, "0 = no top-k truncation (recommended: truncation biases the stored log-probs)")
    top_p: float = option(1.0, "1.0 = no nucleus truncation (recommended)")
    stop_ids: list | None = option(None, "token ids that end a response (default: the tokenizer's eos)")


@dataclass
class RunArgs:
    output_dir: str = option("runs", "parent folder of run folders")
    run_name: str | None = option(None, "run folder name (default: COMMAND-DATE-TIME)")
    seed: int = option(0, "seed for initialisation and data order; sampling uses seed + rank * prime + iteration")
    quiet: bool = option(False, "plain one-line logs instead of progress bars (for log files)")
    tensorboard: bool | None = option(None, "log to TensorBoard (None: when installed)")
    wandb: bool = option(False, "log to Weights & Biases (when installed)")


def autocast(dtype: str, device: torch.device):
    """bf16 autocast for forward passes; a no-op for fp32."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_policy(args: ModelArgs, trainable: bool = True):
    """(model, tokenizer). With LoRA the frozen base is stored in the compute dtype."""
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.models.loading import resolve_dtype
    from rlhfkit.models.policy import add_lora

    args.dtype = resolve_dtype(args.dtype)
    tok = load_tokenizer(args.model, padding_side="left")
    base_dtype = "bf16" if (args.dtype == "bf16" and args.lora) else "fp32"
    model = load_causal_lm(args.model, dtype=base_dtype, trainable=True)
    if args.lora and trainable:
        model = add_lora(model, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_target_modules,
                         args.lora_layers)
    return model, tok


def make_optimizer(params, lr: float, warmup_steps: int, weight_decay: float = 0.0, eps: float = 1e-8):
    """AdamW with linear warm-up then constant lr (pitfall 12: warm-up tames early approx-KL spikes)."""
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
    return opt, sched


class PromptStream:
    """Endless, reproducible pass over prompt records: shuffled per epoch with the run seed."""

    def __init__(self, records: list[dict], seed: int):
        self.records = records
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.records)))
        random.Random(self.seed * 1_000 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list[dict]:
        out = []
        while len(out) < n:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.records[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()


def format_prompts(tokenizer, prompts: list, args: ModelArgs) -> list[str]:
    from rlhfkit.data.chat import format_prompt

    if not args.chat_template:
        return [f"User: {p}\n\nAssistant: " if isinstance(p, str) else p for p in prompts]
    return [format_prompt(tokenizer, p, system=args.system_prompt) for p in prompts]


def info_lists(records: list[dict]) -> dict[str, list]:
    """Per-sample extra fields (e.g. 'answer') as lists, for reward functions."""
    keys = {k for r in records for k in r if k not in ("prompt", "split", "messages")}
    return {k: [r.get(k) for r in records] for k in sorted(keys)}


def mean_std(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
