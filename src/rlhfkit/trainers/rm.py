"""`rlhfkit rm`: train a reward model on preference pairs with the Bradley-Terry loss.

One optimiser step, as numbered steps in `train`:
  1. batch     the next `batch_size` pairs of a seeded stream, reshuffled every epoch
  2. score     per micro-batch: chosen and rejected texts in one forward; the score of each is the
               head applied at its last non-pad token (from the attention mask, pitfall 5)
  3. loss      -log sigma(r_c - r_r - m) (+ center_coef * (r_c + r_r)^2), a mean over the pairs of
               the whole mini-batch, so micro-batching gives the same gradient
  4. step      clip, AdamW (LoRA adapters AND the score head: pitfall 14), warm-up schedule
  5. evaluate  before training, every `eval_every` steps and at the end, on held-out pairs
  6. log/save  metrics.jsonl; RUN/final = backbone (adapter or full) + score head + tokenizer +
               rlhfkit_rm.json with the score mean/std on the training responses (for centring)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rlhfkit.algos import bradley_terry_loss
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
from rlhfkit.trainers.common import ModelArgs, PromptStream, RunArgs, autocast, check_optimizer, mean_std


@dataclass
class RMConfig(ModelArgs, RunArgs):
    """Reward model: backbone + scalar head trained with the Bradley-Terry loss on preference pairs."""

    data: str = option("", "preference pairs: a JSONL/CSV/Parquet file or saved `datasets` folder with prompt, "
                       "chosen, rejected (e.g. from `rlhfkit prefs make`)")
    eval_data: str | None = option(None, "held-out pairs (default: records with split=test, else eval_fraction of data)")
    eval_fraction: float = option(0.1, "share of `data` held out when it has no split field and no eval_data")
    max_eval_pairs: int = option(256, "held-out pairs used for evaluation (a seeded subset)")
    epochs: int = option(2, "passes over the training pairs (ignored when max_steps > 0)")
    max_steps: int = option(0, "optimiser steps; 0 = epochs x ceil(pairs / batch_size)")
    batch_size: int = option(16, "pairs per optimiser step (all processes together)")
    micro_batch_size: int = option(8, "pairs per forward/backward (each pair = 2 sequences)")
    max_length: int = option(256, "tokens per formatted prompt + response; longer texts lose their beginning")
    lr: float = option(1e-4, "AdamW learning rate for adapters/backbone (LoRA default; ~1e-5 for full fine-tuning)")
    head_lr: float | None = option(None, "learning rate of the score head (None: lr)")
    warmup_steps: int = option(4, "linear lr warm-up, in optimiser steps")
    weight_decay: float = option(0.0, "AdamW weight decay")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    max_grad_norm: float = option(1.0, "gradient-norm clip threshold")
    margin: float = option(0.0, "constant margin m in -log sigma(r_c - r_r - m)")
    use_data_margin: bool = option(True, "use a pair's own 'margin' field when it has one (Llama 2 style)")
    center_coef: float = option(0.0, "auxiliary loss coef * mean((r_c + r_r)^2) that keeps raw scores centred at 0 "
                                "(Eisenstein et al. 2023); 0 = off")
    normalize: str = option("center", "how the saved scorer maps raw scores: none | center (minus the mean on the "
                            "training responses) | standardize (also divided by their std)",
                            ("none", "center", "standardize"))
    pooling: str = option("auto", "where the score is read: last non-pad token, or the masked mean (auto: last for "
                          "causal LMs, mean for encoders)", ("auto", "last", "mean"))
    stats_pairs: int = option(256, "training pairs scored after training for the normalisation statistics")
    eval_every: int = option(0, "evaluate every N optimiser steps (0 = only before and after training)")
    save_merged: bool = option(False, "save the LoRA backbone merged into full weights instead of an adapter")

    def validate(self) -> None:
        check(bool(self.data), "data: give a preference file, e.g. data=prefs.jsonl (build one with `rlhfkit prefs make`)")
        for k in ("batch_size", "micro_batch_size", "max_length", "epochs", "max_eval_pairs", "stats_pairs"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.max_steps >= 0, f"max_steps ({self.max_steps}) must be >= 0")
        check_optimizer(self)
        check(self.head_lr is None or self.head_lr > 0, f"head_lr ({self.head_lr}) must be > 0")
        check(self.center_coef >= 0, f"center_coef ({self.center_coef}) must be >= 0")
        check(0 <= self.eval_fraction < 1, f"eval_fraction ({self.eval_fraction}) must be in [0, 1)")


# ----------------------------------------------------------------------------- model and data


def build_reward_model(cfg: RMConfig):
    """(RewardModel, tokenizer, info for rlhfkit_rm.json). LoRA keeps the head outside the adapter,
    fully trainable; with LoRA the frozen base is stored in the compute dtype."""
    from rlhfkit.models import DEFAULT_MODEL, load_tokenizer, resolve_model_path
    from rlhfkit.models.reward_model import (
        RewardModel,
        ScoreHead,
        add_backbone_lora,
        load_backbone,
        resolve_pooling,
    )

    base_dtype = "bf16" if (cfg.dtype == "bf16" and cfg.lora) else "fp32"
    backbone, causal = load_backbone(cfg.model, base_dtype)
    if cfg.lora:
        backbone = add_backbone_lora(backbone, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules,
                                     cfg.lora_layers)
    else:
        backbone.requires_grad_(True)
    if cfg.gradient_checkpointing:
        from rlhfkit.models.loading import set_gradient_checkpointing

        set_gradient_checkpointing(backbone)
    torch.manual_seed(cfg.seed)
    head = ScoreHead(backbone.config.hidden_size)
    model = RewardModel(backbone, head, causal=causal, pooling=resolve_pooling(cfg.pooling, causal))
    padding_side = "left" if causal else "right"  # encoders have absolute positions and no position_ids here
    tok = load_tokenizer(cfg.model, padding_side=padding_side)
    base = cfg.model if cfg.model == DEFAULT_MODEL else str(resolve_model_path(cfg.model).resolve())
    from rlhfkit.data.chat import use_chat_template

    # The resolved choice (an error here when chat_template=true and the tokenizer has none).
    info = {"base_model": base, "dtype": cfg.dtype, "chat_template": use_chat_template(tok, cfg.chat_template),
            "system_prompt": cfg.system_prompt, "max_length": cfg.max_length, "add_special_tokens": not causal,
            "padding_side": padding_side, "normalize": cfg.normalize}
    return model, tok, info


def pair_texts(tok, pairs: list[dict], info: dict) -> tuple[list[str], list[str]]:
    """Formatted chosen and rejected texts (the same format the scorer uses at PPO time)."""
    from rlhfkit.models.reward_model import format_example

    def fmt(r, resp):
        return format_example(tok, r.get("messages") or r["prompt"], resp, info["chat_template"], info["system_prompt"])[1]

    return [fmt(r, r["chosen"]) for r in pairs], [fmt(r, r["rejected"]) for r in pairs]


def pair_margins(pairs: list[dict], cfg: RMConfig) -> torch.Tensor | None:
    """(B,) margins: a pair's own 'margin' field (if use_data_margin) else cfg.margin; None if all 0."""
    m = [float(r["margin"]) if cfg.use_data_margin and r.get("margin") is not None else cfg.margin for r in pairs]
    return torch.tensor(m) if any(x != 0 for x in m) else None


def pair_loss(model, tok, pairs: list[dict], info: dict, cfg: RMConfig, device) -> tuple[torch.Tensor, dict]:
    """Bradley-Terry loss (mean over `pairs`) + optional centring term; chosen/rejected in one forward."""
    from rlhfkit.models.reward_model import encode_texts

    chosen, rejected = pair_texts(tok, pairs, info)
    enc = encode_texts(tok, chosen + rejected, cfg.max_length, info["add_special_tokens"])
    with autocast(cfg.dtype, device):
        scores = model(enc["input_ids"].to(device), enc["attention_mask"].to(device))  # (2m,)
    r_c, r_r = scores[: len(pairs)], scores[len(pairs) :]
    margin = pair_margins(pairs, cfg)
    loss, m = bradley_terry_loss(r_c, r_r, None if margin is None else margin.to(device))
    if cfg.center_coef > 0:
        loss = loss + cfg.center_coef * ((r_c + r_r) ** 2).mean()
    return loss, m


@torch.no_grad()
def evaluate_pairs(model, tok, pairs: list[dict], info: dict, cfg: RMConfig, device) -> dict:
    """Held-out loss, accuracy (strict r_c > r_r), margin and score means, over all `pairs`."""
    from rlhfkit.models.reward_model import score_texts

    chosen, rejected = pair_texts(tok, pairs, info)
    s = score_texts(model, tok, chosen + rejected, 2 * cfg.micro_batch_size, cfg.max_length,
                    info["add_special_tokens"], cfg.dtype)
    r_c, r_r = torch.tensor(s[: len(pairs)]), torch.tensor(s[len(pairs) :])
    loss, m = bradley_terry_loss(r_c, r_r, pair_margins(pairs, cfg))
    return {"loss": loss.item(), **m, "n": len(pairs)}


# ----------------------------------------------------------------------------- loop


def rm_step(model, optimizer, scheduler, accelerator, tok, batch: list[dict], info: dict, cfg: RMConfig,
            share: float, *, guard=None, where: str = "") -> dict:
    """Steps 2-4 on this process's pairs; `share` = len(batch) / global batch size. A non-finite loss
    or gradient norm skips the optimiser step (rlhfkit.runtime.faults.guarded_step)."""
    sums = {"loss/rm": 0.0, "rm/accuracy": 0.0, "rm/margin": 0.0, "rm/chosen_mean": 0.0, "rm/rejected_mean": 0.0}
    for m0 in range(0, len(batch), cfg.micro_batch_size):
        mb = batch[m0 : m0 + cfg.micro_batch_size]
        loss, m = pair_loss(model, tok, mb, info, cfg, accelerator.device)
        w = len(mb) / len(batch)  # pair mean over the whole mini-batch, whatever the split
        accumulate_backward(accelerator, model, loss * len(mb) / cfg.batch_size,  # / all processes' pairs
                            sync=m0 + cfg.micro_batch_size >= len(batch))
        sums["loss/rm"] += loss.item() * w
        for k in ("accuracy", "margin", "chosen_mean", "rejected_mean"):
            sums[f"rm/{k}"] += m[k] * w
    grad_norm, skipped = guarded_step(model.parameters(), optimizer, scheduler, accelerator, cfg.max_grad_norm,
                                      loss=sums["loss/rm"], guard=guard, where=where)
    out = {k: accelerator.reduce(torch.tensor(v * share, device=accelerator.device), "sum").item()
           for k, v in sums.items()}
    out.update({"params/grad_norm": grad_norm, "params/lr": scheduler.get_last_lr()[0],
                "params/skipped_steps": float(skipped)})
    return out


def make_rm_optimizer(model, cfg: RMConfig):
    """AdamW over the trainable backbone parameters and the score head (its own lr when head_lr is
    set), with the linear warm-up of `make_optimizer`."""
    backbone = [p for p in model.backbone.parameters() if p.requires_grad]
    groups = [{"params": backbone, "lr": cfg.lr}, {"params": list(model.head.parameters()), "lr": cfg.head_lr or cfg.lr}]
    opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    warm = max(1, cfg.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warm))
    return opt, sched


def train(cfg: RMConfig) -> dict:
    """Train a reward model; returns the summary (also written to RUN/summary.json)."""
    from accelerate import Accelerator

    from rlhfkit.data.prefs import load_preferences
    from rlhfkit.models.loading import resolve_dtype
    from rlhfkit.models.reward_model import save_reward_model, score_texts
    from rlhfkit.trainers.sft import subset, train_eval_split

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    seed_everything(cfg.seed)
    tune_malloc()  # freed CPU tensors stay in the process for reuse (runtime/allocator.py)
    cfg.dtype = resolve_dtype(cfg.dtype)  # 'auto' -> bf16 where bf16 matmuls are fast, else fp32
    # Data and model are checked before the run folder exists: bad input leaves nothing behind.
    train_pairs, eval_pairs = train_eval_split(load_preferences, cfg.data, cfg.eval_data, cfg.eval_fraction, cfg.seed)
    eval_pairs = subset(eval_pairs, cfg.max_eval_pairs, cfg.seed + 1)
    model, tok, info = build_reward_model(cfg)
    W, rank = accelerator.num_processes, accelerator.process_index
    check(cfg.batch_size % W == 0, f"batch_size ({cfg.batch_size}) must be divisible by the {W} processes")
    steps = cfg.max_steps or cfg.epochs * -(-len(train_pairs) // cfg.batch_size)
    agree_on_run_name(accelerator, cfg, "rm")
    run_dir, resume_from = open_run_dir(cfg, "rm")
    if accelerator.is_main_process:
        save_config(cfg, run_dir / "config.yaml")
    tracker = Tracker(run_dir, steps, cfg.quiet, accelerator.is_main_process, cfg.tensorboard, cfg.wandb)
    optimizer, scheduler = make_rm_optimizer(model, cfg)
    configure_deepspeed(accelerator, cfg.micro_batch_size, cfg.max_grad_norm)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    core = accelerator.unwrap_model(model)
    device = accelerator.device
    stream = PromptStream(train_pairs, cfg.seed)
    summary: dict = {"run_dir": str(run_dir), "train_pairs": len(train_pairs), "eval_pairs": len(eval_pairs),
                     "steps": steps}
    guard = NonFiniteGuard.for_config(cfg, tracker.print)
    ckpt = Checkpointer(cfg, run_dir, "rm", accelerator, tracker, model=core, optimizer=optimizer,
                        scheduler=scheduler, objects={"stream": stream, "summary": summary}, guard=guard,
                        unit="step", total=steps)
    ckpt.resume(resume_from)  # when resuming: weights, optimiser, data position, RNG, before-eval
    if eval_pairs:
        if "eval_before" not in summary:
            summary["eval_before"] = evaluate_pairs(core, tok, eval_pairs, info, cfg, device)
        tracker.print(f"[eval] before: accuracy {summary['eval_before']['accuracy']:.3f}, "
                      f"loss {summary['eval_before']['loss']:.4f} ({len(eval_pairs)} pairs)")
    model.train()
    with ckpt.signals:
        for step in range(ckpt.start, steps):
            t0 = time.time()
            batch = stream.next(cfg.batch_size)[rank::W]  # 1.
            metrics = rm_step(model, optimizer, scheduler, accelerator, tok, batch, info, cfg,
                              len(batch) / cfg.batch_size, guard=guard, where=f"step {step}")
            metrics["timing/step_s"] = time.time() - t0
            if eval_pairs and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step == steps - 1):
                ev = evaluate_pairs(core, tok, eval_pairs, info, cfg, device)  # 5.
                metrics.update({"eval/rm_loss": ev["loss"], "eval/rm_accuracy": ev["accuracy"],
                                "eval/rm_margin": ev["margin"]})
                summary["eval_after"] = ev
            tracker.log(step, metrics)  # 6.
            ckpt.end_step(step)  # checkpoint when due or asked to stop
    ckpt.finish(steps)
    if "eval_after" in summary:
        tracker.print(f"[eval] after:  accuracy {summary['eval_after']['accuracy']:.3f}, "
                      f"loss {summary['eval_after']['loss']:.4f}")
    # Normalisation statistics: raw scores of training responses under the final model.
    stats = subset(train_pairs, cfg.stats_pairs, cfg.seed + 2)
    chosen, rejected = pair_texts(tok, stats, info)
    raw = score_texts(core, tok, chosen + rejected, 2 * cfg.micro_batch_size, cfg.max_length,
                      info["add_special_tokens"], info["dtype"])
    mean, std = mean_std(raw)
    info.update({"score_mean": mean, "score_std": std, "stats_responses": len(raw)})
    summary["score_stats"] = {"mean": mean, "std": std, "n": len(raw)}
    state = full_state_dict(accelerator, model)  # FSDP / ZeRO-3: gathered on every process
    if accelerator.is_main_process:
        save_reward_model(core, tok, run_dir / "final", info, merge=cfg.save_merged, state_dict=state)
        summary["final"] = str(run_dir / "final")
        tracker.write_json("summary.json", summary)
    tracker.close()
    return summary


def main(argv: list[str]) -> int:
    return config_main(RMConfig, train, argv, "rlhfkit rm")
