"""One-step-off-policy rollouts for the GRPO family (`one_step_off_policy`, docs/algorithms.md): the
rollout source "one-step-off-policy" of trainers/grpo_sources.py.

Iteration n trains on batch n while a background thread samples batch n+1 with a copy of the
policy as it was before update n (the sampler). After update n the thread is joined and the
sampler's trainable weights are copied from the policy. So batch n (n >= 1) was sampled by
theta_{n-1}, the weights from before update n-1, one update stale; the trainer's own
teacher-forced pass gives pi_old = pi_theta_n and the sampler's pass of its own tokens gives
pi_sampler = pi_theta_{n-1} (`Rollout.sampler_logprobs`, at the sampling temperature, NaN on
padding: the vLLM backend's convention), which the truncated importance weights
min(pi_old / pi_sampler, tis_cap) correct for.

Iteration 0, and the first iteration after a resume, have no prefetched batch: they sample
on-policy with the policy itself (no sampler log-probs: weight exactly 1). A checkpoint stores
the prompt-stream position before the prefetched batch's prompts, so a resumed run samples those
prompts again, on-policy, with the same seed.

Why the sampler is a copy: HF generate's merged-LoRA path (models/lora.py) swaps weights on the
modules it runs, and the update changes the trainable weights while the thread samples. The copy
has its own modules and trainable tensors; frozen tensors (the base model under LoRA) are shared,
so LoRA adds only the adapters. Determinism: the thread draws from its own torch.Generator
(rollout/sampling.py `thread_generator`) seeded with the iteration's sampling seed, so a threaded
run equals the sequential reference (`OneStepOffPolicy.threaded = False`: batch n+1 sampled in
the main thread before update n).
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import time

import torch

from rlhfkit.core.precision import autocast
from rlhfkit.core.seeding import sampling_seed
from rlhfkit.data.chat import format_prompts
from rlhfkit.data.prompts import info_lists
from rlhfkit.errors import UserError
from rlhfkit.rollout.core import Rollout, generate
from rlhfkit.rollout.decode import lean_generate
from rlhfkit.rollout.logprobs import logprob_pass
from rlhfkit.rollout.sampling import thread_generator
from rlhfkit.rollout.score import score_rollout
from rlhfkit.runtime.checkpointer import _sharded
from rlhfkit.trainers.rollout_source import RolloutSource


def sampler_copy(core: torch.nn.Module) -> torch.nn.Module:
    """A copy of `core` (an ActorCritic) with its own modules and trainable parameters; frozen
    parameters are the same tensors as the policy's (no copy). In eval mode, no gradients."""
    shared = {id(p): p for p in core.parameters() if not p.requires_grad}
    sampler = copy.deepcopy(core, shared)
    for p in sampler.parameters():
        if id(p) not in shared:
            p.requires_grad_(False)
    return sampler.eval()


def trainable_names(core: torch.nn.Module) -> list[str]:
    return [n for n, p in core.named_parameters() if p.requires_grad]


@torch.no_grad()
def sync_weights(sampler: torch.nn.Module, core: torch.nn.Module, names: list[str]) -> None:
    """Copy the trainable parameters `names` of `core` into the sampler."""
    src, dst = dict(core.named_parameters()), dict(sampler.named_parameters())
    for n in names:
        dst[n].copy_(src[n].detach())


def added_bytes(sampler: torch.nn.Module, core: torch.nn.Module) -> int:
    """Bytes of parameters and buffers the sampler holds that the policy does not share."""
    owned = {t.data_ptr() for t in [*core.parameters(), *core.buffers()]}
    seen, total = set(), 0
    for t in [*sampler.parameters(), *sampler.buffers()]:
        if t.data_ptr() not in owned and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def sample_stale(sampler, tok, records: list[dict], cfg, params, seed: int, device,
                 lean: bool, micro_batch_size: int | None = None) -> tuple[Rollout, float]:
    """(tokens sampled by `sampler` (its own generator, seeded with `seed`) with its own log-probs
    of them (a teacher-forced pass at the sampling temperature, NaN on padding), not scored;
    seconds of that pass). `micro_batch_size`: the run's (trainers/rl.py RLRun; None: the config's)."""
    t0 = time.perf_counter()
    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    with thread_generator(gen), autocast(cfg.dtype, device):
        rollout = (lean_generate if lean else generate)(
            sampler.policy, tok, formatted, params, batch_size=cfg.prompts_per_generate,
            share_prompts=sampler.share_prompts, share_prefix=sampler.share_prefix)
    t1 = time.perf_counter()
    with autocast(cfg.dtype, device):
        rollout = logprob_pass(sampler, None, rollout, cfg.temperature, micro_batch_size or cfg.micro_batch_size,
                               chunk_budget=cfg.cpu_chunk_positions)
    rollout = dataclasses.replace(
        rollout, sampler_logprobs=rollout.logprobs.masked_fill(rollout.response_mask == 0, float("nan")),
        logprobs=None, entropy=None, values=None, trunk=None,  # the trainer's pass fills them
        timings={"timing/generate_s": t1 - t0})
    return rollout, time.perf_counter() - t1


class OneStepOffPolicy(RolloutSource):
    """The prefetching sampler of an RLRun (trainers/rl.py), a rollout source (trainers/grpo_sources.py).
    Per iteration: `draw(it)` returns the scored batch to train on and starts sampling the next one;
    `after_update()` waits for it and syncs the sampler. A context manager: leaving it waits for (and
    discards) a batch in flight. Registered with the checkpointer (state_dict / load_state_dict)."""

    threaded = True  # False: the sequential reference, batch n+1 sampled before update n in this thread

    def __init__(self, rl, cfg):
        if _sharded(rl.accelerator, rl.model):
            raise UserError("one_step_off_policy: not supported under FSDP/DeepSpeed (the sampler needs whole "
                            "weights); use DDP or one process")
        self.rl, self.cfg = rl, cfg
        self.names = trainable_names(rl.core)
        self.sampler = sampler_copy(rl.core)
        self.tok = copy.deepcopy(rl.tok)  # fast tokenizers must not be used from two threads at once
        self.memory_bytes = added_bytes(self.sampler, rl.core)
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlhfkit-sampler")
        self.future: concurrent.futures.Future | None = None
        self.prefetched: tuple[Rollout, list[dict], float] | None = None  # (batch, records, sampler pass s)
        self.stream_before: dict | None = None  # stream position before the prefetched batch's prompts
        self.stale = False  # the current batch came from the sampler
        self.sampler_pass_s = 0.0  # seconds of the sampler's log-prob pass over the current batch
        rl.print(f"[one_step_off_policy] sampler copy: {self.memory_bytes / 2**20:.1f} MiB of weights "
                 f"({len(self.names)} trainable tensors synced after each update)")

    # ---- the loop -------------------------------------------------------------------------
    def checkpointed(self) -> dict:
        """What the checkpointer saves and restores of this source, by name."""
        return {"one_step_off_policy": self}

    def draw(self, it: int, round: int = 0) -> tuple[Rollout, list[dict]]:
        """The rollout source's draw: `batch(it)` (one round only: the config refuses dynamic sampling)."""
        return self.batch(it)

    def batch(self, it: int) -> tuple[Rollout, list[dict]]:
        """(the batch iteration `it` trains on, scored, its records): the prefetched one (sampled one
        update ago, with sampler log-probs) or, with none, one sampled on-policy now. Then starts
        sampling batch it+1."""
        rl, cfg = self.rl, self.cfg

        def records() -> list[dict]:  # the next prompts_per_iteration prompts, each G times in a row
            return [r for r in rl.stream.next(cfg.prompts_per_iteration) for _ in range(cfg.group_size)]

        self.stale = self.prefetched is not None
        if self.prefetched is None:
            rows = records()
            rollout = rl.sample(rows, it)  # on-policy: the trainer samples, no sampler log-probs
            self.sampler_pass_s = 0.0
            sync_weights(self.sampler, rl.core, self.names)  # a resume loaded new weights after the copy
        else:
            (rollout, rows, self.sampler_pass_s), self.prefetched = self.prefetched, None
            t0 = time.perf_counter()
            rollout = score_rollout(rollout, rows, rl.reward_fn)
            rollout = dataclasses.replace(rollout, timings={**rollout.timings,
                                                            "timing/reward_s": time.perf_counter() - t0})
        rl.iteration = it
        if it + 1 < rl.total:
            self.stream_before = rl.stream.state_dict()
            self.start(records(), it + 1)
        return rollout, rows

    def start(self, records: list[dict], it: int) -> None:
        """Sample batch `it` of `records` with the sampler: in the thread, or now (threaded = False)."""
        rl, cfg = self.rl, self.cfg
        seed = sampling_seed(cfg.seed, rl.rank, it)
        lean = getattr(rl.backend, "name", "hf") == "lean"
        threads = torch.get_num_threads()

        def job() -> tuple[Rollout, list[dict], float]:
            torch.set_num_threads(threads)  # the same intra-op split as the main thread: the same numerics
            rollout, pass_s = sample_stale(self.sampler, self.tok, records, cfg, rl.params, seed, rl.device, lean,
                                           rl.micro_batch_size)
            rollout = dataclasses.replace(rollout, prompts=[str(r["prompt"]) for r in records],
                                          info=info_lists(records))
            return rollout, records, pass_s

        if self.threaded:
            self.future = self.pool.submit(job)
        else:
            self.prefetched = job()

    def after_update(self) -> dict[str, float]:
        """Wait for the batch in flight, then copy the updated trainable weights to the sampler.
        Returns rollout/policy_lag (updates between the weights that sampled the current batch and
        the trainer's: 0 or 1), timing/sampler_wait_s (seconds the trainer waited for the thread) and
        timing/sampler_logprobs_s (seconds of the sampler's log-prob pass over the current batch)."""
        t0 = time.perf_counter()
        if self.future is not None:
            self.prefetched, self.future = self.future.result(), None
        wait = time.perf_counter() - t0
        sync_weights(self.sampler, self.rl.core, self.names)
        return {"rollout/policy_lag": float(self.stale), "timing/sampler_wait_s": wait,
                "timing/sampler_logprobs_s": self.sampler_pass_s}

    # ---- checkpoints and shutdown -----------------------------------------------------------
    def state_dict(self) -> dict:
        return {"stream_before_prefetch": self.stream_before if self.prefetched is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """After a resume: the prefetched batch is gone; its prompts come again, sampled on-policy."""
        if state.get("stream_before_prefetch") is not None:
            self.rl.stream.load_state_dict(state["stream_before_prefetch"])
        self.prefetched = None

    def __exit__(self, *exc) -> None:
        if self.future is not None:  # an exception or a stop mid-iteration: let the thread finish, drop its batch
            self.future.cancel()
            concurrent.futures.wait([self.future])
            self.future = None
        self.pool.shutdown(wait=True)
