"""SFTConfig: every option of `rlhfkit sft`, documented once (this text is --help)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.options import ExamplesArgs, ModelArgs, OfflineArgs, OptimizerArgs, RunArgs


@dataclass
class SFTConfig(ExamplesArgs, OfflineArgs, ModelArgs, OptimizerArgs, RunArgs):
    """Supervised fine-tuning on (prompt, response) pairs, conversations or plain text."""

    data = retune("builtin:instructions", "training examples: builtin:instructions|arithmetic, or a JSONL/CSV/"
                       "Parquet file or saved `datasets` folder with prompt+response (or completion), chat messages, "
                       "or text (every token trained); in Python also a datasets.Dataset")
    eval_data = retune(None, "held-out examples (default: the eval_split of `data`; for a file without "
                                   "a split field, its training examples, or eval_fraction of them held back)")
    max_train_examples: int | None = option(None, "use a seeded random subset of this many training examples")
    max_eval_examples: int = option(64, "examples evaluated before and after training (a seeded subset; 0: no "
                                   "evaluation)")
    epochs = retune(1, "passes over the training examples (ignored when max_steps > 0)")
    max_steps = retune(0, "optimiser steps; 0 = epochs x ceil(examples / batch_size)")
    batch_size = retune(8, "examples per optimiser step (all processes together)")
    micro_batch_size = retune(4, "examples per forward/backward (gradient accumulation = batch / micro)")
    max_length = retune(512, "tokens per example (prompt + response), cut from the right")
    completion_only_loss: bool = option(True, "prompt/response records: the loss covers the response only (false: "
                                        "the prompt too)")
    packing: bool = option(False, "concatenate training examples into rows of up to max_length tokens (first-fit by "
                           "length), each example attending only to itself (position ids restart per example): "
                           "fewer padded positions; batch_size then counts rows. Evaluation stays unpacked")
    assistant_only_loss: bool = option(False, "conversations (messages): the loss covers every assistant turn; "
                                       "false (TRL's default) = every token of the conversation")
    lr = retune(2e-4, "AdamW learning rate (LoRA default; use ~2e-5 for full fine-tuning)")
    rouge_examples: int = option(32, "held-out examples whose greedy responses are scored with ROUGE-1/2/L against "
                                 "the reference responses before and after training (0 = skip)")
    rouge_max_new_tokens: int = option(64, "response length limit of those greedy responses")
    save_merged = retune(False, "also save the LoRA adapter merged into full weights in final/merged")
    lora_dropout = retune(0.05, "LoRA dropout (SFT only; RL trainers keep 0)")

    def validate(self) -> None:
        check(self.max_eval_examples >= 0, f"max_eval_examples ({self.max_eval_examples}) must be >= 0 (0: no evaluation)")
        for k in ("batch_size", "micro_batch_size", "max_length", "epochs"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.max_steps >= 0, f"max_steps ({self.max_steps}) must be >= 0")
        check(0 <= self.eval_fraction < 1, f"eval_fraction ({self.eval_fraction}) must be in [0, 1)")
        check(self.max_train_examples is None or self.max_train_examples >= 1,
              f"max_train_examples ({self.max_train_examples}) must be >= 1")
        check(self.eval_every >= 0, f"eval_every ({self.eval_every}) must be >= 0")
        check(self.rouge_examples >= 0, f"rouge_examples ({self.rouge_examples}) must be >= 0")
        check(self.rouge_max_new_tokens >= 1, f"rouge_max_new_tokens ({self.rouge_max_new_tokens}) must be >= 1")
