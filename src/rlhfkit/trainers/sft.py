"""`rlhfkit sft`: supervised fine-tuning (LoRA or full) with the loss on response tokens only.

One optimiser step, as numbered steps in `train`:
  1. batch     the next `batch_size` examples of a seeded stream, reshuffled every epoch
               (each process takes its share)
  2. count     response tokens of the whole mini-batch: all micro-batches, all processes
  3. forward   per micro-batch: NLL of every response token; prompt tokens are labelled -100
               and carry no loss (label masking)
  4. backward  sum(NLL) / (mini-batch token count): the global token mean (pitfall 11), so
               splitting into micro-batches gives the same gradient
  5. step      clip, AdamW, warm-up schedule
  6. evaluate  before training, every `eval_every` steps and at the end: eval/loss, eval/perplexity
  7. log/save  metrics.jsonl, summary.json; RUN/final (adapter or full weights), RUN/final/merged
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass

import torch
from torch import nn

from rlhfkit.algos import aggregate_loss, logprobs_from_logits
from rlhfkit.data.chat import IGNORE_INDEX, tokenize_sft_example
from rlhfkit.errors import DataError, UserError
from rlhfkit.runtime.allocator import tune_malloc
from rlhfkit.runtime.checkpoint import Checkpointer, open_run_dir
from rlhfkit.runtime.config import check, config_main, option, save_config
from rlhfkit.runtime.distributed import (
    accumulate_backward,
    agree_on_run_name,
    configure_deepspeed,
    full_state_dict,
)
from rlhfkit.runtime.faults import NonFiniteGuard, guarded_step
from rlhfkit.runtime.seeding import seed_everything
from rlhfkit.runtime.tracker import Tracker
from rlhfkit.trainers.common import (
    ModelArgs,
    PromptStream,
    RunArgs,
    autocast,
    check_optimizer,
    make_optimizer,
)


@dataclass
class SFTConfig(ModelArgs, RunArgs):
    """Supervised fine-tuning on (prompt, response) pairs; the loss covers the response tokens only."""

    data: str = option("builtin:instructions", "training examples: builtin:instructions|arithmetic, or a JSONL/CSV/"
                       "Parquet file or saved `datasets` folder with prompt+response (or completion) or chat messages")
    eval_data: str | None = option(None, "held-out examples (default: the test split of `data`; for a file without "
                                   "a split field, eval_fraction of it)")
    eval_fraction: float = option(0.1, "share of `data` held out for eval when it has no split field and no eval_data")
    max_train_examples: int | None = option(None, "use a seeded random subset of this many training examples")
    max_eval_examples: int = option(64, "held-out examples used for eval/loss (a seeded subset)")
    epochs: int = option(1, "passes over the training examples (ignored when max_steps > 0)")
    max_steps: int = option(0, "optimiser steps; 0 = epochs x ceil(examples / batch_size)")
    batch_size: int = option(8, "examples per optimiser step (all processes together)")
    micro_batch_size: int = option(4, "examples per forward/backward (gradient accumulation = batch / micro)")
    max_length: int = option(512, "tokens per example (prompt + response), cut from the right")
    lr: float = option(2e-4, "AdamW learning rate (LoRA default; use ~2e-5 for full fine-tuning)")
    warmup_steps: int = option(4, "linear lr warm-up, in optimiser steps")
    weight_decay: float = option(0.0, "AdamW weight decay")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    max_grad_norm: float = option(1.0, "gradient-norm clip threshold (params/grad_norm is logged before clipping)")
    eval_every: int = option(0, "evaluate every N optimiser steps (0 = only before and after training)")
    save_merged: bool = option(False, "also save the LoRA adapter merged into full weights in final/merged")
    lora_dropout: float = option(0.05, "LoRA dropout (SFT only; RL trainers keep 0)")

    def validate(self) -> None:
        for k in ("batch_size", "micro_batch_size", "max_length", "epochs", "max_eval_examples"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.max_steps >= 0, f"max_steps ({self.max_steps}) must be >= 0")
        check_optimizer(self)
        check(0 <= self.eval_fraction < 1, f"eval_fraction ({self.eval_fraction}) must be in [0, 1)")
        check(self.max_train_examples is None or self.max_train_examples >= 1,
              f"max_train_examples ({self.max_train_examples}) must be >= 1")
        check(self.eval_every >= 0, f"eval_every ({self.eval_every}) must be >= 0")


# ----------------------------------------------------------------------------- data


def train_eval_split(loader, spec: str, eval_spec: str | None, eval_fraction: float, seed: int) -> tuple[list, list]:
    """(train, held-out) records for any loader(spec, split=...) of rlhfkit.data.

    Built-in sets use their train/test splits; a file whose records carry `split` uses those
    (records without one count as train); without test records a seeded `eval_fraction` of the
    training records is held out. `eval_spec` overrides.
    """
    from rlhfkit.data.sets import builtin_name

    if builtin_name(spec) is not None:
        train = list(loader(spec, split="train"))
        held = [] if eval_spec else list(loader(spec, split="test"))
    else:
        rows = list(loader(spec, split=None))
        train, held = rows, []
        if any("split" in r for r in rows):
            train = [_drop_split(r) for r in rows if r.get("split", "train") == "train"]
            held = [_drop_split(r) for r in rows if r.get("split") == "test"]
        if not held and not eval_spec:  # no test split: hold out a seeded fraction
            order = list(range(len(train)))
            random.Random(seed).shuffle(order)
            n_eval = math.ceil(eval_fraction * len(train)) if len(train) > 1 and eval_fraction > 0 else 0
            chosen = set(order[:n_eval])
            train, held = ([r for i, r in enumerate(train) if i not in chosen],
                           [r for i, r in enumerate(train) if i in chosen])
    if eval_spec:
        held = [_drop_split(r) for r in loader(eval_spec, split=None)]
    if not train:
        raise DataError(f"{spec}: no training records")
    return train, held


def _drop_split(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "split"}


def subset(records: list, n: int | None, seed: int) -> list:
    """A seeded random subset of n records (kept in order); all of them when n is None or larger."""
    if n is None or n >= len(records):
        return records
    keep = sorted(random.Random(seed).sample(range(len(records)), n))
    return [records[i] for i in keep]


def tokenize_examples(tok, examples: list[dict], cfg: ModelArgs, max_length: int) -> tuple[list[dict], int]:
    """Token ids + labels (prompt = -100) per example; drops examples whose response was cut away."""
    from rlhfkit.models.reward_model import format_example

    out, dropped = [], 0
    for ex in examples:
        # ex["prompt"] is a string or, for chat records, the message list before the response
        p_text, full = format_example(tok, ex["prompt"], ex["response"], cfg.chat_template, cfg.system_prompt)
        t = tokenize_sft_example(tok, p_text, full, max_length)
        if any(x != IGNORE_INDEX for x in t["labels"][1:]):
            out.append(t)
        else:
            dropped += 1
    return out, dropped


def collate(examples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (-100 on padding). (B, L)"""
    L = max(len(e["input_ids"]) for e in examples)
    B = len(examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    labels = torch.full((B, L), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(e["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ----------------------------------------------------------------------------- loss


class ResponseNLL(nn.Module):
    """Per-token negative log-likelihood of the labelled (response) tokens.

    forward(input_ids, attention_mask, labels) -> (nll (B, L-1), mask (B, L-1)); position t
    predicts token t+1, and the LM head runs only where a label exists (prompt logits are
    never computed). Wrapping the model in one module lets Accelerate/DDP see the forward.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, labels):
        from rlhfkit.models.policy import position_ids_from_mask

        get_base = getattr(self.model, "get_base_model", None)
        lm = get_base() if callable(get_base) else self.model  # LoRA layers stay injected
        hidden = lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids_from_mask(attention_mask),
                                  use_cache=False).last_hidden_state[:, :-1]  # (B, L-1, H)
        targets = labels[:, 1:]  # (B, L-1)
        mask = targets != IGNORE_INDEX
        logits = lm.get_output_embeddings()(hidden[mask])  # (N, V), N labelled tokens
        nll = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        nll[mask] = -logprobs_from_logits(logits, targets[mask])
        return nll, mask


@torch.no_grad()
def mean_nll(module: nn.Module, examples: list[dict], pad_id: int, micro_batch_size: int, dtype: str,
             device) -> tuple[float, int]:
    """(token-mean NLL over all labelled tokens, number of tokens) of tokenised examples."""
    was_training = module.training
    module.eval()
    total, n = 0.0, 0
    for i in range(0, len(examples), micro_batch_size):
        b = {k: v.to(device) for k, v in collate(examples[i : i + micro_batch_size], pad_id).items()}
        with autocast(dtype, device):
            nll, mask = module(**b)
        total += nll.sum().item()
        n += int(mask.sum().item())
    module.train(was_training)
    return total / max(n, 1), n


def eval_stats(module, examples, pad_id, cfg, device) -> dict:
    loss, n = mean_nll(module, examples, pad_id, cfg.micro_batch_size, cfg.dtype, device)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": n}


# ----------------------------------------------------------------------------- loop


def sft_step(module, optimizer, scheduler, accelerator, batch: list[dict], pad_id: int, cfg: SFTConfig, *,
             guard=None, where: str = "") -> dict:
    """Steps 2-5 for one mini-batch (this process's share); returns loss and grad norm. A non-finite
    loss or gradient norm skips the optimiser step (rlhfkit.runtime.faults.guarded_step)."""
    device = accelerator.device
    n_tok = accelerator.reduce(torch.tensor(sum(sum(x != IGNORE_INDEX for x in e["labels"][1:]) for e in batch),
                                            device=device, dtype=torch.float32), "sum").item()
    loss_sum = 0.0
    for m0 in range(0, len(batch), cfg.micro_batch_size):
        b = {k: v.to(device) for k, v in collate(batch[m0 : m0 + cfg.micro_batch_size], pad_id).items()}
        with autocast(cfg.dtype, device):
            nll, mask = module(**b)
        loss = aggregate_loss(nll, mask, num_tokens=max(n_tok, 1.0))  # / all processes' tokens
        accumulate_backward(accelerator, module, loss, sync=m0 + cfg.micro_batch_size >= len(batch))
        loss_sum += loss.item()
    grad_norm, skipped = guarded_step(module.parameters(), optimizer, scheduler, accelerator, cfg.max_grad_norm,
                                      loss=loss_sum, guard=guard, where=where)
    loss_all = accelerator.reduce(torch.tensor(loss_sum, device=device), "sum").item()
    return {"loss/sft": loss_all, "params/grad_norm": grad_norm, "params/lr": scheduler.get_last_lr()[0],
            "params/skipped_steps": float(skipped), "tokens": n_tok}


def train(cfg: SFTConfig) -> dict:
    """Run SFT; returns the summary (also written to RUN/summary.json)."""
    from accelerate import Accelerator

    from rlhfkit.data.sft import load_sft_examples
    from rlhfkit.trainers.common import build_policy

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    seed_everything(cfg.seed)
    tune_malloc()  # freed CPU tensors stay in the process for reuse (runtime/allocator.py)
    # Data and model are checked before the run folder exists: bad input leaves nothing behind.
    train_rows, eval_rows = train_eval_split(load_sft_examples, cfg.data, cfg.eval_data, cfg.eval_fraction, cfg.seed)
    train_rows = subset(train_rows, cfg.max_train_examples, cfg.seed)
    eval_rows = subset(eval_rows, cfg.max_eval_examples, cfg.seed + 1)
    model, tok = build_policy(cfg)
    pad_id = tok.pad_token_id
    train_ex, dropped = tokenize_examples(tok, train_rows, cfg, cfg.max_length)
    eval_ex, _ = tokenize_examples(tok, eval_rows, cfg, cfg.max_length)
    if not train_ex:
        raise UserError(f"data: every example of {cfg.data} lost its response to max_length={cfg.max_length}")
    W, rank = accelerator.num_processes, accelerator.process_index
    check(cfg.batch_size % W == 0, f"batch_size ({cfg.batch_size}) must be divisible by the {W} processes")
    steps = cfg.max_steps or cfg.epochs * math.ceil(len(train_ex) / cfg.batch_size)
    agree_on_run_name(accelerator, cfg, "sft")
    run_dir, resume_from = open_run_dir(cfg, "sft")
    if accelerator.is_main_process:
        save_config(cfg, run_dir / "config.yaml")
    tracker = Tracker(run_dir, steps, cfg.quiet, accelerator.is_main_process, cfg.tensorboard, cfg.wandb)
    if dropped:
        tracker.print(f"[sft] dropped {dropped} examples whose response did not fit in max_length={cfg.max_length}")
    module = ResponseNLL(model)
    optimizer, scheduler = make_optimizer(model.parameters(), cfg.lr, cfg.warmup_steps, cfg.weight_decay, cfg.adam_eps)
    configure_deepspeed(accelerator, cfg.micro_batch_size, cfg.max_grad_norm)
    module, optimizer, scheduler = accelerator.prepare(module, optimizer, scheduler)
    core = accelerator.unwrap_model(module)
    stream = PromptStream(train_ex, cfg.seed)
    summary: dict = {"run_dir": str(run_dir), "train_examples": len(train_ex), "eval_examples": len(eval_ex),
                     "steps": steps}
    guard = NonFiniteGuard.for_config(cfg, tracker.print)
    ckpt = Checkpointer(cfg, run_dir, "sft", accelerator, tracker, model=core, optimizer=optimizer,
                        scheduler=scheduler, objects={"stream": stream, "summary": summary}, guard=guard,
                        unit="step", total=steps)
    ckpt.resume(resume_from)  # when resuming: weights, optimiser, data position, RNG, before-eval
    if eval_ex:
        if "eval_before" not in summary:
            summary["eval_before"] = eval_stats(core, eval_ex, pad_id, cfg, accelerator.device)
        tracker.print(f"[eval] before: loss {summary['eval_before']['loss']:.4f}, "
                      f"perplexity {summary['eval_before']['perplexity']:.2f} ({len(eval_ex)} examples)")
    module.train()
    with ckpt.signals:
        for step in range(ckpt.start, steps):
            t0 = time.time()
            batch = stream.next(cfg.batch_size)[rank::W]  # 1. this process's share
            metrics = sft_step(module, optimizer, scheduler, accelerator, batch, pad_id, cfg, guard=guard,
                               where=f"step {step}")  # 2-5.
            metrics["timing/step_s"] = time.time() - t0
            if eval_ex and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step == steps - 1):
                ev = eval_stats(core, eval_ex, pad_id, cfg, accelerator.device)  # 6.
                metrics.update({"eval/loss": ev["loss"], "eval/perplexity": ev["perplexity"]})
                summary["eval_after"] = ev
            tracker.log(step, metrics)  # 7.
            ckpt.end_step(step)  # checkpoint when due or asked to stop
    ckpt.finish(steps)
    if "eval_after" in summary:
        tracker.print(f"[eval] after:  loss {summary['eval_after']['loss']:.4f}, "
                      f"perplexity {summary['eval_after']['perplexity']:.2f}")
    state = full_state_dict(accelerator, module)  # FSDP / ZeRO-3: gathered on every process
    if accelerator.is_main_process:
        state = None if state is None else {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
        summary.update(save_sft(core.model, tok, run_dir / "final", cfg.save_merged and cfg.lora, state))
        tracker.write_json("summary.json", summary)
    tracker.close()
    return summary


def save_sft(model, tok, out, merged: bool, state_dict: dict | None = None) -> dict:
    """RUN/final: the adapter (LoRA) or full weights + tokenizer; final/merged on request.
    `state_dict`: the full weights when the live ones are sharded (FSDP/ZeRO-3; no merged copy then)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, state_dict=state_dict)
    tok.save_pretrained(out)
    paths = {"final": str(out)}
    if merged and state_dict is None:
        full = copy.deepcopy(model).merge_and_unload()
        full.save_pretrained(out / "merged")
        tok.save_pretrained(out / "merged")
        paths["merged"] = str(out / "merged")
    return paths


def main(argv: list[str]) -> int:
    return config_main(SFTConfig, train, argv, "rlhfkit sft")
