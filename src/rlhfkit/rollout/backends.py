"""Generation backends for rollouts: HF `generate` (default, runs everywhere), rlhfkit's lean decode
loop (`lean`, rollout/decode.py: the model's forward per step, finished rows dropped), the same loop
with a static KV cache whose steps run as captured CUDA graphs on CUDA (`graph`,
rollout/static_decode.py) or vLLM (GPU only).

Either backend returns only the sampled TOKENS as a Rollout. Log-probs, values and reference
log-probs always come from the trainer's own teacher-forced pass (`logprob_pass`), so the first
update micro-batch still repeats that pass exactly and PPO's ratio check still holds. With vLLM the
tokens come from vLLM's kernels, whose numerics differ slightly from the trainer's; vLLM also reports
its own log-prob of each sampled token (`Rollout.sampler_logprobs`), which the GRPO family's
truncated importance-sampling correction (`tis_cap`) uses. HF generate runs on the trainer itself,
so its rollouts carry none: the correction's weight is exactly 1 there.

vLLM is an optional extra (`pip install 'rlhfkit[vllm]'`, in its own GPU environment), imported
only when `generation_backend=vllm` is asked for. Without it, or without a CUDA GPU, the run falls
back to HF generate and says so. The vLLM path has NOT been run on a GPU by the project yet: it is
tested only against a fake engine (tests/scale/test_generation_backends.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from rlhfkit.core.choices import GENERATION_BACKENDS
from rlhfkit.core.devices import HOST
from rlhfkit.rollout.core import Rollout, SamplingParams, generate, generate_ids, rollout_from_tokens
from rlhfkit.rollout.decode import decode, lean_generate, lean_generate_ids
from rlhfkit.rollout.prompt_fit import encode_prompts
from rlhfkit.rollout.static_decode import static_decode

BACKENDS = GENERATION_BACKENDS


def vllm_unavailable_reason() -> str | None:
    """Why vLLM cannot be used here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install 'rlhfkit[vllm]' in a GPU environment)"
    if not torch.cuda.is_available():
        return "vLLM needs a CUDA GPU and none is visible"
    return None


def select_backend(requested: str) -> tuple[str, str | None]:
    """(backend to use, a message when it is not the requested one)."""
    if requested not in BACKENDS:
        raise ValueError(f"generation_backend={requested!r}: expected one of {', '.join(BACKENDS)}")
    if requested == "vllm":
        reason = vllm_unavailable_reason()
        if reason is not None:
            return "hf", f"generation_backend=vllm is unavailable: {reason}; falling back to HF generate"
    return requested, None


class HFBackend:
    """KV-cached HF `generate` on the training policy itself (no weight copy, nothing to sync)."""

    name = "hf"
    generate_ids = staticmethod(generate_ids)  # context ids -> sampled ids (multi-turn episodes' turns)

    def sync(self, policy) -> None:
        pass

    def generate(self, policy, tokenizer, texts: list[str], params: SamplingParams, seed: int,
                 batch_size: int | None = None, share_prompts: bool = False, share_prefix: bool = False) -> Rollout:
        torch.manual_seed(seed)
        return generate(policy, tokenizer, texts, params, batch_size=batch_size, share_prompts=share_prompts,
                        share_prefix=share_prefix)


class LeanBackend(HFBackend):
    """The lean decode loop (rollout/decode.py) on the training policy: the model's forward per step,
    finished rows dropped; HF generate's tokens when greedy, the same distribution when sampling."""

    name = "lean"
    generate_ids = staticmethod(lean_generate_ids)
    decoder = staticmethod(decode)  # the loop (rollout/decode.py's signature)

    def generate(self, policy, tokenizer, texts: list[str], params: SamplingParams, seed: int,
                 batch_size: int | None = None, share_prompts: bool = False, share_prefix: bool = False) -> Rollout:
        torch.manual_seed(seed)
        return lean_generate(policy, tokenizer, texts, params, batch_size=batch_size, share_prompts=share_prompts,
                             share_prefix=share_prefix, decoder=self.decoder)


class GraphBackend(LeanBackend):
    """The lean loop with a static KV cache (rollout/static_decode.py): on CUDA each decoding step is
    one captured CUDA graph; elsewhere the same steps run eagerly. Greedy, HF generate's tokens."""

    name = "graph"
    generate_ids = staticmethod(functools.partial(lean_generate_ids, decoder=static_decode))
    decoder = staticmethod(static_decode)


class VLLMBackend:
    """Samples with a vLLM engine that holds its own copy of the policy weights.

    `sync(policy)` copies the current weights into the engine (LoRA deltas merged in, the training
    model untouched) and must run before every rollout; `generate` returns token ids only.
    `llm` is a `vllm.LLM` and `sampling_params_cls` is `vllm.SamplingParams` (tests pass fakes).
    """

    name = "vllm"

    def __init__(self, llm, sampling_params_cls, processed_logprobs: bool = True):
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.syncs = 0
        self.processed_logprobs = processed_logprobs  # the engine reports log-probs after temperature

    @classmethod
    def create(cls, model_path: str | Path, dtype: str, gpu_memory_utilization: float, max_model_len: int | None,
               seed: int, num_processes: int = 1) -> VLLMBackend:
        """A colocated engine on this process's GPU (untested: no GPU in the project's CI)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process: weights loadable
        from vllm import LLM
        from vllm import SamplingParams as VLLMSamplingParams

        kwargs = {"model": str(model_path), "dtype": "bfloat16" if dtype == "bf16" else "float32",
                  "gpu_memory_utilization": gpu_memory_utilization, "seed": seed, "max_model_len": max_model_len}
        if num_processes > 1:  # one engine per training process, inside the torchrun/accelerate world
            kwargs["distributed_executor_backend"] = "external_launcher"
        try:  # log-probs of the temperature-scaled distribution that sampled (vLLM >= 0.10.2)
            return cls(LLM(**kwargs, logprobs_mode="processed_logprobs"), VLLMSamplingParams)
        except TypeError:  # an older vLLM reports the raw (temperature 1) log-probs only
            return cls(LLM(**kwargs), VLLMSamplingParams, processed_logprobs=False)

    def sampling_params(self, params: SamplingParams, seed: int):
        """vLLM's SamplingParams for one request: the same distribution as HF sampling (full
        vocabulary at temperature T unless top_k/top_p are set), token ids only."""
        return self.sampling_params_cls(
            n=1, temperature=params.temperature, top_k=params.top_k if params.top_k else -1, top_p=params.top_p,
            max_tokens=params.max_new_tokens, stop_token_ids=list(params.stop_ids), seed=seed, detokenize=False,
            logprobs=0)  # 0: the sampled token's own log-prob only

    def sync(self, policy) -> None:
        model = _engine_model(self.llm)
        model.load_weights(weights=merged_weights(policy))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):  # cached prompt KV was computed with the old weights
            reset()
        self.syncs += 1

    def generate(self, policy, tokenizer, texts: list[str], params: SamplingParams, seed: int,
                 batch_size: int | None = None, share_prompts: bool = False, share_prefix: bool = False) -> Rollout:
        """`share_prompts`, `share_prefix`: accepted for the common interface; vLLM caches shared prefixes itself."""
        enc = encode_prompts(tokenizer, texts, params.max_prompt_length)  # the same prompt cut as HF generate
        stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
        params = dataclasses.replace(params, stop_ids=stop_ids)
        prompts = [{"prompt_token_ids": ids[m.bool()].tolist()} for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        sampling = [self.sampling_params(params, request_seed(seed, i)) for i in range(len(prompts))]
        outputs = self.llm.generate(prompts, sampling_params=sampling, use_tqdm=False)
        rollout = rollout_from_tokens(tokenizer, enc, [completion_ids(o.outputs[0], stop_ids) for o in outputs], stop_ids)
        if self.processed_logprobs or params.temperature == 1.0:
            rollout = dataclasses.replace(rollout, sampler_logprobs=sampled_logprobs(
                [o.outputs[0] for o in outputs], rollout.response_ids.shape[1]))
        return rollout


def sampled_logprobs(outs: list, width: int) -> torch.Tensor | None:
    """(B, width) the log-prob vLLM reported for each sampled token; NaN where it reported none (a stop
    token `completion_ids` appended, padding). None when the engine returned no log-probs at all."""
    if any(getattr(o, "logprobs", None) is None for o in outs):
        return None
    table = torch.full((len(outs), width), float("nan"), device=HOST)
    for i, out in enumerate(outs):
        for t, (token, options) in enumerate(zip(list(out.token_ids)[:width], out.logprobs)):
            table[i, t] = float(options[token].logprob)
    return table


def request_seed(seed: int, i: int) -> int:
    """A distinct seed per request: identical prompts (a GRPO group) must not give identical samples."""
    return (seed * 1_000_003 + i) % 2**63


def completion_ids(out, stop_ids: tuple[int, ...]) -> list[int]:
    """Sampled token ids of one vLLM completion, ending with the stop token when it stopped on one."""
    ids = list(out.token_ids)
    stop = getattr(out, "stop_reason", None)
    if getattr(out, "finish_reason", None) == "stop" and isinstance(stop, int) and (not ids or ids[-1] != stop):
        ids.append(stop)
    return ids


def merged_weights(policy) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face parameter name, tensor) of the policy's current weights: for a LoRA model the
    base weights plus each adapter's delta, computed without merging into (or changing) the model;
    names as in the base model's checkpoint, which is what vLLM's `load_weights` reads."""
    deltas = {}
    for name, module in policy.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            active = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
            if active:
                with torch.no_grad():
                    d = sum(module.get_delta_weight(a) for a in active)
                deltas[_hf_name(name + ".base_layer.weight")] = d.full_tensor() if hasattr(d, "full_tensor") else d
    for name, p in policy.named_parameters():
        if "lora_" in name:
            continue
        key = _hf_name(name)
        w = p.detach()
        w = w.full_tensor() if hasattr(w, "full_tensor") else w  # FSDP2 DTensor shard -> full weight
        yield key, (w + deltas[key].to(w.dtype)) if key in deltas else w


def _hf_name(name: str) -> str:
    """peft parameter name -> the base model's own name."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace(".base_layer.", ".")


def _engine_model(llm):
    """The torch model inside an in-process vLLM engine (V1 with VLLM_ENABLE_V1_MULTIPROCESSING=0, or V0)."""
    executor = llm.llm_engine.model_executor
    worker = executor.driver_worker
    worker = getattr(worker, "worker", worker)
    return worker.model_runner.model


class BackendOptions(Protocol):
    """What `make_backend` reads of a config: trainers/options.GenerationArgs, the dtype and the seed."""

    generation_backend: str
    dtype: str
    seed: int
    vllm_gpu_memory_utilization: float
    vllm_max_model_len: int | None


def make_backend(cfg: BackendOptions, model_path, num_processes: int = 1, log=print):
    """The backend `cfg.generation_backend` asks for, falling back to HF generate (with a message
    through `log`) where vLLM cannot run."""
    name, message = select_backend(cfg.generation_backend)
    if message:
        log(f"[rlhfkit] {message}")
    if name in ("hf", "lean", "graph"):
        return {"hf": HFBackend, "lean": LeanBackend, "graph": GraphBackend}[name]()
    return VLLMBackend.create(model_path, cfg.dtype, cfg.vllm_gpu_memory_utilization, cfg.vllm_max_model_len,
                              cfg.seed, num_processes)
