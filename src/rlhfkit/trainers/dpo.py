"""`rlhfkit dpo`, `simpo`, `orpo`: preference optimisation on pairs: DPO, IPO and cDPO against a
reference; SimPO and ORPO without one (no reference is built, step 2 is skipped).

As numbered steps in `train`:
  1. data       pairs (prompt, chosen, rejected) -> one tokenised table of 2N rows, chosen i and
                rejected N + i, in PPO's Rollout layout (left-padded prompt, right-padded response)
  2. reference  sequence log-probs under pi_ref: the adapter-disabled base (LoRA), a frozen copy, or
                `reference_model`; computed once for the whole data set before training when the run
                sees every pair at least once (cheaper), else alongside each micro-batch
  3. before     the starting model's samples on held-out prompts, scored by the judge
  4. train      epochs x shuffled batches x micro-batches; loss = mean over the batch's pairs
  5. after      held-out preference accuracy, and the judged win rate over the starting model

The policy's log-probs come from PPO's teacher-forced pass (rollout.forward_logprobs); the
losses from algos.dpo_loss, algos.simpo_loss and algos.orpo_loss. Formulas and defaults:
docs/algorithms.md.
"""

from __future__ import annotations

import contextlib
import time

import torch

from rlhfkit.algos import dpo_loss, orpo_loss, simpo_loss
from rlhfkit.core.config import check, config_main
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import format_prompts
from rlhfkit.errors import DataError
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.rollout.logprobs import chunk_positions, row_chunks, rows_of
from rlhfkit.runtime.accumulate import accumulate, add_up
from rlhfkit.runtime.distributed import sum_over_processes
from rlhfkit.runtime.faults import guarded_step
from rlhfkit.runtime.run import Run, closes_its_runs
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.dpo_config import DPOConfig, ORPOConfig, SimPOConfig
from rlhfkit.trainers.judged import eval_records, judged_after, judged_samples, win_rate

BUILTIN_PREFS = {"prefs_reviews": "prefs_reviews.jsonl"}
__all__ = ["eval_records", "judged_after", "judged_samples", "train", "win_rate"]


# ----------------------------------------------------------------------------- data


def resolve_prefs(spec: str) -> str:
    """File path of a preference spec; `builtin:prefs_reviews` is shipped in rlhfkit/data/builtin."""
    if isinstance(spec, str) and spec.startswith("builtin:") and spec[len("builtin:"):].strip() in BUILTIN_PREFS:
        from importlib import resources

        return str(resources.files("rlhfkit.data") / "builtin" / BUILTIN_PREFS[spec[len("builtin:"):].strip()])
    return spec


def load_pairs(spec: str) -> tuple[list[dict], list[dict]]:
    """(training pairs, held-out pairs). Held out = records with split=test (none if no split field)."""
    from rlhfkit.data.prefs import load_preferences
    from rlhfkit.data.sets import load_split

    path = resolve_prefs(spec)
    if not any("split" in r for r in load_split(path, None)):
        return load_preferences(path), []
    train = load_preferences(path, split="train")  # Records: they name file:line in messages
    try:
        held_out = load_preferences(path, split="test")
    except DataError:
        held_out = []
    return train, held_out


def encode_pairs(tok, pairs: list[dict], cfg: DPOConfig) -> Rollout:
    """2N rows: chosen responses (rows 0..N-1), then rejected (N..2N-1) (`encode_rows`)."""
    return encode_rows(tok, pairs + pairs, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs], cfg,
                       "a chosen or rejected response")


def encode_rows(tok, records: list[dict], responses: list[str], cfg, what: str = "a response") -> Rollout:
    """One row per (record's prompt, response). Each response ends with the end-of-turn token, so the
    model also learns where to stop. Prompts keep their last max_prompt_length tokens, responses their
    first max_response_length."""
    from rlhfkit.data.chat import end_of_turn, tokenize_sft_example

    texts = format_prompts(tok, [r.get("messages") or r["prompt"] for r in records], cfg)
    queries, encoded = [], []
    for text, response in zip(texts, responses):
        ex = tokenize_sft_example(tok, text, text + response + end_of_turn(tok))
        n = sum(1 for label in ex["labels"] if label == -100)
        queries.append(ex["input_ids"][:n][-cfg.max_prompt_length:])
        encoded.append(ex["input_ids"][n:][: cfg.max_response_length])
    if any(not r for r in encoded):
        raise DataError(f"{what} tokenises to nothing")
    P, R, pad = max(map(len, queries)), max(map(len, encoded)), tok.pad_token_id
    q_ids = torch.tensor([[pad] * (P - len(q)) + q for q in queries], device=HOST)
    q_mask = torch.tensor([[0] * (P - len(q)) + [1] * len(q) for q in queries], device=HOST)
    r_ids = torch.tensor([r + [pad] * (R - len(r)) for r in encoded], device=HOST)
    r_mask = torch.tensor([[1.0] * len(r) + [0.0] * (R - len(r)) for r in encoded], device=HOST)
    return Rollout(query_ids=q_ids, query_mask=q_mask, response_ids=r_ids, response_mask=r_mask,
                   stopped=torch.ones(len(encoded), dtype=torch.bool, device=HOST))


def check_prompt_lengths(tok, pair_sets: list[list[dict]], cfg: DPOConfig) -> None:
    """Prompts longer than max_prompt_length: one warning with the count (they keep their end), or a
    DataError naming the first one (prompt_overflow=error)."""
    from rlhfkit.rollout.prompt_fit import enforce_prompt_limit

    groups = [(format_prompts(tok, [p.get("messages") or p["prompt"] for p in pairs], cfg), getattr(pairs, "where", None))
              for pairs in pair_sets]
    enforce_prompt_limit(tok, groups, cfg.max_prompt_length, cfg.prompt_overflow, f"max_prompt_length={cfg.max_prompt_length}")


def pair_rows(idx: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """Table rows of pairs `idx`: their chosen rows, then their rejected rows."""
    return torch.cat([idx, idx + n_pairs])


def pair_chunks(idx: torch.Tensor, data: Rollout, device, budget: int) -> list[torch.Tensor]:
    """One micro-batch's pairs `idx` in contiguous chunks of at most `budget` positions (a
    pair runs its chosen and rejected row, its prompt once) on the CPU (rollout/logprobs.py
    `row_chunks`): the loss is a sum over pairs, so chunks add up to the micro-batch's gradient while
    their activations stay bounded. Pure in its inputs: the reference table, the steps and the
    held-out pass cut alike."""
    n = data.response_ids.shape[0] // 2
    return row_chunks(idx, data, chunk_positions(device, budget), to_rows=lambda pairs: pair_rows(pairs, n))


# ----------------------------------------------------------------------------- log-probs and loss


def sequence_logps(model, data: Rollout, rows: torch.Tensor, cfg: DPOConfig, device,
                   columns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of response-token log-probs, response lengths), one per row; with grad. `columns`: the
    micro-batch's rows, whose trimmed columns a chunk keeps (rollout/logprobs.py `rows_of`)."""
    mb = rows_of(data, rows, columns)
    with autocast(cfg.dtype, device):
        lp, _, _ = forward_logprobs(model, mb, 1.0, with_values=False)
    return lp.sum(1), mb.response_mask.sum(1).to(device)


@torch.no_grad()
def reference_logps(reference, data: Rollout, rows: torch.Tensor, cfg: DPOConfig, device,
                    columns: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of response-token log-probs under the reference, one per row (on `device`). `columns`: as
    in sequence_logps."""
    mb = rows_of(data, rows, columns)
    with autocast(cfg.dtype, device):
        lp = reference.logprobs(mb.input_ids.to(device), mb.attention_mask.to(device), mb.response_ids.to(device),
                                mb.response_mask.to(device))
    return lp.sum(1)


def dpo_batch_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor | None, lengths: torch.Tensor, cfg: DPOConfig,
                   n_pairs: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of k pairs given 2k sequence log-probs laid out [chosen x k, rejected x k], divided by
    the number of pairs in the whole optimiser batch (so micro-batch losses add up to its mean).
    IPO uses length-averaged log-probs (Azar et al. 2023); sigmoid/cDPO use sums (Rafailov et al. 2023);
    SimPO and ORPO take sums and lengths and average themselves, with no reference (`ref_logps` None)."""
    k = policy_logps.shape[0] // 2
    if cfg.loss_type == "simpo":
        losses, metrics = simpo_loss(policy_logps[:k], policy_logps[k:], lengths[:k], lengths[k:], cfg.beta, cfg.gamma)
        return losses.sum() / n_pairs, metrics
    if cfg.loss_type == "orpo":
        losses, metrics = orpo_loss(policy_logps[:k], policy_logps[k:], lengths[:k], lengths[k:], cfg.beta)
        return losses.sum() / n_pairs, metrics
    if cfg.loss_type == "ipo":
        policy_logps, ref_logps = policy_logps / lengths, ref_logps / lengths
    losses, metrics = dpo_loss(policy_logps[:k], policy_logps[k:], ref_logps[:k], ref_logps[k:], cfg.beta,
                               "ipo" if cfg.loss_type == "ipo" else "sigmoid", cfg.smoothing)
    return losses.sum() / n_pairs, metrics


def pair_lengths(data: Rollout, share_prompts: bool) -> torch.Tensor:
    """(N,) the length that sets a pair's padded width: its longer response when the prompt runs once
    per pair (responses then carry most of the padding: two rows each), else prompt + that response."""
    n = data.response_ids.shape[0] // 2
    response = data.response_mask.sum(1)
    longer = torch.maximum(response[:n], response[n:]).long()
    return longer if share_prompts else data.query_mask[:n].sum(1) + longer


def plan_batches(n_pairs: int, cfg: DPOConfig, generator: torch.Generator, world: int = 1,
                 lengths: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Pair indices of every optimiser step: a fresh shuffle per epoch, cut at max_steps. With
    `world` processes an epoch's last, short batch is cut to a multiple of `world`, so that every
    process gets as many pairs (and runs as many backward passes) as the others.

    Given `lengths` (pair_lengths), each batch is ordered longest first, so its micro-batches hold
    pairs of similar length and pad less. A step's pairs and its summed gradient stay the same."""
    batches = []
    for _ in range(cfg.epochs):
        perm = torch.randperm(n_pairs, generator=generator, device=generator.device)
        cut = [perm[i : i + cfg.batch_size] for i in range(0, n_pairs, cfg.batch_size)]
        batches += [b[: len(b) // world * world] for b in cut if len(b) >= world]
    if lengths is not None:
        batches = [b[torch.argsort(lengths[b], descending=True, stable=True)] for b in batches]
    return batches[: cfg.max_steps] if cfg.max_steps else batches


def should_precompute(cfg: DPOConfig, n_pairs: int, n_steps: int) -> bool:
    """Precompute costs one reference pass per pair in the data set; on the fly costs one per pair
    visited. So precompute when the run visits at least as many pairs as the data set holds."""
    if cfg.precompute_ref_logps is not None:
        return cfg.precompute_ref_logps
    return n_steps * cfg.batch_size >= n_pairs


def build_models(cfg: DPOConfig):
    """(policy-only ActorCritic, Reference (None for reference-free losses), tokenizer)."""
    return build_actor(cfg, with_reference=cfg.uses_reference, reference_model=cfg.reference_model)


# ----------------------------------------------------------------------------- loop


def precompute_reference(reference, data: Rollout, batches: list[torch.Tensor], cfg: DPOConfig, device,
                         world: int = 1) -> torch.Tensor:
    """Reference log-probs of all 2N rows, grouped like the first epoch's micro-batches on each
    process (so with LoRA, step 0 sees log pi == log pi_ref to the last bit and the loss is exactly
    log 2); pairs the first batches miss (cut for `world` processes) are computed after them."""
    n = data.response_ids.shape[0] // 2
    table, done = torch.zeros(2 * n, device=HOST), torch.zeros(n, dtype=torch.bool, device=HOST)

    def fill(pairs: torch.Tensor) -> None:
        pairs = pairs[~done[pairs]]
        for m0 in range(0, len(pairs), cfg.micro_batch_size):
            micro = pairs[m0 : m0 + cfg.micro_batch_size]
            for chunk in pair_chunks(micro, data, device, cfg.cpu_chunk_positions):
                rows = pair_rows(chunk, n)
                table[rows] = reference_logps(reference, data, rows, cfg, device, pair_rows(micro, n)).cpu()
        done[pairs] = True

    for batch in batches[: -(-n // cfg.batch_size)]:  # the first epoch, each process's share in turn
        for r in range(world):
            fill(batch[r::world])
    fill((~done).nonzero().squeeze(1))
    return table


def micro_pair_chunks(pairs: torch.Tensor, micro_batch_size: int, data: Rollout, device, budget: int) -> list[tuple]:
    """(pair indices, columns) of each chunk of `pairs` cut into micro-batches of `micro_batch_size`
    pairs, each cut into `pair_chunks`; columns: the rows of the chunk's micro-batch (`pair_rows`),
    which set its padded width."""
    n = data.response_ids.shape[0] // 2
    return [(c, pair_rows(micro, n)) for m0 in range(0, len(pairs), micro_batch_size)
            for micro in [pairs[m0 : m0 + micro_batch_size]] for c in pair_chunks(micro, data, device, budget)]


def train_step(model, data: Rollout, batch: torch.Tensor, ref_table, reference, cfg: DPOConfig, accelerator) -> dict:
    """Gradients of one optimiser batch (this process's share, in micro-batches); returns metrics."""
    device, world, n = accelerator.device, accelerator.num_processes, data.response_ids.shape[0] // 2
    local = batch[accelerator.process_index :: world]

    def loss_fn(chunk: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        idx, columns = chunk
        rows = pair_rows(idx, n)
        logps, lengths = sequence_logps(model, data, rows, cfg, device, columns)
        ref = batch_reference(ref_table, reference, data, rows, cfg, device, columns)
        loss, st = dpo_batch_loss(logps, ref, lengths, cfg, float(len(batch)))  # / all processes' pairs
        return loss, {"loss/dpo": loss.item(), **{k: v * len(idx) / len(local) for k, v in st.items()}}

    sums = add_up(accumulate(accelerator, model, micro_pair_chunks(local, cfg.micro_batch_size, data, device, cfg.cpu_chunk_positions), loss_fn))
    sums = sum_over_processes(accelerator, sums)  # loss/dpo: the global loss; the others: x world
    return {k: v if k == "loss/dpo" else v / world for k, v in sums.items()}


def batch_reference(ref_table, reference, data: Rollout, rows: torch.Tensor, cfg: DPOConfig, device,
                    columns: torch.Tensor | None = None):
    """Reference log-probs of `rows`: from the precomputed table, computed now, or None (reference-free)."""
    if ref_table is not None:
        return ref_table[rows].to(device)
    return None if reference is None else reference_logps(reference, data, rows, cfg, device, columns)


def held_out_metrics(model, held: Rollout, held_ref: torch.Tensor | None, cfg: DPOConfig, device) -> dict[str, float]:
    """rewards/* and logps/* of the held-out pairs under the current policy."""
    n = held.response_ids.shape[0] // 2
    chosen, rejected = [], []  # (log-prob sums, lengths) of each chunk's chosen and rejected rows
    with torch.no_grad():  # in micro-batches and chunks, as training runs them (not all pairs at once)
        for m0 in range(0, n, cfg.micro_batch_size):
            micro = torch.arange(n, device=HOST)[m0 : m0 + cfg.micro_batch_size]
            for idx in pair_chunks(micro, held, device, cfg.cpu_chunk_positions):
                logps, lengths = sequence_logps(model, held, pair_rows(idx, n), cfg, device, pair_rows(micro, n))
                chosen.append((logps[: len(idx)], lengths[: len(idx)]))
                rejected.append((logps[len(idx) :], lengths[len(idx) :]))
        logps = torch.cat([lp for lp, _ in chosen + rejected])
        lengths = torch.cat([ln for _, ln in chosen + rejected])
        return dpo_batch_loss(logps, None if held_ref is None else held_ref.to(device), lengths, cfg, float(n))[1]


@closes_its_runs
def train(cfg: DPOConfig) -> dict:
    """Run DPO; returns the summary (also written to RUN/summary.json)."""
    from rlhfkit.models.policy import save_actor
    from rlhfkit.rewards import get_reward
    from rlhfkit.runtime.optim import optimizer_for

    run = Run(cfg, getattr(type(cfg), "command", "dpo"))
    device, world = run.device, run.world
    # 1. data. Data, judge, model and prompt lengths are checked before the run folder exists.
    train_pairs, held_out = load_pairs(cfg.prefs)
    judge = get_reward(cfg.judge)
    model, reference, tok = build_models(cfg)
    check(cfg.batch_size % world == 0, f"batch_size ({cfg.batch_size}) must be divisible by the {world} processes")
    model.to(device)  # before prepare: the reference passes and the judge's samples run first
    if reference is not None:
        reference.to(device)  # a frozen copy stays in CPU memory when offloaded
    check_prompt_lengths(tok, [train_pairs, held_out], cfg)
    data, N = encode_pairs(tok, train_pairs, cfg), len(train_pairs)
    held = encode_pairs(tok, held_out, cfg) if held_out else None
    batches = plan_batches(N, cfg, torch.Generator(device=HOST).manual_seed(cfg.seed), world,
                           pair_lengths(data, model.share_prompts))
    run.open(total=len(batches), unit="step", train_pairs=N, held_out_pairs=len(held_out))
    held_ref, ref_table = reference_tables(run, reference, data, held, batches)  # 2. reference
    if ref_table is not None and reference is not None and reference.frozen is not None:
        reference = None  # the frozen copy is no longer needed: free its memory
    optimizer, scheduler = optimizer_for(model.parameters(), cfg, len(batches))
    judged: dict = {}  # the starting model's judged scores, kept in checkpoints
    wrapped = run.prepare(model, optimizer, scheduler, cfg.micro_batch_size, judged=judged)
    run.shard_reference(reference)  # under FSDP2 a frozen copy still in use is sharded like the policy
    run.resume()  # when resuming: weights, optimiser, RNG, the starting model's judged scores
    # 3. the starting model, judged
    records = eval_records(train_pairs, held_out, cfg) if cfg.num_eval_prompts > 0 else []
    seed = cfg.seed + 424242  # same seed before and after: the comparison sees the same sampling noise
    if records and "before" not in judged:
        with run.full_weights():
            judged["before"] = judged_samples(model, tok, records, judge, cfg, seed)[1]
    before = judged.get("before", [])
    # 4. train (the batches are planned from the seed, so a resumed run just starts further in)
    for step in run.steps():
        t0 = time.time()
        with reference.loaded(device) if reference is not None else contextlib.nullcontext():
            metrics = train_step(wrapped, data, batches[step], ref_table, reference, cfg, run.accelerator)
        grad_norm, skipped = guarded_step(wrapped.parameters(), run.optimizer, run.scheduler, run.accelerator,
                                          cfg.max_grad_norm, loss=metrics["loss/dpo"], guard=run.guard,
                                          where=f"step {step}")
        metrics.update({"params/grad_norm": grad_norm, "params/lr": run.scheduler.get_last_lr()[0],
                        "params/skipped_steps": float(skipped),
                        "params/epoch": (step + 1) * cfg.batch_size / N, "timing/step_s": time.time() - t0})
        run.log(step, metrics)
    # 5. after: held-out preference accuracy, judged win rate over the starting model
    if held is not None:
        m = run.summary["held_out"] = held_out_metrics(model, held, held_ref, cfg, device)
        run.print(f"[eval] held-out pairs: preference accuracy {m['rewards/accuracy']:.1%}, "
                  f"reward margin {m['rewards/margin']:+.3f} (n={len(held_out)})")
    if records:
        with run.full_weights():
            judged_after(run, model, tok, records, judge, before, seed, "held-out" if held_out else "training")

    def save(folder, state):
        save_actor(model, tok, folder, state_dict=state)
        if cfg.save_merged and cfg.lora and state is None:
            save_actor(model, tok, folder / "merged", merge=True)

    return run.finish(save)


def reference_tables(run: Run, reference, data: Rollout, held: Rollout | None,
                     batches: list[torch.Tensor]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Step 2: reference log-probs of the held-out pairs, and of every training pair when computing
    them once before training is cheaper (`should_precompute`; else None: per micro-batch)."""
    cfg, device = run.cfg, run.device
    held_ref = None
    if reference is None:  # reference-free loss (SimPO, ORPO)
        run.summary["precomputed_ref_logps"] = False
        return None, None
    if held is not None:
        n = held.response_ids.shape[0] // 2
        held_ref = torch.zeros(2 * n, device=HOST)
        with reference.loaded(device):  # in micro-batches and chunks, as held_out_metrics runs the policy
            for m0 in range(0, n, cfg.micro_batch_size):
                micro = torch.arange(n, device=HOST)[m0 : m0 + cfg.micro_batch_size]
                for idx in pair_chunks(micro, held, device, cfg.cpu_chunk_positions):
                    rows = pair_rows(idx, n)
                    held_ref[rows] = reference_logps(reference, held, rows, cfg, device, pair_rows(micro, n)).cpu()
    ref_table = None
    if should_precompute(cfg, data.response_ids.shape[0] // 2, len(batches)):
        with run.tracker.phase("reference log-probs", None), reference.loaded(device):
            ref_table = precompute_reference(reference, data, batches, cfg, device, run.world)
    run.summary["precomputed_ref_logps"] = ref_table is not None
    return held_ref, ref_table


def main(argv: list[str]) -> int:
    return config_main(DPOConfig, train, argv, "rlhfkit dpo")


def simpo_main(argv: list[str]) -> int:
    return config_main(SimPOConfig, train, argv, "rlhfkit simpo")


def orpo_main(argv: list[str]) -> int:
    return config_main(ORPOConfig, train, argv, "rlhfkit orpo")
