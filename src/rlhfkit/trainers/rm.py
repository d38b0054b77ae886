"""`rlhfkit rm`: train a reward model on preference pairs with the Bradley-Terry loss.

One optimiser step, as numbered steps in `train`:
  1. batch     the next `batch_size` pairs of a seeded stream, reshuffled every epoch
  2. score     per micro-batch: chosen and rejected texts in one forward; the score of each is the
               head applied at its last non-pad token (from the attention mask, docs/pitfalls.md#score-placement)
  3. loss      -log sigma(r_c - r_r - m) (+ center_coef * (r_c + r_r)^2), a mean over the pairs of
               the whole mini-batch, so micro-batching gives the same gradient
  4. step      clip, AdamW (LoRA adapters AND the score head: docs/pitfalls.md#lora-reference), warm-up schedule
  5. evaluate  before training, every `eval_every` steps and at the end, on held-out pairs
  6. log/save  metrics.jsonl; RUN/final = the model as a transformers AutoModelForSequenceClassification
               (causal backbones read at the last token; models/classifier_reward.py) and
               RUN/final/rlhfkit_rm = backbone (adapter or full) + score head + tokenizer +
               rlhfkit_rm.json with the score mean/std on the training responses (for centring);
               a model with no standard form (an encoder, mean pooling) is the rlhfkit form in RUN/final
"""

from __future__ import annotations

import time

import torch

from rlhfkit.algos import bradley_terry_loss
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import format_example, use_chat_template
from rlhfkit.data.prefs import load_preferences, resolve_prefs
from rlhfkit.data.splits import eval_phrase, split_for_eval, subset
from rlhfkit.data.stream import PromptStream
from rlhfkit.models import DEFAULT_MODEL, load_tokenizer, resolve_model_path
from rlhfkit.models.classifier_reward import save_classifier
from rlhfkit.models.loading import hub_reference, set_chat_template, set_gradient_checkpointing
from rlhfkit.models.policy import output_width
from rlhfkit.models.reward_model import (
    RewardModel,
    ScoreHead,
    add_backbone_lora,
    encode_texts,
    load_backbone,
    resolve_pooling,
    save_reward_model,
    score_texts,
    write_form_pointer,
)
from rlhfkit.rewards.scoring import mean_std
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.optim import optimizer_for
from rlhfkit.runtime.run import Launch
from rlhfkit.trainers.offline import OfflineRun
from rlhfkit.trainers.rm_config import RMConfig

__all__ = ["RMConfig", "build_reward_model", "pair_loss", "evaluate_pairs", "rm_gradients", "train"]


# ----------------------------------------------------------------------------- model and data


def build_reward_model(cfg: RMConfig):
    """(RewardModel, tokenizer, info for rlhfkit_rm.json). LoRA keeps the head outside the adapter,
    fully trainable; with LoRA the frozen base is stored in the compute dtype."""
    base_dtype = "bf16" if (cfg.dtype == "bf16" and cfg.lora) else "fp32"
    backbone, causal = load_backbone(cfg.model, base_dtype)
    if cfg.lora:
        backbone = add_backbone_lora(backbone, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules,
                                     cfg.lora_layers)
    else:
        backbone.requires_grad_(True)
    if cfg.gradient_checkpointing:
        set_gradient_checkpointing(backbone)
    torch.manual_seed(cfg.seed)
    head = ScoreHead(output_width(backbone))
    model = RewardModel(backbone, head, causal=causal, pooling=resolve_pooling(cfg.pooling, causal))
    padding_side = "left" if causal else "right"  # encoders have absolute positions and no position_ids here
    tok = set_chat_template(load_tokenizer(cfg.model, padding_side=padding_side), cfg.chat_template_path)
    # a Hub id stays one (resolved from the cache when loaded), not this machine's cache path
    hub = cfg.model == DEFAULT_MODEL or hub_reference(cfg.model) is not None
    base = cfg.model if hub else str(resolve_model_path(cfg.model).resolve())

    # The resolved choice (an error here when chat_template=true and the tokenizer has none).
    info = {"base_model": base, "dtype": cfg.dtype, "chat_template": use_chat_template(tok, cfg.chat_template),
            "system_prompt": cfg.system_prompt, "max_length": cfg.max_length, "add_special_tokens": not causal,
            "padding_side": padding_side, "normalize": cfg.normalize}
    return model, tok, info


def pair_texts(tok, pairs: list[dict], info: dict) -> tuple[list[str], list[str]]:
    """Formatted chosen and rejected texts (the same format the scorer uses at PPO time)."""
    def fmt(r, resp):
        return format_example(tok, r.get("messages") or r["prompt"], resp, info["chat_template"], info["system_prompt"])[1]

    return [fmt(r, r["chosen"]) for r in pairs], [fmt(r, r["rejected"]) for r in pairs]


def pair_margins(pairs: list[dict], cfg: RMConfig, device: torch.device) -> torch.Tensor | None:
    """(B,) margins on `device`: a pair's own 'margin' field (if use_data_margin) else cfg.margin; None if all 0."""
    m = [float(r["margin"]) if cfg.use_data_margin and r.get("margin") is not None else cfg.margin for r in pairs]
    return torch.tensor(m, device=device) if any(x != 0 for x in m) else None


def pair_loss(model, tok, pairs: list[dict], info: dict, cfg: RMConfig, device) -> tuple[torch.Tensor, dict]:
    """Bradley-Terry loss (mean over `pairs`) + optional centring term; chosen/rejected in one forward."""
    chosen, rejected = pair_texts(tok, pairs, info)
    enc = encode_texts(tok, chosen + rejected, cfg.max_length, info["add_special_tokens"])
    with autocast(cfg.dtype, device):
        scores = model(enc["input_ids"].to(device), enc["attention_mask"].to(device))  # (2m,)
    r_c, r_r = scores[: len(pairs)], scores[len(pairs) :]
    loss, m = bradley_terry_loss(r_c, r_r, pair_margins(pairs, cfg, scores.device))
    if cfg.center_coef > 0:
        loss = loss + cfg.center_coef * ((r_c + r_r) ** 2).mean()
    return loss, m


@torch.no_grad()
def evaluate_pairs(model, tok, pairs: list[dict], info: dict, cfg: RMConfig, device) -> dict:
    """Held-out loss, accuracy (strict r_c > r_r), margin and score means, over all `pairs`."""
    chosen, rejected = pair_texts(tok, pairs, info)
    s = score_texts(model, tok, chosen + rejected, 2 * cfg.micro_batch_size, cfg.max_length,
                    info["add_special_tokens"], cfg.dtype)
    r_c, r_r = torch.tensor(s[: len(pairs)], device=HOST), torch.tensor(s[len(pairs) :], device=HOST)
    loss, m = bradley_terry_loss(r_c, r_r, pair_margins(pairs, cfg, HOST))
    return {"loss": loss.item(), **m, "n": len(pairs)}


# ----------------------------------------------------------------------------- loop


def rm_gradients(model, accelerator, tok, batch: list[dict], info: dict, cfg: RMConfig, share: float) -> dict:
    """Steps 2-3 on this process's pairs: the gradients accumulated in `model`; returns the loss and pair
    metrics over all processes. `share` = len(batch) / global batch size. The optimiser step (4) is the
    run's (runtime/run.py `Run.optimizer_step`)."""

    def loss_fn(mb: list[dict]) -> tuple[torch.Tensor, dict[str, float]]:
        loss, m = pair_loss(model, tok, mb, info, cfg, accelerator.device)
        w = len(mb) / len(batch)  # pair mean over the whole mini-batch, whatever the split
        stats = {"loss/rm": loss.item() * w, **{f"rm/{k}": m[k] * w for k in ("accuracy", "margin", "chosen_mean",
                                                                            "rejected_mean")}}
        return loss * len(mb) / cfg.batch_size, stats  # / all processes' pairs

    micros = [batch[m0 : m0 + cfg.micro_batch_size] for m0 in range(0, len(batch), cfg.micro_batch_size)]
    sums = add_up(accumulate(accelerator, model, micros, loss_fn))
    return {k: accelerator.reduce(torch.tensor(v * share, device=accelerator.device), "sum").item()
            for k, v in sums.items()}


def make_rm_optimizer(model, cfg: RMConfig, total_steps: int | None = None):
    """AdamW over the trainable backbone parameters and the score head (its own lr when head_lr is
    set), with the warm-up of runtime/optim.py."""
    groups = [{"params": list(model.backbone.parameters()), "lr": cfg.lr},
              {"params": list(model.head.parameters()), "lr": cfg.head_lr or cfg.lr}]
    return optimizer_for(groups, cfg, total_steps)


def train(cfg: RMConfig) -> dict:
    """Train a reward model; returns the summary (also written to RUN/summary.json)."""
    launch = Launch(cfg)
    # Data and model are checked before the run folder exists: bad input leaves nothing behind.
    eval_spec = resolve_prefs(cfg.eval_data) if cfg.eval_data else None
    train_pairs, eval_pairs, source = split_for_eval(load_preferences, resolve_prefs(cfg.data), eval_spec,
                                                     cfg.eval_fraction, cfg.seed, cfg.eval_split)
    eval_pairs = subset(eval_pairs, cfg.max_eval_pairs, cfg.seed + 1)
    model, tok, info = build_reward_model(cfg)
    steps = cfg.max_steps or cfg.epochs * -(-len(train_pairs) // cfg.batch_size)
    stream = PromptStream(train_pairs, cfg.seed)
    with OfflineRun(launch, "rm", steps, model, *make_rm_optimizer(model, cfg, steps),
                    summary=dict(train_pairs=len(train_pairs), eval_pairs=len(eval_pairs), steps=steps, eval_on=source),
                    stream=stream) as h:

        def evaluate() -> dict:
            return evaluate_pairs(h.core, tok, eval_pairs, info, cfg, h.device)

        if eval_pairs:
            what = eval_phrase(len(eval_pairs), "pairs", source, cfg.eval_fraction)
            h.evaluate_before(evaluate, lambda m: f"[eval] before: accuracy {m['accuracy']:.3f}, loss {m['loss']:.4f} "
                                                  f"({what})")
        for step in h.steps():
            t0 = time.time()
            batch = stream.next(cfg.batch_size)[h.rank :: h.world]  # 1.
            metrics = rm_gradients(h.model, h.accelerator, tok, batch, info, cfg, len(batch) / cfg.batch_size)  # 2-3.
            metrics = h.timed({**metrics, **h.optimizer_step(metrics["loss/rm"], step)}, t0)  # 4.
            ev = h.evaluate_due(step, cfg.eval_every, evaluate) if eval_pairs else {}  # 5.
            if ev:
                metrics.update({"eval/rm_loss": ev["loss"], "eval/rm_accuracy": ev["accuracy"],
                                "eval/rm_margin": ev["margin"]})
            h.log(step, metrics)  # 6.
        h.evaluate_after(lambda m: f"[eval] after:  accuracy {m['accuracy']:.3f}, loss {m['loss']:.4f}")
        h.summary["score_stats"] = score_stats(h.core, tok, train_pairs, info, cfg)
        return h.finish(rm_saver(h, tok, info, cfg))


def score_stats(model, tok, train_pairs: list[dict], info: dict, cfg: RMConfig) -> dict:
    """Normalisation statistics: mean/std of the raw scores of `stats_pairs` training responses under the
    final model; written into `info` (rlhfkit_rm.json) as well."""
    chosen, rejected = pair_texts(tok, subset(train_pairs, cfg.stats_pairs, cfg.seed + 2), info)
    raw = score_texts(model, tok, chosen + rejected, 2 * cfg.micro_batch_size, cfg.max_length,
                      info["add_special_tokens"], info["dtype"])
    mean, std = mean_std(raw)
    info.update({"score_mean": mean, "score_std": std, "stats_responses": len(raw)})
    return {"mean": mean, "std": std, "n": len(raw)}


RLHFKIT_FORM = "rlhfkit_rm"  # RUN/final/<this>: the rlhfkit form beside the standard one in RUN/final


def rm_saver(run, tok, info: dict, cfg: RMConfig):
    """`save(folder, state)`: unsharded, with a standard form (a causal backbone read at its last token),
    `folder` is the transformers AutoModelForSequenceClassification model and the rlhfkit form (backbone
    or adapter + score head, read by `load_reward_model` through folder/rlhfkit_rm.json) lies in
    folder/rlhfkit_rm/; otherwise `folder` is the rlhfkit form alone."""
    def save(folder, state):
        standard = save_classifier(run.core, tok, folder) if state is None else None
        rlhfkit_form = folder / RLHFKIT_FORM if standard else folder
        save_reward_model(run.core, tok, rlhfkit_form, info, merge=cfg.save_merged, state_dict=state)
        if standard:
            write_form_pointer(folder, RLHFKIT_FORM)
        return {"final": str(folder), **({"sequence_classification": str(standard)} if standard else {})}

    return save
