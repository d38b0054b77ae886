"""Batched sampling for the OpenAI-compatible server (rollout/openai_server.py): requests that
arrive close together share one decoding loop.

Batching by arrival window: a worker thread takes the first waiting request, then keeps taking
requests for `window_s` seconds more (or until `max_rows` rows are queued), and samples all their
rows in one left-padded prefill and one decoding loop (`sample_rows`). Rows leave the loop as they
stop, so a short answer does not wait for a long one's tokens; a request that arrives while a loop
runs waits for the next one (this is not continuous batching: the loop does not admit new rows).
64 agents that each wait for their reply thus cost about one loop per conversation turn, not 64.

Each row may have its own temperature and token limit. Every sampled token's log-probability
under the distribution that drew it (log softmax(z / T), z at T = 0) is returned with it: the
server records them per episode (rollout/episodes.py).

Notation: B rows, P padded prompt width, V vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from rlhfkit.models.attention import native_attention
from rlhfkit.models.hf_compat import cache_kwargs
from rlhfkit.models.lora import merged_lora
from rlhfkit.rollout.decode import prefill
from rlhfkit.rollout.prefix_cache import PrefixCache, batched_cache, row_kv
from rlhfkit.rollout.sampling import exponential_race, thread_generator


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sampled continuation: its token ids (ending with the stop token when it stopped on
    one), the log-prob of each under the distribution that drew it, and whether it stopped."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    stopped: bool


@dataclasses.dataclass
class Job:
    """A request's rows waiting for the worker: `n` samples of `prompt` (token ids)."""

    prompt: list[int]
    n: int
    temperature: float
    max_tokens: int
    future: Future = dataclasses.field(default_factory=Future)


def draw_rows(logits: torch.Tensor, temps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token (B,), its log-prob (B,)) per row of `logits` (B, V) at the row's temperature `temps`
    (B,): softmax(z / T) by an exponential race; T = 0 takes the argmax (log-prob at T = 1)."""
    z = logits.float()
    greedy = temps <= 0
    scaled = z / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)  # (B, V)
    tok = exponential_race(logp.exp())
    if bool(greedy.any()):
        tok = torch.where(greedy, z.argmax(dim=-1), tok)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)


def left_padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, L), mask (B, L)) of id lists left-padded to the longest (L >= 1)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long, device=device)
            mask[i, width - len(r):] = 1
    return ids, mask


def start_rows(model, prompts: list[list[int]], pad_id: int, prefix: PrefixCache | None):
    """(last-column logits (B, V), cache, positions (B, W), mask (B, W)) after running each prompt,
    its longest cached prefix taken from `prefix` (rollout/prefix_cache.py) and only the rest run."""
    device = next(model.parameters()).device
    hits = [prefix.take(p) if prefix is not None else (0, None) for p in prompts]
    lengths = [n for n, _ in hits]
    new_ids, new_mask = left_padded([p[n:] for p, n in zip(prompts, lengths)], pad_id, device)
    if not any(lengths):  # identical prompts (a GRPO group, n > 1) run once, their cache rows copied
        first: dict[tuple[int, ...], int] = {}
        index = [first.setdefault(tuple(p), len(first)) for p in prompts]
        unique = sorted(first, key=first.get)
        ids, mask = left_padded([list(u) for u in unique], pad_id, device)
        logits, cache, positions = prefill(model, ids, mask)
        if len(unique) < len(prompts):
            idx = torch.tensor(index, dtype=torch.long, device=device)
            cache.reorder_cache(idx)
            logits, positions, mask = logits[idx], positions[idx], mask[idx]
        return logits, cache, positions, mask
    cache, cached_mask = batched_cache(model.config, [kv for _, kv in hits], lengths, device)
    ids = torch.cat([torch.full_like(cached_mask, pad_id), new_ids], dim=1)
    mask = torch.cat([cached_mask, new_mask], dim=1)  # holes between a short cached part and its new part
    logits, cache, positions = prefill(model, ids, mask, cache)
    return logits, cache, positions, mask


@torch.no_grad()
def sample_rows(model: torch.nn.Module, prompts: list[list[int]], temps: list[float], max_tokens: list[int],
                stop_ids: tuple[int, ...], pad_id: int, prefix: PrefixCache | None = None) -> list[Sample]:
    """One continuation per prompt (lists of ids), all rows in one prefill and one decoding loop
    with a KV cache; a row leaves the batch at its stop token or its own token limit. Positions
    come from the attention mask (left padding). `prefix`: K/V of earlier rows to start from, and
    where each finished row's K/V (its prompt and all sampled tokens but the last) is kept."""
    device = next(model.parameters()).device
    B = len(prompts)
    logits, cache, positions, mask = start_rows(model, prompts, pad_id, prefix)
    t_all = torch.tensor(temps, dtype=torch.float32, device=device)
    limits = torch.tensor(max_tokens, dtype=torch.long, device=device)
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    out_ids: list[list[int]] = [[] for _ in range(B)]
    out_lp: list[list[float]] = [[] for _ in range(B)]
    stopped = [False] * B
    rows = torch.arange(B, device=device)  # original row of each row still running
    next_pos = positions[:, -1:] + 1
    for t in range(int(limits.max())):
        tok, lp = draw_rows(logits, t_all[rows])
        for r, k, v in zip(rows.tolist(), tok.tolist(), lp.tolist()):
            out_ids[r].append(k)
            out_lp[r].append(v)
        hit = torch.isin(tok, stops)
        for r in rows[hit].tolist():
            stopped[r] = True
        going = ~hit & (limits[rows] > t + 1)
        if prefix is not None:  # finished rows: keep what the cache holds of them
            for j in (~going).nonzero().squeeze(1).tolist():
                r = int(rows[j])
                prefix.put(tuple(prompts[r]) + tuple(out_ids[r][:-1]), row_kv(cache, j, mask[j]))
        keep = going.nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        if keep.numel() < rows.numel():
            rows, tok, mask, next_pos = rows[keep], tok[keep], mask[keep], next_pos[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, **cache_kwargs(cache),
                       use_cache=True).logits[:, -1]
        next_pos = next_pos + 1
    return [Sample(tuple(i), tuple(lp), s) for i, lp, s in zip(out_ids, out_lp, stopped)]


class BatchedSampler:
    """Samples for many threads at once: `submit` queues a request's rows and returns a Future of
    its `n` Samples; one worker thread runs them in arrival-window batches (module docstring).

    `context()`: entered around every batch in the worker thread (autocast, full weights under
    sharding); `seed`: the worker's own generator (sampling does not touch torch's global one);
    `reuse_cache`: a request that extends an earlier one starts from its K/V (rollout/prefix_cache.py;
    the model's weights must not change while the sampler lives).
    Use as a context manager, or call `start()` and `close()`.
    """

    def __init__(self, model: torch.nn.Module, stop_ids: tuple[int, ...], pad_id: int, *, window_s: float = 0.02,
                 max_rows: int = 256, seed: int = 0, context: Callable = contextlib.nullcontext,
                 reuse_cache: bool = True):
        self.model, self.stop_ids, self.pad_id = model, tuple(stop_ids), pad_id
        self.window_s, self.max_rows, self.context = window_s, max_rows, context
        self.generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()  # held while the model samples: the trainer must not change it then
        self.batches = 0  # decoding loops run (bench and tests read it)
        self.rows = 0
        self.prompt_tokens = 0  # prompt tokens run through the model (prefill; cached prefixes not counted)
        self.prefix = PrefixCache() if reuse_cache else None  # K/V of finished rows (rollout/prefix_cache.py)
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def submit(self, prompt: list[int], n: int, temperature: float, max_tokens: int) -> Future:
        if self._closed.is_set():
            raise RuntimeError("the sampler is closed")
        job = Job(list(prompt), n, temperature, max_tokens)
        self.jobs.put(job)
        return job.future

    def reseed(self, seed: int) -> None:
        with self.lock:
            self.generator.manual_seed(seed)

    def start(self) -> BatchedSampler:
        if self._thread is not None:  # started already
            return self
        self._thread = threading.Thread(target=self._work, name="rlhfkit-sampler", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self.jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        while True:  # anything still queued fails instead of waiting forever
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and not job.future.done():
                job.future.set_exception(RuntimeError("the sampler was closed"))

    def __enter__(self) -> BatchedSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the worker ---------------------------------------------------------------------------
    def _gather(self, first: Job) -> list[Job]:
        """`first` and the jobs that arrive within the window (at most max_rows rows)."""
        jobs, rows = [first], first.n
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            left = deadline - time.monotonic()
            try:
                job = self.jobs.get(timeout=max(left, 0)) if left > 0 else self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:  # closing: put the marker back for the loop
                self.jobs.put(None)
                break
            jobs.append(job)
            rows += job.n
        return jobs

    def _work(self) -> None:
        while not self._closed.is_set():
            first = self.jobs.get()
            if first is None:
                break
            jobs = self._gather(first)
            try:
                results = self.run_batch(jobs)
            except Exception as e:  # noqa: BLE001 - every waiting request gets the error
                for job in jobs:
                    job.future.set_exception(e)
                continue
            for job, samples in zip(jobs, results):
                job.future.set_result(samples)

    def run_batch(self, jobs: list[Job]) -> list[list[Sample]]:
        """Every job's rows in one `sample_rows` call, split back per job."""
        prompts = [j.prompt for j in jobs for _ in range(j.n)]
        temps = [j.temperature for j in jobs for _ in range(j.n)]
        limits = [j.max_tokens for j in jobs for _ in range(j.n)]
        model = self.model
        with self.lock, self.context(), thread_generator(self.generator), merged_lora(model), native_attention():
            was_training = model.training
            model.eval()
            try:
                reused = self.prefix.reused_tokens if self.prefix is not None else 0
                samples = sample_rows(model, prompts, temps, limits, self.stop_ids, self.pad_id, self.prefix)
                reused = (self.prefix.reused_tokens if self.prefix is not None else 0) - reused
            finally:
                model.train(was_training)
        self.batches += 1
        self.rows += len(prompts)
        self.prompt_tokens += sum(len(p) for p in prompts) - reused
        out, i = [], 0
        for j in jobs:
            out.append(samples[i : i + j.n])
            i += j.n
        return out
