"""Memory estimate per device for an rlhfkit run: `rlhfkit estimate-memory model=... key=value`.
Options shared with the method's trainer default to that trainer's defaults (`for_method`).

Formulas (docs/scale.md explains each one). P = parameters of the policy, T = trainable parameters
(LoRA adapters, or P), H hidden size, L layers, V vocabulary, d head size, kv key/value heads,
b_c = bytes of the compute dtype (2 for bf16, 4 for fp32), N devices.

  policy weights   LoRA: P * b_c + T * 4      full: P * 4 (trainable weights stay fp32)
  gradients        T * 4
  DDP buckets      sharding=none on N > 1 devices: T * 4, torch DDP's flat copy of the gradients it
                   all-reduces (allocated when the model is wrapped, kept for the run: DDP's default
                   gradient_as_bucket_view=False, as accelerate leaves it)
  optimiser        T * 8 (AdamW: two fp32 moments)
  reference        LoRA: 0 (the adapter-disabled policy)   full: linear layers * b_c + the rest * 4
                   (embeddings, norms, head stay fp32)   offloaded: 0 (CPU memory)
  teacher          method=distill (or grpo with a teacher): the frozen teacher, counted as a full
                   fine-tuning reference of the teacher's shape (linear layers * b_c + the rest * 4)
  teacher logits   distill_loss=jsd: the teacher's logits of a micro-batch, m * R * V * 12 (float32
                   logits, log-softmax, probabilities), or with distill_topk K: m * R * K * 12 (kept values,
                   int64 indices); the student's full logits then take m * R * V * 16 instead of the fused
                   head's 8 (logits, log-softmax, probabilities, gradient)
  value head       (H + 1) * 16 (weights, gradient, two moments, fp32); PPO only
  KV cache         2 * L * kv * d * generation_batch * (prompt + new tokens) * b_c
  generation gather  sharding=zero3 only: P * b_c, the full policy gathered while it samples (DeepSpeed
                   ZeRO-3 and FSDP2 full shard both gather it once per generation)
  merged LoRA      one process, LoRA: A * b_c, a merged copy of the A adapted base weights
                   while sampling (models/lora.py; CPU and GPU alike)
  activations      L_bw * m * S * H * 34 * b_c / 2 (Korthikanti et al. 2022, with fused attention);
                   with gradient checkpointing L_bw * m * S * H * b_c + one layer's 34 * m * S * H * b_c / 2
  logits           m * R * V * 8 (the fused head's fp32 buffers: log-softmax and probabilities; kept for
                   the backward only when the output layer trains, i.e. full fine-tuning; a frozen
                   one's stay allocated on the CPU as a reused workspace)
  process baseline CPU only: the resident memory of an rlhfkit process with its model and tokenizer
                   loaded, less the weights (Python, torch, transformers, the tokenizer and what
                   loading leaves in the heap), measured once (PROCESS_BASELINE)
  heap retention   CPU only: CPU_HEAP_RETENTION * (activations + logits), freed blocks glibc keeps
                   that micro-batches of other widths do not reuse (training phase)
  TRPO's policy step (method=trpo; trainers/trpo.py): no AdamW moments for the policy, instead ~7 flat
  vectors of T (conjugate gradients, the step, theta_old: "optimiser"); the rollout's float32 logits,
  B * R * V * 4 ("old logits", the KL's p_old); the Fisher graphs of F = ceil(fvp_fraction * B) rows,
  all kept through the conjugate gradients: 2 * L_bw * F * S * H activations (the forward's and the
  J^T u graph's) and 3 * F * R * V * 4 (z, p, u); each product then backs through one chunk (its
  activations and 3 more (rows, R, V) float32 tensors). The step's peak is the larger of the gradient
  pass (a micro-batch chunk, as PPO) and the products.

On the CPU a micro-batch that runs more than CHUNK_POSITIONS positions runs in row chunks
(rollout/logprobs.py; PPO, the GRPO family, DPO/SimPO/ORPO, KTO and SFT), so activations count at
most min(m * R + p * P, max(CHUNK_POSITIONS, S)) positions (a chunk holds at most the
budget, or one row alone, whatever the widths up to P and R), and logits that share of the m rows;
activations take the factor measured there (`cpu_activation_bytes` per position, layer and hidden
unit: by dtype, LoRA dropout or not, and full fine-tuning; bench/activation_bytes.py) instead of
34 / 2 * b_c.

m = sequences per micro-batch (2 per pair for DPO and the reward model, which has no logits),
g = sequences sharing a prompt that runs once (group_size: activations count m * R + p * P
positions, m * S for g = 1; p = the micro-batch's distinct prompts, ceil(m / g) for whole groups in
order, ceil(m * B / (g * M)) + 1 where GRPO shuffles a rollout of B rows into mini-batches of M < B:
`prompts_per_micro_batch`), P prompt tokens, S = P + R, R = response tokens, L_bw = layers the backward pass
goes through (the top `lora_layers` with LoRA on them, else L). ZeRO-2 divides gradients and
optimiser by N; ZeRO-3 / FSDP full shard also the policy weights. The reference is counted whole (DeepSpeed
keeps it so; FSDP2 shards a frozen copy, so there the figure is an upper bound).
Activation figures are rough (within ~2x); weights, gradients, optimiser and KV cache are exact
counts of what the tensors hold (allocator overhead and CUDA context, ~0.5-1 GiB, come on top).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rlhfkit.core.config import FrozenAfterValidation, check, option
from rlhfkit.errors import ConfigError
from rlhfkit.estimate.shape import PRESETS, ModelShape, resolve_shape

GIB = 2**30

# Resident memory of an rlhfkit process with the default model (bf16) and its tokenizer loaded, less
# the weights' own 0.269 GB (Python, torch, transformers, the tokenizer, and what loading the model
# leaves in the heap): 0.681 GB resident, bench/activation_bytes.py, Linux x86-64, torch 2.13,
# transformers 5 (the demos' first phase starts at 0.65-0.66 GiB alike, bench/memory_phases.py).
PROCESS_BASELINE = 0.41e9
# rollout/logprobs.py CHUNK_POSITIONS (tests/scale/test_memory_estimate.py keeps the two equal; this
# module does not import torch).
CHUNK_POSITIONS = 640
CHUNKED_METHODS = ("ppo", "trpo", "grpo", "dpo", "sft", "distill")
TRPO_FLAT_VECTORS = 7  # algos/trpo.py: CG's x, r, p, A p; F x; the step; theta_old (+ the gradient)
# The methods the estimate models (commands/estimate_memory.py takes their trainers' defaults).
ESTIMATED_METHODS = ("ppo", "trpo", "grpo", "dpo", "sft", "rm", "distill")
# Their trainers' default LoRA dropout where it is not 0 (tests/scale/test_memory_estimate.py keeps the
# two equal; this module imports no trainer).
TRAINER_LORA_DROPOUT = {"sft": 0.05}
# Activation bytes per position, layer and hidden unit on the CPU: what autograd keeps after a
# forward of SmolLM2-135M's decoder (bench/activation_bytes.py, 8 rows x 100 tokens, LoRA r=16 on every
# layer), keyed by (dtype, kind): "lora" without dropout (the RL and preference trainers), "dropout"
# (LoRA dropout > 0, SFT's 0.05: each dropout layer keeps its own copy of its projection's input),
# "full" fine-tuning (bf16: float32 weights under autocast, whose bf16 copies held during the forward
# are in the figure). The GPU formula: 34 / 2 x b_c.
CPU_ACTIVATION_BYTES = {("bf16", "lora"): 54, ("bf16", "dropout"): 88, ("bf16", "full"): 69,
                        ("fp32", "lora"): 71, ("fp32", "dropout"): 121, ("fp32", "full"): 78}
# glibc keeps freed blocks in the heap (core/allocator.py), and micro-batches or chunks of other
# widths do not reuse all of them: on the CPU RSS holds this share of the training phase's transient
# (activations + logits) on top. Fitted to the default demos (docs/benchmarks.md, "Peak memory of the
# default demos": with the activation bytes and baseline above, the demos' peaks imply 0.4-0.6 for
# most, 0.7-0.9 for the GRPO family's whole runs, whose heaps keep more free space after many
# updates; 0.5 keeps both within 20%).
CPU_HEAP_RETENTION = 0.5
# Of one GPU's memory the estimated peak may fill when `gpu_memory_gib` sizes a micro-batch: the CUDA context
# (~0.5-1 GiB), the allocator's cache and the estimate's rough activations take the rest.
GPU_FIT_SHARE = 0.9
FIT_METHODS = ("ppo", "grpo")


@dataclass
class MemoryArgs(FrozenAfterValidation):
    """Estimate the memory each device needs for an rlhfkit run (docs/scale.md has the formulas)."""

    model: str = option("smollm2-135m", f"a preset ({', '.join(PRESETS)}), a local model folder (config.json) "
                                         "or a Hub id (org/name[@revision], its config.json only)")
    method: str = option("ppo", "trainer: ppo and trpo have a value head; ppo/trpo/grpo/dpo a reference; sft/rm "
                         "neither; trpo keeps the rollout's logits and Fisher graphs through its policy step. The "
                         "options below that the trainer has too (lora_layers, micro_batch_size, group_size, "
                         "max_new_tokens, ...) default to that trainer's defaults (`rlhfkit grpo --help`), not the "
                         "defaults listed here",
                         ESTIMATED_METHODS)
    lora: bool = option(True, "LoRA adapters (frozen base, no reference copy) or full fine-tuning")
    lora_r: int = option(16, "LoRA rank")
    lora_layers: int | None = option(None, "adapt only the top N layers (None: all)")
    dtype: str = option("bf16", "compute dtype", ("bf16", "fp32"))
    device: str = option("gpu", "where the run computes: on the CPU the process's own memory counts (imports) "
                         "and long micro-batches run in row chunks", ("gpu", "cpu"))
    num_devices: int = option(1, "data-parallel devices (GPUs, or processes)")
    sharding: str = option("none", "none = DDP (full copy per device; on N > 1 devices also DDP's flat copy of the "
                           "gradients it all-reduces); zero2 = gradients+optimiser sharded; "
                           "zero3 = also weights (textbook ZeRO-3; rlhfkit refuses DeepSpeed); fsdp2 = what rlhfkit's "
                           "FSDP2 runs (configs/accelerate/fsdp2*.yaml): weights, gradients, optimiser and full "
                           "fine-tuning's frozen reference sharded, the whole model on every device while it loads, "
                           "the whole policy gathered while sampling (its layers in bf16 when dtype=bf16), the root "
                           "(embeddings, output layer) and two layers gathered while training",
                           ("none", "zero2", "zero3", "fsdp2"))
    offload_reference: bool = option(False, "frozen reference kept in CPU memory between scoring passes")
    teacher: str | None = option(None, "method=distill, or grpo with a distillation term: the teacher (a preset, "
                                 "folder or Hub id, its config.json only), counted frozen (linear layers in the "
                                 "compute dtype). None: method=distill's teacher has the model's shape; grpo none")
    distill_loss: str = option("reverse-kl", "method=distill: reverse-kl reads the teacher's log-prob of each "
                               "sampled token (no logits kept); jsd keeps the teacher's and the student's logits of "
                               "a micro-batch", ("reverse-kl", "jsd"))
    distill_topk: int | None = option(None, "method=distill with distill_loss=jsd: teacher logits kept per position "
                                      "(None: the vocabulary)")
    gradient_checkpointing: bool = option(False, "store one tensor per layer and recompute the rest in backward")
    lora_dropout: float | None = option(None, "LoRA dropout; None: the trainer's default (sft 0.05, the others 0). "
                                        "On the CPU each dropout layer keeps a copy of its input for the backward")
    micro_batch_size: int = option(8, "sequences per forward/backward")
    prompt_length: int = option(128, "prompt tokens (padded width)")
    max_new_tokens: int = option(128, "response tokens")
    prompts_per_generate: int = option(16, "prompts per generate() call (the KV cache is for this many)")
    group_size: int = option(1, "sequences of a micro-batch that share one prompt, run once (share_prompts: "
                             "GRPO's group_size, 2 for a DPO pair); 1 = every sequence runs its prompt")
    rollout_batch_size: int = option(16, "sequences per rollout (method=trpo: the policy step keeps their logits; "
                                     "method=grpo: with mini_batch_size, how many prompts a micro-batch holds)")
    mini_batch_size: int | None = option(None, "method=grpo: sequences per optimiser step (None = the rollout). Rows "
                                         "are shuffled into mini-batches, so a micro-batch of a smaller one holds "
                                         "rows of more prompts (each prompt's tokens run once per micro-batch)")
    fvp_fraction: float = option(0.25, "method=trpo: share of the rollout's sequences in the Fisher-vector products")
    cpu_chunk_positions: int = option(CHUNK_POSITIONS, "device=cpu: the trainers' row-chunk budget (their "
                                      "cpu_chunk_positions): positions one forward runs at most")
    gpu_memory_gib: float | None = option(None, "device=gpu, method ppo or grpo: one GPU's memory in GiB (e.g. 80); "
                                          "also print the largest micro_batch_size whose estimated peak fits in "
                                          f"{GPU_FIT_SHARE:.0%} of it, a divisor of the mini-batch (so gradient "
                                          "accumulation stays whole)")

    def validate(self) -> None:
        for k in ("lora_r", "num_devices", "micro_batch_size", "prompt_length", "max_new_tokens",
                  "prompts_per_generate", "group_size", "rollout_batch_size", "cpu_chunk_positions"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.mini_batch_size is None or self.mini_batch_size >= 1,
              f"mini_batch_size ({self.mini_batch_size}) must be >= 1")
        check(0 < self.fvp_fraction <= 1, f"fvp_fraction ({self.fvp_fraction}) must be in (0, 1]")
        check(self.lora_dropout is None or 0 <= self.lora_dropout < 1,
              f"lora_dropout ({self.lora_dropout}) must be in [0, 1)")
        check(self.distill_topk is None or self.distill_topk >= 1,
              f"distill_topk ({self.distill_topk}) must be >= 1 or None")
        check(self.gpu_memory_gib is None or self.gpu_memory_gib > 0,
              f"gpu_memory_gib ({self.gpu_memory_gib}) must be > 0")


def estimate(args: MemoryArgs, shape: ModelShape | None = None) -> dict[str, float]:
    """Bytes per device of each component, and of the generation, training and peak phases."""
    s = shape or resolve_shape(args.model)
    P, bc, N = s.param_count(), (2 if args.dtype == "bf16" else 4), args.num_devices
    T = s.lora_count(args.lora_r, args.lora_layers) if args.lora else P
    weights = P * bc + T * 4 if args.lora else P * 4
    grads, optim = T * 4, T * 8
    fsdp2 = args.sharding == "fsdp2"
    whole_weights = weights
    if args.sharding in ("zero2", "zero3", "fsdp2"):
        grads, optim = grads / N, optim / N
    if args.sharding in ("zero3", "fsdp2"):
        weights = weights / N
    trpo = args.method == "trpo"
    if trpo:  # no AdamW moments: the natural-gradient step's flat vectors
        optim = TRPO_FLAT_VECTORS * T * 4
    has_ref = args.method in ("ppo", "trpo", "grpo", "dpo") and not args.lora and not args.offload_reference
    sampling = args.method in ("ppo", "trpo", "grpo", "distill")
    merged_sampling = sampling and args.lora and N == 1
    S, R = args.prompt_length + args.max_new_tokens, args.max_new_tokens
    cpu = args.device == "cpu"
    jsd = args.method == "distill" and args.distill_loss == "jsd"
    per_position = cpu_activation_bytes(args) if cpu else 34 * bc / 2  # bytes per layer and hidden unit
    logit_rows, positions = forward_size(args)
    layer_acts = positions * s.hidden * per_position
    bw_layers = min(args.lora_layers, s.layers) if (args.lora and args.lora_layers) else s.layers
    acts = (bw_layers * positions * s.hidden * bc + layer_acts) if args.gradient_checkpointing else bw_layers * layer_acts
    # the frozen copy keeps its linear layers in b_c, embeddings, norms and head in fp32 (models/policy.py)
    reference = ((P - s.kept_fp32_in_reference()) * bc + s.kept_fp32_in_reference() * 4) if has_ref else 0
    out = {
        "policy weights": weights,
        "gradients": grads,
        "DDP buckets": T * 4 if args.sharding == "none" and N > 1 else 0,
        "optimiser": optim,
        "reference": reference / N if fsdp2 else reference,  # FSDP2 shards full fine-tuning's frozen copy
        "value head": (s.hidden + 1) * 16 if args.method in ("ppo", "trpo") else 0,
        "KV cache": kv_cache_bytes(s.layers, s.kv_heads, s.d, args.prompts_per_generate * S, bc) if sampling else 0,
        "generation gather": (P * bc if args.sharding == "zero3" else fsdp2_gather(args, s, T)["policy"] if fsdp2
                              else 0) if sampling else 0,
        "training gather": fsdp2_gather(args, s, T)["training"] if fsdp2 else 0,
        "merged LoRA": s.adapted_count(args.lora_layers) * bc if merged_sampling else 0,
        "activations": acts,
        # response positions only: the fused head's two float32 buffers; TRPO's full logits four
        # (the head's output, its float32 copy, the log-softmax and its gradient)
        "logits": 0 if args.method == "rm" else logit_rows * R * s.vocab * (16 if trpo or jsd else 8),
        "teacher": teacher_bytes(args, bc),
        "teacher logits": logit_rows * R * min(args.distill_topk or s.vocab, s.vocab) * 12 if jsd else 0,
        "process baseline": PROCESS_BASELINE if cpu else 0,  # the GPU's own memory holds no imports
        **trpo_terms(args, s, bw_layers * s.hidden * per_position, logit_rows, positions),
    }
    retain = CPU_HEAP_RETENTION if cpu else 0.0
    out["heap retention"] = retain * (acts + out["logits"])
    persistent = (out["policy weights"] + out["DDP buckets"] + out["optimiser"] + out["reference"] + out["value head"]
                  + out["teacher"] + out["process baseline"])
    out["generation phase"] = persistent + out["KV cache"] + out["generation gather"] + out["merged LoRA"]
    transient = out["activations"] + out["logits"] + out["teacher logits"] + out["heap retention"]
    if trpo:  # the gradient pass, or the Fisher graphs with one product running through them
        transient = max(transient, out["Fisher graphs"] + (1 + retain) * out["Fisher product"])
    out["training phase"] = persistent + out["gradients"] + out["old logits"] + out["training gather"] + transient
    # FSDP2: every process loads the whole policy into CPU memory and shards it onto the device one unit
    # at a time (Run.prepare), and moves the whole frozen copy onto the device before sharding it
    # (trainers/rl.py, trainers/offline.py: Reference.to, then Run.shard_reference). On the CPU both are
    # whole in the process at once; on a GPU the whole copy beside the policy's shards.
    out["loading phase"] = ((whole_weights if cpu else weights) + reference + out["value head"] + out["teacher"]
                            + out["process baseline"]) if fsdp2 else 0
    out["peak"] = max(out["generation phase"], out["training phase"], out["loading phase"])
    out["parameters"], out["trainable"] = P, T
    return out


def fsdp2_gather(args: MemoryArgs, s: ModelShape, trainable: int) -> dict[str, float]:
    """Bytes FSDP2 (runtime/fsdp2.py) holds gathered beside the shards. "policy": the whole policy while
    it samples (`full_weights`): the decoder layers (with their adapters) in bf16 when the run computes
    in bf16 (the layers' MixedPrecisionPolicy), else in their stored dtype (fp32: full fine-tuning's
    weights, a LoRA run's fp32 base), and the root (embeddings, untied output layer, final norm) in its
    stored dtype (no policy on the root: fp32 for full fine-tuning, b_c for a LoRA base). "training":
    the root's weights, kept from its forward to its backward, its whole fp32 gradient before the
    reduce-scatter (full fine-tuning), two layers gathered at once (one running, the next
    prefetched), and, when a step accumulates micro-batches, the whole fp32 gradient of every
    trainable parameter: the micro-batches before the last one keep their gradients unsharded
    (runtime/distributed.py `no_sync`: `set_requires_gradient_sync(False)`). The RL methods accumulate
    when micro_batch_size < the mini-batch (or rollout); the others are counted as accumulating."""
    root = s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden
    layers = s.param_count() - root + (trainable if args.lora else 0)  # with the adapters
    gathered = 2 if args.dtype == "bf16" else 4
    stored = 4 if not args.lora else (2 if args.dtype == "bf16" else 4)
    rl = args.method in ("ppo", "trpo", "grpo", "distill")
    accumulating = not rl or args.micro_batch_size < (args.mini_batch_size or args.rollout_batch_size)
    return {"policy": layers * gathered + root * stored,
            "training": (root * stored + (0 if args.lora else root * 4) + 2 * layers / s.layers * gathered
                         + (trainable * 4 if accumulating else 0))}


def teacher_bytes(args: MemoryArgs, bytes_per_value: int) -> float:
    """The frozen teacher's weights: its linear layers in the compute dtype, embeddings and norms in
    fp32 (models/policy.py store_linear_weights). method=distill without `teacher`: the model's shape."""
    if args.method not in ("distill", "grpo") or not (args.teacher or args.method == "distill"):
        return 0
    t = resolve_shape(args.teacher or args.model)
    P, kept = t.param_count(), t.kept_fp32_in_reference()
    return (P - kept) * bytes_per_value + kept * 4


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, positions: int, bytes_per_value: int) -> int:
    """Bytes of the keys and values a decoder caches for `positions` positions (rows x columns):
    2 x L x kv x d x positions x b_c. The estimate's "KV cache" line, and what sampling on a GPU
    sizes its generate() calls by (rollout/core.py `generation_rows`)."""
    return 2 * layers * kv_heads * head_dim * positions * bytes_per_value


def cpu_activation_bytes(args: MemoryArgs) -> float:
    """CPU_ACTIVATION_BYTES for the run's dtype and kind (LoRA with or without dropout, full)."""
    dropout = args.lora_dropout if args.lora_dropout is not None else TRAINER_LORA_DROPOUT.get(args.method, 0.0)
    kind = "full" if not args.lora else ("dropout" if dropout > 0 else "lora")
    return CPU_ACTIVATION_BYTES[(args.dtype, kind)]


def forward_size(args: MemoryArgs) -> tuple[float, float]:
    """(sequences, positions) of the largest forward the training phase runs: a micro-batch of m
    sequences (2 per DPO / reward-model pair), a prompt shared by group_size of them running once;
    on the CPU at most the row-chunk budget, or one row alone, at any widths up to P and R (a chunk
    of the budget is a share m x chunk / positions of the rows)."""
    S, R = args.prompt_length + args.max_new_tokens, args.max_new_tokens
    m = args.micro_batch_size * (2 if args.method in ("dpo", "rm") else 1)
    positions = m * R + prompts_per_micro_batch(args) * args.prompt_length
    if args.device == "cpu" and args.method in CHUNKED_METHODS:
        chunk = min(positions, max(args.cpu_chunk_positions, S))
        return m * chunk / positions, chunk
    return m, positions


def prompts_per_micro_batch(args: MemoryArgs) -> int:
    """Distinct prompts in a micro-batch of m sequences, g of them per prompt (group_size). DPO's
    pairs: ceil(m / g). A GRPO rollout of B rows updated whole (mini-batch = rollout, rows in group
    order): ceil(m / g), or one more where micro-batches straddle groups. GRPO shuffles the rollout
    into mini-batches of M rows (trainers/rl_update.py shuffled_rows: random rows, then sorted by
    prompt): with M < B a mini-batch holds about k = g x M / B rows of each prompt, so a micro-batch spans
    ceil(m / k) + 1 of them (the +1: it starts inside a prompt's rows), at most min(m, ceil(B / g)).
    That is the mean over shuffles of the largest micro-batch's count, 4.84 against 5 for
    B=64, M=32, m=16, g=8 (tests/scale/test_memory_estimate.py draws the shuffles)."""
    m, g = args.micro_batch_size * (2 if args.method in ("dpo", "rm") else 1), args.group_size
    if g == 1:
        return m
    if args.method != "grpo":  # DPO's pairs: whole pairs per micro-batch
        return -(-m // g)
    B = args.rollout_batch_size
    M = min(args.mini_batch_size or B, B)
    if M >= B:  # whole groups in order: the most groups any micro-batch (the last may be short) spans
        return max((j * m + min(m, B - j * m) - 1) // g - (j * m) // g + 1 for j in range(-(-B // m)))
    return min(m, -(-B // g), math.ceil(m * B / (g * M)) + 1)


def trpo_terms(args: MemoryArgs, s: ModelShape, bytes_per_position: float, chunk_rows: float,
               chunk_positions: float) -> dict[str, float]:
    """TRPO's policy step (module doc): the rollout's float32 logits, the Fisher graphs of its
    F = ceil(fvp_fraction x B) rows, and one Fisher-vector product's transient (one chunk of them).
    `bytes_per_position`: activation bytes of one position through the layers the backward reaches."""
    if args.method != "trpo":
        return {"old logits": 0, "Fisher graphs": 0, "Fisher product": 0}
    S, R, V = args.prompt_length + args.max_new_tokens, args.max_new_tokens, s.vocab
    rows = math.ceil(args.rollout_batch_size * args.fvp_fraction)  # as algos/trpo.py fisher_rows draws
    per_row = chunk_positions / chunk_rows  # positions per row as the chunks run them
    return {"old logits": args.rollout_batch_size * R * V * 4,
            "Fisher graphs": 2 * rows * S * bytes_per_position + 3 * rows * R * V * 4,
            "Fisher product": (min(rows, chunk_rows) * per_row * bytes_per_position
                               + 3 * min(rows, chunk_rows) * R * V * 4)}


def micro_batch_that_fits(args: MemoryArgs, budget_bytes: float, shape: ModelShape | None = None) -> int | None:
    """The largest micro_batch_size whose estimated peak (`estimate`) is at most `budget_bytes`, among the divisors
    of the rows one optimiser step takes (mini_batch_size, else the rollout), so gradient accumulation stays
    whole: a mini-batch of 48 tries 48, 24, 16, 12, ... None when not even one row fits (the weights, optimiser or
    the KV cache alone outgrow it)."""
    s = shape or resolve_shape(args.model)
    rows = args.mini_batch_size or args.rollout_batch_size
    for m in sorted((d for d in range(1, rows + 1) if rows % d == 0), reverse=True):
        if estimate(dataclasses.replace(args, micro_batch_size=m), s)["peak"] <= budget_bytes:
            return m
    return None


# ----------------------------------------------------------------------------- a rollout's own tensors

# Bytes per rollout row (rollout/core.py Rollout): prompt ids and mask, 16 * P (int64); response ids,
# 8 * R; eight float32 (B, R) tensors (mask, log-probs, reference log-probs, values, entropy, rewards,
# advantages, returns), 32 * R. Texts, the trunk cache and the passes' activations come on top.
ROLLOUT_PROMPT_BYTES, ROLLOUT_RESPONSE_BYTES = 16, 40


def rollout_bytes(rows: int, prompt_tokens: int, new_tokens: int) -> float:
    """The least memory one iteration's rollout of `rows` rows holds."""
    return float(rows) * (ROLLOUT_PROMPT_BYTES * prompt_tokens + ROLLOUT_RESPONSE_BYTES * new_tokens)


def machine_memory() -> int | None:
    """Physical memory of this machine in bytes (None where the platform does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_rollout_fits(rows: int, prompt_tokens: int, new_tokens: int, memory: int | None = None,
                       option: tuple[str, int] | None = None, what: str = "its rollout tensors") -> None:
    """Refuse, before anything is allocated, a rollout whose tensors alone outgrow the machine's
    memory (rollout_batch_size=1e9 would otherwise grow for minutes, deaf to signals while a
    huge allocation runs). `option`: the setting that makes the rows, and its value, for the message
    (default: rollout_batch_size = rows); `what` names the tensors (an offline batch's)."""
    memory = machine_memory() if memory is None else memory
    need = rollout_bytes(rows, prompt_tokens, new_tokens)
    name, value = option or ("rollout_batch_size", rows)
    if memory is not None and need > memory:
        raise ConfigError(f"{name} ({value}) needs ~{need / 2**30:,.1f} GiB for {what} alone "
                          f"({prompt_tokens} prompt + {new_tokens} response tokens a row), more than this machine's "
                          f"{memory / 2**30:,.1f} GiB: lower {name} (rlhfkit estimate-memory shows the rest)")
