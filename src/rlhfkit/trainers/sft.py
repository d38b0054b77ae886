"""`rlhfkit sft`: supervised fine-tuning (LoRA or full) with the loss on response tokens only.

One optimiser step, as numbered steps in `train`:
  1. batch     the next `batch_size` examples of a seeded stream, reshuffled every epoch
               (each process takes its share)
  2. count     response tokens of the whole mini-batch: all micro-batches, all processes
  3. forward   per micro-batch: NLL of every response token; prompt tokens are labelled -100
               and carry no loss (label masking)
  4. backward  sum(NLL) / (mini-batch token count): the global token mean (docs/pitfalls.md#loss-aggregation), so
               splitting into micro-batches gives the same gradient
  5. step      clip, AdamW, warm-up schedule
  6. evaluate  before training, every `eval_every` steps and at the end: eval/loss, eval/perplexity;
               before and after: ROUGE-1/2/L of greedy responses to held-out prompts
  7. log/save  metrics.jsonl, summary.json; RUN/final (adapter or full weights), RUN/final/merged
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn

from rlhfkit.algos import aggregate_loss, logprobs_from_logits
from rlhfkit.core.config import check, config_main
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import IGNORE_INDEX
from rlhfkit.data.sft import collate
from rlhfkit.errors import UserError
from rlhfkit.rollout.logprobs import chunk_positions
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.faults import guarded_step
from rlhfkit.runtime.run import Run, closes_its_runs
from rlhfkit.trainers.sft_config import SFTConfig

__all__ = ["ResponseNLL", "SFTConfig", "mean_nll", "sft_step", "train"]


# ----------------------------------------------------------------------------- loss


class ResponseNLL(nn.Module):
    """Per-token negative log-likelihood of the labelled (response) tokens.

    forward(input_ids, attention_mask, labels[, position_ids]) -> (nll (B, L-1), mask (B, L-1));
    position t predicts token t+1, and the LM head runs only where a label exists (prompt logits
    are never computed). Packed rows give `position_ids` that restart per example and no mask:
    transformers then lets each example attend only to itself. Wrapping the model in one module
    lets Accelerate/DDP see the forward.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, labels, position_ids=None):
        from rlhfkit.models.policy import output_logits
        from rlhfkit.models.trunk import position_ids_from_mask

        get_base = getattr(self.model, "get_base_model", None)
        lm = get_base() if callable(get_base) else self.model  # LoRA layers stay injected
        if position_ids is not None:  # packed: the restarts of position_ids mark the examples
            attention_mask = None
        else:
            position_ids = position_ids_from_mask(attention_mask)
        hidden = lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  use_cache=False).last_hidden_state[:, :-1]  # (B, L-1, H)
        targets = labels[:, 1:]  # (B, L-1)
        mask = targets != IGNORE_INDEX
        logits = output_logits(lm, hidden[mask])  # (N, V), N labelled tokens
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


def rouge_of_responses(model, tok, rows: list[dict], cfg: SFTConfig) -> dict[str, float]:
    """ROUGE-1/2/L F1 (rlhfkit.commands.evaluate.rouge_scores) of the model's greedy responses to the held-out
    prompts against their reference responses; the same prompts and text format as training."""
    from rlhfkit.commands.evaluate import rouge_scores
    from rlhfkit.data.chat import format_example
    from rlhfkit.rollout import SamplingParams
    from rlhfkit.rollout.texts import generate_texts

    formatted = [format_example(tok, r["prompt"], "", cfg.chat_template, cfg.system_prompt)[0] for r in rows]
    params = SamplingParams(cfg.rouge_max_new_tokens, 0.0, 0, 1.0, (tok.eos_token_id,), None)
    device = next(model.parameters()).device
    # greedy: no draws; fork_rng keeps generate_texts' seeding out of training's RNG stream (LoRA dropout)
    with torch.random.fork_rng(devices=[]), autocast(cfg.dtype, device):
        texts = generate_texts(model, tok, formatted, params, cfg.seed, cfg.micro_batch_size * 4)
    return rouge_scores(texts, [r["response"] for r in rows])


def eval_stats(module, examples, pad_id, cfg, device) -> dict:
    loss, n = mean_nll(module, examples, pad_id, cfg.micro_batch_size, cfg.dtype, device)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": n}


# ----------------------------------------------------------------------------- loop


def example_chunks(micro: list[dict], device, budget: int) -> list[tuple[list[dict], int]]:
    """(chunk, width) pairs: a micro-batch's examples in the fewest near-equal contiguous chunks of at
    most `budget` tokens (rows x the micro-batch's longest example, `width`) on the CPU, as the
    RL and preference trainers cut theirs (rollout/logprobs.py); whole elsewhere. The loss is a sum
    over tokens divided by the step's count, so the chunks' gradients add up to the micro-batch's."""
    width = max(len(e["input_ids"]) for e in micro)
    limit = chunk_positions(device, budget)
    k = 1 if limit is None else min(len(micro), -(-len(micro) * width // limit))
    return [(micro[int(i[0]) : int(i[-1]) + 1], width) for i in torch.arange(len(micro), device=HOST).tensor_split(max(k, 1))]


def sft_step(module, optimizer, scheduler, accelerator, batch: list[dict], pad_id: int, cfg: SFTConfig, *,
             guard=None, where: str = "") -> dict:
    """Steps 2-5 for one mini-batch (this process's share); returns loss and grad norm. A non-finite
    loss or gradient norm skips the optimiser step (rlhfkit.runtime.faults.guarded_step)."""
    device = accelerator.device
    n_tok = accelerator.reduce(torch.tensor(sum(sum(x != IGNORE_INDEX for x in e["labels"][1:]) for e in batch),
                                            device=device, dtype=torch.float32), "sum").item()

    def loss_fn(chunk: tuple[list[dict], int]) -> tuple[torch.Tensor, dict[str, float]]:
        b = {k: v.to(device) for k, v in collate(chunk[0], pad_id, chunk[1]).items()}
        with autocast(cfg.dtype, device):
            nll, mask = module(**b)
        loss = aggregate_loss(nll, mask, num_tokens=max(n_tok, 1.0))  # / all processes' tokens
        return loss, {"loss/sft": loss.item()}

    micros = [batch[m0 : m0 + cfg.micro_batch_size] for m0 in range(0, len(batch), cfg.micro_batch_size)]
    chunks = [(c, width) for micro in micros for c, width in example_chunks(micro, device, cfg.cpu_chunk_positions)]
    loss_sum = add_up(accumulate(accelerator, module, chunks, loss_fn)).get("loss/sft", 0.0)
    grad_norm, skipped = guarded_step(module.parameters(), optimizer, scheduler, accelerator, cfg.max_grad_norm,
                                      loss=loss_sum, guard=guard, where=where)
    loss_all = accelerator.reduce(torch.tensor(loss_sum, device=device), "sum").item()
    return {"loss/sft": loss_all, "params/grad_norm": grad_norm, "params/lr": scheduler.get_last_lr()[0],
            "params/skipped_steps": float(skipped), "tokens": n_tok}


@closes_its_runs
def train(cfg: SFTConfig) -> dict:
    """Run SFT; returns the summary (also written to RUN/summary.json)."""
    from rlhfkit.data.sft import load_sft_examples, pack_examples, tokenize_examples
    from rlhfkit.data.splits import subset, train_eval_split
    from rlhfkit.data.stream import PromptStream
    from rlhfkit.runtime.optim import optimizer_for
    from rlhfkit.trainers.build import build_policy

    run = Run(cfg, "sft")
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
    n_examples = len(train_ex)
    if cfg.packing:
        train_ex = pack_examples(train_ex, cfg.max_length)
    check(cfg.batch_size % run.world == 0, f"batch_size ({cfg.batch_size}) must be divisible by the {run.world} processes")
    steps = cfg.max_steps or cfg.epochs * math.ceil(len(train_ex) / cfg.batch_size)
    run.open(total=steps, unit="step", train_examples=len(train_ex), eval_examples=len(eval_ex), steps=steps)
    if dropped:
        run.print(f"[sft] dropped {dropped} examples whose response did not fit in max_length={cfg.max_length}")
    if cfg.packing:
        run.print(f"[sft] packed {n_examples} examples into {len(train_ex)} rows of up to {cfg.max_length} tokens")
    optimizer, scheduler = optimizer_for(model.parameters(), cfg, steps)
    stream = PromptStream(train_ex, cfg.seed)
    module = run.prepare(ResponseNLL(model), optimizer, scheduler, cfg.micro_batch_size, stream=stream)
    run.resume()  # when resuming: weights, optimiser, data position, RNG, before-eval

    rouge_rows = [r for r in eval_rows if r["prompt"] != ""][: cfg.rouge_examples]  # text records have no reference

    def evaluate(with_rouge: bool = False) -> dict:
        stats = eval_stats(run.core, eval_ex, pad_id, cfg, run.device)
        if with_rouge and rouge_rows:
            with run.full_weights():
                stats.update(rouge_of_responses(run.core.model, tok, rouge_rows, cfg))
        return stats

    if eval_ex:
        before = run.once("eval_before", lambda: evaluate(with_rouge=True))
        run.print(f"[eval] before: loss {before['loss']:.4f}, perplexity {before['perplexity']:.2f} "
                  f"({len(eval_ex)} examples){rouge_text(before)}")
    for step in run.steps():
        t0 = time.time()
        batch = stream.next(cfg.batch_size)[run.rank :: run.world]  # 1. this process's share
        metrics = sft_step(module, run.optimizer, run.scheduler, run.accelerator, batch, pad_id, cfg,
                           guard=run.guard, where=f"step {step}")  # 2-5.
        metrics["timing/step_s"] = time.time() - t0
        if eval_ex and run.eval_due(step, cfg.eval_every):
            ev = run.summary["eval_after"] = evaluate(with_rouge=step == steps - 1)  # 6.
            metrics.update({f"eval/{k}": ev[k] for k in ("loss", "perplexity", "rouge_1", "rouge_2", "rouge_l")
                            if k in ev})
        run.log(step, metrics)  # 7.
    if "eval_after" in run.summary:
        after = run.summary["eval_after"]
        run.print(f"[eval] after:  loss {after['loss']:.4f}, perplexity {after['perplexity']:.2f}{rouge_text(after)}")

    def save(folder, state):  # state: gathered weights of the wrapped module (FSDP / ZeRO-3)
        state = None if state is None else {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
        return save_sft(run.core.model, tok, folder, cfg.save_merged and cfg.lora, state)

    return run.finish(save)


def rouge_text(stats: dict) -> str:
    """", ROUGE-1/2/L a/b/c (n responses)" when the evaluation scored responses, else ""."""
    if "rouge_l" not in stats:
        return ""
    return f", ROUGE-1/2/L {stats['rouge_1']:.3f}/{stats['rouge_2']:.3f}/{stats['rouge_l']:.3f}"


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
