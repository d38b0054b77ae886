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
from functools import partial

import torch

from rlhfkit.algos import aggregate_loss
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import IGNORE_INDEX, format_example
from rlhfkit.data.sft import collate, load_sft_examples, pack_examples, tokenize_examples
from rlhfkit.data.splits import eval_phrase, split_for_eval, subset
from rlhfkit.data.stream import PromptStream
from rlhfkit.errors import UserError
from rlhfkit.models.loading import save_tokenizer
from rlhfkit.models.response_nll import ResponseNLL, mean_nll
from rlhfkit.rewards.rouge import rouge_scores
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.logprobs import chunk_positions
from rlhfkit.rollout.texts import generate_texts
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.optim import optimizer_for
from rlhfkit.runtime.run import Launch
from rlhfkit.trainers.build import build_policy
from rlhfkit.trainers.offline import OfflineRun
from rlhfkit.trainers.sft_config import SFTConfig

__all__ = ["ResponseNLL", "SFTConfig", "mean_nll", "sft_gradients", "train"]


# ----------------------------------------------------------------------------- loss


def rouge_of_responses(model, tok, rows: list[dict], cfg: SFTConfig) -> dict[str, float]:
    """ROUGE-1/2/L F1 (rlhfkit.rewards.rouge.rouge_scores) of the model's greedy responses to the held-out
    prompts against their reference responses; the same prompts and text format as training."""
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


def sft_gradients(module, accelerator, batch: list[dict], pad_id: int, cfg: SFTConfig) -> dict:
    """Steps 2-4 for one mini-batch (this process's share): the gradients accumulated in `module`;
    returns loss/sft (summed over the processes) and the step's response tokens. The optimiser step
    (5) is the run's (runtime/run.py `Run.optimizer_step`)."""
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
    loss_all = accelerator.reduce(torch.tensor(loss_sum, device=device), "sum").item()
    return {"loss/sft": loss_all, "tokens": n_tok}


def train(cfg: SFTConfig) -> dict:
    """Run SFT; returns the summary (also written to RUN/summary.json)."""
    launch = Launch(cfg)
    # Data and model are checked before the run folder exists: bad input leaves nothing behind.
    train_ex, eval_ex, eval_rows, model, tok, notes, eval_on = sft_data_and_model(cfg)
    steps = cfg.max_steps or cfg.epochs * math.ceil(len(train_ex) / cfg.batch_size)
    stream = PromptStream(train_ex, cfg.seed)
    with OfflineRun(launch, "sft", steps, ResponseNLL(model), *optimizer_for(model.parameters(), cfg, steps),
                    summary=dict(train_examples=len(train_ex), eval_examples=len(eval_ex), steps=steps, eval_on=eval_on),
                    stream=stream) as h:
        for line in notes:
            h.print(line)
        rouge_rows = [r for r in eval_rows if r["prompt"] != ""][: cfg.rouge_examples]  # text records: no reference

        def evaluate(with_rouge: bool = False) -> dict:  # 6.
            stats = eval_stats(h.core, eval_ex, tok.pad_token_id, cfg, h.device)
            if with_rouge and rouge_rows:
                with h.full_weights():
                    stats.update(rouge_of_responses(h.core.model, tok, rouge_rows, cfg))
            return stats

        if eval_ex:
            h.evaluate_before(lambda: evaluate(with_rouge=True), lambda m: f"[eval] before: loss {m['loss']:.4f}, "
                              f"perplexity {m['perplexity']:.2f} ({len(eval_ex)} examples){rouge_text(m)}")
        for step in h.steps():
            t0 = time.time()
            batch = stream.next(cfg.batch_size)[h.rank :: h.world]  # 1. this process's share
            metrics = sft_gradients(h.model, h.accelerator, batch, tok.pad_token_id, cfg)  # 2-4.
            metrics = h.timed({**metrics, **h.optimizer_step(metrics["loss/sft"], step)}, t0)  # 5.
            ev = h.evaluate_due(step, cfg.eval_every, partial(evaluate, with_rouge=step == steps - 1)) if eval_ex else {}
            metrics.update({f"eval/{k}": ev[k] for k in ("loss", "perplexity", "rouge_1", "rouge_2", "rouge_l") if k in ev})
            h.log(step, metrics)  # 7.
        h.evaluate_after(lambda m: f"[eval] after:  loss {m['loss']:.4f}, perplexity {m['perplexity']:.2f}{rouge_text(m)}")

        def save(folder, state):  # state: gathered weights of the wrapped module (FSDP / ZeRO-3)
            state = None if state is None else {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
            return save_sft(h.core.model, tok, folder, cfg.save_merged and cfg.lora, state)

        return h.finish(save)


def sft_data_and_model(cfg: SFTConfig) -> tuple:
    """(training examples (packed when asked), eval examples, eval rows, model, tokenizer, lines to print
    once the run is open, what the evaluation runs on: data/splits.py split_for_eval's held-out /
    held-back / training)."""
    train_rows, eval_rows, source = split_for_eval(load_sft_examples, cfg.data, cfg.eval_data, cfg.eval_fraction,
                                                   cfg.seed, cfg.eval_split)
    train_rows = subset(train_rows, cfg.max_train_examples, cfg.seed)
    eval_rows = subset(eval_rows if source != "training" else train_rows, cfg.max_eval_examples, cfg.seed + 1)
    model, tok = build_policy(cfg)
    train_ex, dropped = tokenize_examples(tok, train_rows, cfg, cfg.max_length)
    eval_ex, _ = tokenize_examples(tok, eval_rows, cfg, cfg.max_length)
    if not train_ex:
        raise UserError(f"data: every example of {cfg.data} lost its response to max_length={cfg.max_length}")
    notes = [f"[sft] dropped {dropped} examples whose response did not fit in max_length={cfg.max_length}"] if dropped else []
    if eval_ex:
        notes.append(f"[eval] on {eval_phrase(len(eval_ex), 'examples', source, cfg.eval_fraction)}")
    if cfg.packing:
        n_examples, train_ex = len(train_ex), pack_examples(train_ex, cfg.max_length)
        notes.append(f"[sft] packed {n_examples} examples into {len(train_ex)} rows of up to {cfg.max_length} tokens")
    return train_ex, eval_ex, eval_rows, model, tok, notes, source


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
    save_tokenizer(tok, out)
    paths = {"final": str(out)}
    if merged and state_dict is None:
        full = copy.deepcopy(model).merge_and_unload()
        full.save_pretrained(out / "merged")
        save_tokenizer(tok, out / "merged")
        paths["merged"] = str(out / "merged")
    return paths
