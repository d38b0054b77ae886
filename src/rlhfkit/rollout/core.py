"""Rollout phase of PPO/GRPO: sample responses, then recompute log-probs, values and reference
log-probs in one teacher-forced pass.

Notation: B rollout batch, P padded prompt width (left padding), R response width
(right padding after the first stop token), V vocabulary.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field, fields

import torch

from rlhfkit.algos import response_mask
from rlhfkit.core.devices import free_cuda_bytes
from rlhfkit.models.attention import native_attention
from rlhfkit.models.hf_compat import cache_kwargs
from rlhfkit.models.lora import merged_lora
from rlhfkit.models.shared_prompts import shared_prefix_prompts, shared_prompt_cache
from rlhfkit.rollout.prompt_fit import encode_prompts
from rlhfkit.rollout.sampling import ExponentialRaceSampler


@dataclass
class SamplingParams:
    """How rollouts are sampled. top_k=0 and top_p=1 keep the sampling distribution equal to the
    temperature-scaled policy whose log-probs PPO uses (docs/pitfalls.md#temperature)."""

    max_new_tokens: int = 48
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    max_prompt_length: int | None = None  # keep the last N prompt tokens (rollout/prompt_fit.py)

    def __post_init__(self):
        if self.top_k not in (0, None) or self.top_p < 1.0:
            warnings.warn(
                "top_k/top_p truncate the sampling distribution, so stored log-probs no longer match "
                "the distribution the tokens came from; PPO's ratio becomes biased",
                stacklevel=3,
            )


@dataclass(frozen=True)
class Rollout:
    """One batch of experience, a value: each stage returns a new Rollout (`dataclasses.replace`),
    none fills in the one it was given. Shapes: B rollout batch, P prompt width, R response width."""

    query_ids: torch.Tensor  # (B, P) left-padded prompt tokens
    query_mask: torch.Tensor  # (B, P) 1 for real prompt tokens
    response_ids: torch.Tensor  # (B, R) sampled tokens; anything after the first stop is padding
    response_mask: torch.Tensor  # (B, R) float, 1 on tokens the policy produced (the loss/KL/entropy mask)
    stopped: torch.Tensor  # (B,) bool, a stop token was emitted (multi-turn: the last turn's, not cut by a limit)
    logprobs: torch.Tensor | None = None  # (B, R) log pi_old(token) at temperature T, 0 on padding
    ref_logprobs: torch.Tensor | None = None  # (B, R) log pi_ref(token) at temperature T
    teacher_logprobs: torch.Tensor | None = None  # (B, R) a distillation teacher's log p_t(token) at temperature T
    values: torch.Tensor | None = None  # (B, R) V_old(s_t), the state before response token t
    entropy: torch.Tensor | None = None  # (B, R) entropy of pi_old(. | s_t) at temperature T
    scores: torch.Tensor | None = None  # (B,) sequence score from the reward function/model
    rewards: torch.Tensor | None = None  # (B, R) shaped per-token rewards (KL + score on last token)
    advantages: torch.Tensor | None = None  # (B, R) whitened GAE advantages
    returns: torch.Tensor | None = None  # (B, R) advantages + values (before whitening)
    trunk: torch.Tensor | None = None  # (B, P + R, H) states after the frozen bottom layers (models/trunk.py)
    sampler_logprobs: torch.Tensor | None = None  # (B, R) the sampler's own log-probs (vLLM), NaN if unknown; None: the trainer sampled
    prompts: list[str] = field(default_factory=list)  # B prompt texts (unformatted)
    completions: list[str] = field(default_factory=list)  # B decoded responses, stop token excluded
    info: dict = field(default_factory=dict)  # per-sample lists passed to reward functions
    reward_parts: dict = field(default_factory=dict)  # name -> B values: each weighted reward's scores and a reward's
    # per-sample metrics (logged as reward/NAME means); text values (reward=code's code_result) go to samples.jsonl
    timings: dict = field(default_factory=dict)  # seconds per rollout phase, for metrics
    # Multi-turn rollouts (rollout/multiturn.py); None for single-turn ones, where context = response_mask.
    context_mask: torch.Tensor | None = None  # (B, R) 1 on every real response-region token: model and environment
    turn_rewards: torch.Tensor | None = None  # (B, R) environment rewards on the last model token of the turn they reward

    def select(self, idx: torch.Tensor) -> Rollout:
        """Rows `idx` of every tensor field (lists are left out: mini-batches are tensor-only)."""
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v[idx] if isinstance(v, torch.Tensor) else type(v)()
        return Rollout(**kw)

    def to(self, device) -> Rollout:
        """Every tensor field on `device` (the same tensors where they already are there)."""
        return Rollout(**{f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
                          for f in fields(self) for v in (getattr(self, f.name),)})

    @property
    def input_ids(self) -> torch.Tensor:  # (B, P + R)
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def real_mask(self) -> torch.Tensor:  # (B, R) every real response-region token (environment tokens too)
        return self.response_mask if self.context_mask is None else self.context_mask

    @property
    def attention_mask(self) -> torch.Tensor:  # (B, P + R)
        return torch.cat([self.query_mask, self.real_mask.to(self.query_mask.dtype)], dim=1)


def trim_bounds(query_mask: torch.Tensor, real_mask: torch.Tensor) -> tuple[int, int]:
    """(first kept prompt column, response columns kept) of the rows of these masks, as `trim` cuts:
    prompt columns that are padding in every row go, and response columns after the longest response."""
    first = int(query_mask.any(0).float().argmax()) if query_mask.any() else 0
    last = int(real_mask.any(0).nonzero().max()) + 1 if real_mask.any() else 1
    return first, last


def trim(rollout: Rollout) -> Rollout:
    """Drop prompt columns that are padding in every row and response columns after the longest
    response. Causal attention makes both invisible to the kept positions, so this only saves time.
    Environment tokens count as real: they are context the kept tokens attend to."""
    first, last = trim_bounds(rollout.query_mask, rollout.real_mask)
    P = rollout.query_ids.shape[1]
    kw = {}
    for f in fields(rollout):
        v = getattr(rollout, f.name)
        if f.name == "trunk" and v is not None:
            v = v[:, first : P + last]
        elif isinstance(v, torch.Tensor) and v.dim() == 2:
            v = v[:, first:] if f.name.startswith("query") else v[:, :last]
        kw[f.name] = v
    return Rollout(**kw)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer,
    prompt_texts: list[str],
    params: SamplingParams,
    batch_size: int | None = None,
    share_prompts: bool = False,
    share_prefix: bool = False,
    generation_config=None,
) -> Rollout:
    """Sample one response per prompt text (already chat-formatted). KV-cached HF generate.

    Prompts are left-padded so every response starts at the same column
    (docs/pitfalls.md#padding-and-positions).
    `share_prompts`: a prompt repeated in a generate() call (GRPO's groups) is prefilled once
    and its cache copied to its rows; `share_prefix`: the prompt prefix every row of a call shares
    (a chat template's header) is prefilled once (models/shared_prompts.py). LoRA layers run merged
    (models/lora.py) and full-vocabulary draws use an exponential race (rollout/sampling.py).

    Only `params` decide what is sampled: the model folder's own generation_config.json is set
    aside during the call (`own_settings_only`). `generation_config` (a transformers
    GenerationConfig, `rlhfkit generate --model-generation-config`) samples with the model's own
    settings instead: never for rollouts, whose stored log-probs are the plain policy's.
    """
    enc = encode_prompts(tokenizer, prompt_texts, params.max_prompt_length)  # left padding: ends kept
    stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
    rows = generate_ids(model, tokenizer, enc["input_ids"], enc["attention_mask"], params, batch_size,
                        share_prompts, share_prefix, generation_config)
    return rollout_from_tokens(tokenizer, enc, rows, stop_ids)


@torch.no_grad()
def generate_ids(
    model: torch.nn.Module,
    tokenizer,
    ids: torch.Tensor,
    mask: torch.Tensor,
    params: SamplingParams,
    batch_size: int | None = None,
    share_prompts: bool = False,
    share_prefix: bool = False,
    generation_config=None,
) -> list[torch.Tensor]:
    """Token in, token out: the sampled continuation of each left-padded context row, ids (N, L)
    and mask (N, L), as N rows of up to params.max_new_tokens ids (pad after a stop), on the CPU.
    `generate` above is this on tokenised prompt texts; multi-turn rollouts call it once per turn
    with the full contexts of the rows still running (rollout/multiturn.py)."""
    from transformers import LogitsProcessorList

    was_training = model.training
    model.eval()
    stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
    if generation_config is None:
        gen_cfg, processors = sampling_config(params, tokenizer, stop_ids)
        settings = own_settings_only(model)
    else:
        gen_cfg, processors, settings = generation_config, [], contextlib.nullcontext()
    device = next(model.parameters()).device
    outs = []
    with merged_lora(model), settings, native_attention():  # no backward here (models/attention.py)
        step = rows_per_call(model, ids, params.max_new_tokens, batch_size)  # after merging: its copy is not free
        for i in range(0, len(ids), step):
            chunk_ids = ids[i : i + step].to(device)
            chunk_mask = mask[i : i + step].to(device)
            cache = shared_prompt_cache(model, chunk_ids, chunk_mask) if share_prompts else None
            if cache is None and share_prefix:
                shared = shared_prefix_prompts(model, chunk_ids, chunk_mask)
                if shared is not None:  # prefix moved to the front; the response columns stay the same
                    chunk_ids, chunk_mask, cache = shared
            seq = model.generate(input_ids=chunk_ids, attention_mask=chunk_mask, generation_config=gen_cfg,
                                 logits_processor=LogitsProcessorList(processors), **cache_kwargs(cache))
            outs.append(seq[:, chunk_ids.shape[1] :].cpu())
    model.train(was_training)
    return [row for o in outs for row in o]


# Share of the free GPU memory the rows of one generate() call may fill (`generation_rows`); the rest
# is headroom for what the per-row figure leaves out (the allocator's rounding, small workspaces).
GPU_GENERATION_SHARE = 0.8


def generation_rows(n_rows: int, batch_size: int | None, row_bytes: int | None = None,
                    free_bytes: int | None = None) -> int:
    """Rows per generate() call for `n_rows` rows. On the CPU (row_bytes None) `batch_size`, all rows
    when None. On a CUDA GPU, where a decoding step costs about the same for 16 rows as for 256
    (launch-bound), the whole batch in one call when GPU_GENERATION_SHARE of `free_bytes` holds
    `n_rows` x `row_bytes` (`decode_row_bytes`), else as many rows as it holds; never fewer than
    `batch_size` (what the user asked for, as before)."""
    if row_bytes is None or free_bytes is None:
        return batch_size or n_rows
    fit = int(GPU_GENERATION_SHARE * free_bytes) // max(row_bytes, 1)
    return max(1, min(n_rows, max(fit, batch_size or 1)))


def decode_row_bytes(config, width: int, bytes_per_value: int) -> int:
    """GPU memory one sampled row takes: its KV cache of `width` positions (prompt + new tokens;
    estimate/memory.py `kv_cache_bytes`, the estimate's formula), one decoder layer's prefill
    transient over the prompt part (bounded by `width`: q, k, v, o and the MLP's three
    intermediates) and the step's three float32 (V,) rows (logits, probabilities, the race's noise)."""
    from rlhfkit.estimate.memory import kv_cache_bytes

    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    prefill = width * (4 * hidden + 3 * inter) * bytes_per_value
    return kv_cache_bytes(layers, kv_heads, head_dim, width, bytes_per_value) + prefill + 3 * config.vocab_size * 4


def rows_per_call(model: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int, batch_size: int | None) -> int:
    """`generation_rows` for context rows `ids` (N, L) on the model's device (free memory counts on CUDA only)."""
    param = next(model.parameters())
    if param.device.type != "cuda":
        return generation_rows(len(ids), batch_size)
    row = decode_row_bytes(model.config, ids.shape[1] + max_new_tokens, param.element_size())
    return generation_rows(len(ids), batch_size, row, free_cuda_bytes(param.device))


def sampling_config(params: SamplingParams, tokenizer, stop_ids: tuple[int, ...]):
    """(GenerationConfig, logits processors) that sample at params.temperature with params'
    truncation, stop ids and length, and nothing else. Full-vocabulary sampling draws with
    ExponentialRaceSampler under greedy selection (same distribution, ~5x cheaper per step than
    torch.multinomial); HF's warpers handle top-k/top-p; temperature 0 is greedy."""
    from transformers import GenerationConfig

    full_vocab = params.temperature > 0 and params.top_k in (0, None) and params.top_p >= 1.0
    hf_sampling = params.temperature > 0 and not full_vocab
    gen_cfg = GenerationConfig(
        do_sample=hf_sampling,
        temperature=params.temperature if hf_sampling else None,
        top_k=(params.top_k or 0) if hf_sampling else None,  # 0: no top-k (HF's own default is 50)
        top_p=params.top_p if hf_sampling else None,
        max_new_tokens=params.max_new_tokens,
        eos_token_id=list(stop_ids),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return gen_cfg, [ExponentialRaceSampler(params.temperature)] if full_vocab else []


@contextlib.contextmanager
def own_settings_only(model: torch.nn.Module):
    """The model's generation_config replaced by a blank one for the wrapped generate() calls.

    transformers fills every field a GenerationConfig leaves unset from `model.generation_config`,
    i.e. from the model folder's generation_config.json. Instruct models ship repetition_penalty,
    min_new_tokens, no_repeat_ngram_size, suppress_tokens, bad_words_ids, forced BOS/EOS, top_k/top_p
    of their own: their logits processors would change what is sampled while the stored log-probs
    come from the plain policy (off-policy data the ratio check cannot see, a forced length)."""
    from transformers import GenerationConfig

    get_base = getattr(model, "get_base_model", None)  # a peft wrapper generates with its base model
    hf = get_base() if callable(get_base) else model
    saved = getattr(hf, "generation_config", None)
    if saved is None:
        yield
        return
    hf.generation_config = GenerationConfig()
    try:
        yield
    finally:
        hf.generation_config = saved


def rollout_from_tokens(tokenizer, enc, responses: list, stop_ids: tuple[int, ...]) -> Rollout:
    """A Rollout from the left-padded prompt encoding and one sampled token sequence per prompt
    (any generation backend): responses right-padded, masked up to and including the first stop."""
    pad = tokenizer.pad_token_id
    rows = [torch.as_tensor(r, dtype=torch.long, device=enc["input_ids"].device) for r in responses]
    width = max(1, max(len(r) for r in rows))
    response = torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=pad) for r in rows])
    rmask, stopped = response_mask(response, stop_ids)
    completions = decode_responses(tokenizer, response, rmask, stopped)
    return Rollout(
        query_ids=enc["input_ids"],
        query_mask=enc["attention_mask"],
        response_ids=response,
        response_mask=rmask.float(),
        stopped=stopped,
        completions=completions,
    )


def decode_responses(tokenizer, response: torch.Tensor, mask: torch.Tensor, stopped: torch.Tensor) -> list[str]:
    """Text of each response without its stop token."""
    texts = []
    for row, m, s in zip(response, mask, stopped):
        n = int(m.sum()) - int(bool(s))
        texts.append(tokenizer.decode(row[:n], skip_special_tokens=True).strip())
    return texts


def trim_rows(rollout: Rollout, rows: slice | torch.Tensor) -> Rollout:
    """The given rows, with all-padding columns trimmed."""
    idx = torch.arange(rollout.response_ids.shape[0], device=rollout.response_ids.device)[rows] if isinstance(rows, slice) else rows
    return trim(rollout.select(idx))
