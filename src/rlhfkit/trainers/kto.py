"""`rlhfkit kto`: Kahneman-Tversky optimisation on unpaired desirable / undesirable completions
(Ethayarajh et al. 2024).

As numbered steps in `train`:
  1. data       examples (prompt, completion, label) -> one table of 2N rows: example i (row i), and the
                mismatched row N + i (prompt i, the completion of example partner(i), the next example in
                a seeded shuffle) whose log-ratio estimates KL(pi || pi_ref)
  2. reference  log pi_ref of all 2N rows, once before training when the run sees every example at
                least once (else alongside each micro-batch; LoRA: the adapter-disabled base)
  3. before     the starting model's samples on held-out prompts, scored by the judge
  4. train      per optimiser batch: z_0 = max(0, mean log-ratio of the batch's mismatched rows) without
                gradient, over the whole batch (all micro-batches and processes), then the KTO loss of
                its examples (algos.kto_loss) summed and divided by the batch size, in micro-batches
  5. after      held-out implicit rewards, and the judged win rate over the starting model

Pairs (prompt, chosen, rejected) are accepted too: each gives a desirable and an undesirable example.
Set-up, the optimiser step, the judged evaluation and the save are the offline harness's
(trainers/offline.py); tables, batches and log-probs are the preference trainers' (trainers/pairs.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rlhfkit.algos import kto_loss, kto_reference_point
from rlhfkit.core.devices import HOST
from rlhfkit.data.prefs import load_pairs, resolve_prefs
from rlhfkit.data.prompts import prompt_record
from rlhfkit.data.readers import missing_field
from rlhfkit.data.sets import load_split
from rlhfkit.data.sft import response_text
from rlhfkit.errors import DataError
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.logprobs import micro_batch_chunks
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.distributed import sum_over_processes
from rlhfkit.runtime.optim import optimizer_for
from rlhfkit.runtime.run import Launch
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.judged import eval_records
from rlhfkit.trainers.kto_config import KTOConfig
from rlhfkit.trainers.offline import OfflineRun, preference_models
from rlhfkit.trainers.pairs import (
    all_row_chunks,
    check_prompt_lengths,
    encode_rows,
    plan_batches,
    reference_logps,
    row_reference_table,
    sequence_logps,
    should_precompute,
)

LABELS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

# ----------------------------------------------------------------------------- data


def parse_label(value, where: str) -> bool:
    """A record's `label`: true/false, 1/0 or yes/no (CSV cells are text)."""
    if isinstance(value, bool):
        return value
    key = str(value).strip().lower()
    if key not in LABELS:
        raise DataError(f"{where}: field 'label' must be true or false (desirable or not), got {value!r}")
    return LABELS[key]


def unpaired_record(record: dict, where: str) -> dict:
    """prompt (as prompt files read it), completion text, label bool."""
    out = prompt_record(record, where)
    for name in ("completion", "label"):
        if record.get(name) is None:
            raise missing_field(where, record, (name,))
    out["completion"] = response_text(record["completion"], "completion", where)
    out["label"] = parse_label(record["label"], where)
    return out


def unpair(pairs: list[dict]) -> list[dict]:
    """Each pair's chosen completion as a desirable example, then each rejected one as undesirable."""
    base = [{k: v for k, v in p.items() if k not in ("chosen", "rejected")} for p in pairs]
    return ([{**b, "completion": p["chosen"], "label": True} for b, p in zip(base, pairs)]
            + [{**b, "completion": p["rejected"], "label": False} for b, p in zip(base, pairs)])


def load_examples(spec: str, eval_split: str = "test") -> tuple[list[dict], list[dict]]:
    """(training examples, held-out examples): records whose split is `eval_split` are held out."""
    path = resolve_prefs(spec)
    records = load_split(path, None)
    if records and "chosen" in records[0]:
        train, held = load_pairs(spec, eval_split)
        return unpair(train), unpair(held)
    has_split = any("split" in r for r in records)

    def read(split: str | None) -> list[dict]:
        try:
            part = load_split(path, split)
        except DataError:
            return []
        return [unpaired_record(r, part.where(i)) for i, r in enumerate(part)]

    train = read("train" if has_split else None)
    if len(train) < 2:
        raise DataError(f"{spec}: KTO needs at least 2 training examples, found {len(train)}")
    return train, read(eval_split) if has_split else []


def load_held_examples(spec: str) -> list[dict]:
    """Every example of `spec` (eval_data): its training and held-out records alike."""
    train, held = load_examples(spec)
    return train + held


def kl_partners(n: int, seed: int) -> torch.Tensor:
    """(n,) partner(i): the next example after i in a seeded shuffle (a cycle, never i itself for n > 1)."""
    perm = torch.randperm(n, generator=torch.Generator(device=HOST).manual_seed(seed), device=HOST)
    partner = torch.empty(n, dtype=torch.long, device=HOST)
    partner[perm] = perm.roll(-1)
    return partner


def encode_examples(tok, examples: list[dict], cfg: KTOConfig, seed: int) -> Rollout:
    """2N rows: the examples, then their mismatched rows (prompt i, completion of partner(i))."""
    partner = kl_partners(len(examples), seed).tolist()
    completions = [e["completion"] for e in examples]
    return encode_rows(tok, examples + examples, completions + [completions[j] for j in partner], cfg, "a completion")


# ----------------------------------------------------------------------------- loss


def micro_chunks(rows: torch.Tensor, data: Rollout, cfg: KTOConfig, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(chunk, micro-batch) pairs of `rows` (rollout/logprobs.py `micro_batch_chunks`): bounded activations
    on the CPU; the loss is a sum over rows, so chunks add up to the micro-batch."""
    return micro_batch_chunks(rows, cfg.micro_batch_size, data, device, cfg.cpu_chunk_positions)


def reference_rows(reference, data: Rollout, cfg: KTOConfig, device,
                   table: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    """(rows, columns=None) -> the rows' reference log-probs (on the CPU): from the precomputed `table`,
    else computed now with the micro-batch `columns` (as sequence_logps is)."""
    if table is not None:
        return lambda rows, columns=None: table[rows]
    return lambda rows, columns=None: reference_logps(reference, data, rows, cfg, device, columns).cpu()


def reference_point(model, data: Rollout, local: torch.Tensor, ref: Callable, cfg: KTOConfig, accelerator) -> float:
    """z_0 of one optimiser batch: its mismatched rows' mean log-ratio over all processes, clamped at 0."""
    n = data.response_ids.shape[0] // 2
    total = 0.0
    with torch.no_grad():
        for rows, columns in micro_chunks(local + n, data, cfg, accelerator.device):
            logps, _ = sequence_logps(model, data, rows, cfg, accelerator.device, columns)
            total += (logps.cpu() - ref(rows, columns)).sum().item()
    sums = sum_over_processes(accelerator, {"kl_sum": total, "count": float(len(local))})
    return kto_reference_point(sums["kl_sum"], sums["count"])


def kto_batch_metrics(sums: dict[str, float], z0: float) -> dict[str, float]:
    """Means over the batch from summed micro-batch metrics."""
    chosen = sums["rewards/chosen"] / max(sums["count/chosen"], 1.0)
    rejected = sums["rewards/rejected"] / max(sums["count/rejected"], 1.0)
    return {"loss/kto": sums.get("loss/kto", 0.0), "rewards/chosen": chosen, "rewards/rejected": rejected,
            "rewards/margin": chosen - rejected, "params/kl_reference_point": z0,
            "data/desirable_fraction": sums["count/chosen"] / max(sums["count/chosen"] + sums["count/rejected"], 1.0)}


def train_step(model, data: Rollout, batch: torch.Tensor, ref: Callable, desirable: torch.Tensor, cfg: KTOConfig,
               accelerator) -> dict[str, float]:
    """Gradients of one optimiser batch (this process's share, in micro-batches); returns metrics.
    `ref(rows)`: the reference log-probs of table rows (`reference_rows`)."""
    device, world = accelerator.device, accelerator.num_processes
    local = batch[accelerator.process_index :: world]
    z0 = reference_point(model, data, local, ref, cfg, accelerator)

    def loss_fn(chunk: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        idx, columns = chunk
        logps, _ = sequence_logps(model, data, idx, cfg, device, columns)
        losses, st = kto_loss(logps, ref(idx, columns).to(device), desirable[idx].to(device), z0, cfg.beta,
                              cfg.desirable_weight, cfg.undesirable_weight)
        loss = losses.sum() / len(batch)  # / all processes' examples: chunk losses add up to the batch mean
        return loss, {"loss/kto": loss.item(), **{k: st[k] for k in ("rewards/chosen", "rewards/rejected",
                                                                      "count/chosen", "count/rejected")}}

    sums = add_up(accumulate(accelerator, model, micro_chunks(local, data, cfg, device), loss_fn))
    return kto_batch_metrics(sum_over_processes(accelerator, sums), z0)


def held_out_metrics(model, held: Rollout, held_ref: torch.Tensor, desirable: torch.Tensor, cfg: KTOConfig,
                     device) -> dict[str, float]:
    """Mean implicit rewards beta * log(pi / pi_ref) of the held-out desirable and undesirable examples."""
    with torch.no_grad():  # in micro-batches and chunks, as training runs them (not every row at once)
        logps = torch.cat([sequence_logps(model, held, c, cfg, device, m)[0].cpu() for c, m in all_row_chunks(held, cfg, device)])
        _, st = kto_loss(logps, held_ref, desirable, 0.0, cfg.beta)
    return kto_batch_metrics(st, 0.0)


# ----------------------------------------------------------------------------- loop


def build_models(cfg: KTOConfig):
    """(policy-only ActorCritic, Reference, tokenizer)."""
    return build_actor(cfg, with_reference=True, reference_model=cfg.reference_model)


def train(cfg: KTOConfig) -> dict:
    """Run KTO; returns the summary (also written to RUN/summary.json)."""
    launch = Launch(cfg)
    device = launch.device
    # 1. data. Data, judge, model and prompt lengths are checked before the run folder exists.
    examples, held_out = load_examples(cfg.data, cfg.eval_split)
    if cfg.eval_data:  # TRL's eval_dataset: held-out examples given apart
        held_out = load_held_examples(cfg.eval_data)
    judge, model, reference, tok = preference_models(launch, build_models)
    check_prompt_lengths(tok, [examples, held_out], cfg)
    data, N = encode_examples(tok, examples, cfg, cfg.seed), len(examples)
    desirable = torch.tensor([e["label"] for e in examples], device=HOST)
    held = encode_rows(tok, held_out, [e["completion"] for e in held_out], cfg, "a completion") if held_out else None
    batches = plan_batches(N, cfg, torch.Generator(device=HOST).manual_seed(cfg.seed), launch.world)
    precompute = should_precompute(cfg, N, len(batches))
    with OfflineRun(launch, "kto", len(batches), model, *optimizer_for(model.parameters(), cfg, len(batches)),
                    epoch_size=N, reference=None if precompute else reference,  # sharded when still in use
                    summary=dict(train_examples=N, held_out_examples=len(held_out))) as h:
        with h.tracker.phase("reference log-probs", None), reference.loaded(device):  # 2. reference
            table = row_reference_table(reference, data, cfg, device) if precompute else None
            held_ref = row_reference_table(reference, held, cfg, device) if held is not None else None
        reference = None if precompute else reference  # the tables are all training needs: a copy's memory is freed
        ref = reference_rows(reference, data, cfg, device, table)
        h.summary["precomputed_ref_logps"] = precompute
        records = eval_records(examples, held_out, cfg) if cfg.num_eval_prompts > 0 else []
        h.judge_before(model, tok, records, judge)  # 3. before
        for step in h.steps():  # 4. train
            t0 = time.time()
            with h.reference_loaded(reference, device):
                metrics = train_step(h.model, data, batches[step], ref, desirable, cfg, h.accelerator)
            metrics.update(h.optimizer_step(metrics["loss/kto"], step))
            h.log(step, h.timed(metrics, t0))
        if held is not None:  # 5. after
            labels = torch.tensor([e["label"] for e in held_out], device=HOST)
            h.held_out(held_out_metrics(model, held, held_ref, labels, cfg, device), lambda m: "[eval] held-out "
                       f"examples: implicit reward desirable {m['rewards/chosen']:+.3f}, undesirable "
                       f"{m['rewards/rejected']:+.3f} (n={len(held_out)})")
        return h.finish_judged(model, tok, records, judge, bool(held_out))
