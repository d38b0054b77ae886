"""The option groups trainer configs (and the configs of eval, tpo and prefs) are made of (each
field's help text is its --help line); what scores an RL rollout (reward servers, judges, code, an
environment, an agent) has its groups in trainers/reward_options.py.

Each option is declared once, in one group (a dataclass mixin here) or, when only one command has it,
in that command's config. A command's config mixes in the groups it needs and adds its own fields;
`core.config.build_config` runs every group's `validate()` (mixins first), so a range is checked in
one place, then applies the values a group's `derived()` works out (the resolved dtype) and freezes
the config (RunArgs is FrozenAfterValidation). However a config is built (command line, YAML, the
class called in Python, dataclasses.replace) it goes through that path.

To add options: put options two commands share in a group here (or extend one), and mix it into
both configs; an option only one command has is declared in its config. A command that needs its
own default or help text for a group's option writes ``name = retune(default, "help")`` (no type)
in its config: the same option, not a second declaration (tests/test_config_contract.py counts
declarations). A group mixed in earlier in a config's bases comes later in --help.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.bounds import MAX_STEPS, check_planned_steps, check_warmup
from rlhfkit.core.choices import (
    DTYPES,
    GENERATION_BACKENDS,
    KL_LOSS_ESTIMATORS,
    LR_SCHEDULES,
    OPTIMIZERS,
    PROMPT_OVERFLOW_MODES,
)
from rlhfkit.core.config import FrozenAfterValidation, check, option, retune
from rlhfkit.core.environment import check_environment
from rlhfkit.trainers.reward_options import REWARD_SPECS_HELP

OVERFLOW_MODES = PROMPT_OVERFLOW_MODES



@dataclass
class ModelNameArgs:
    """The model a command loads (the trainers' policy; the model eval, tpo and prefs sample from)."""

    model: str = option("smollm2-135m-instruct", "policy: 'smollm2-135m-instruct' (built in), a local HF model folder, "
                        "or a Hub id org/name[@revision] (downloaded once into the HF_HOME cache)")


@dataclass
class DtypeArgs:
    """The compute dtype of a loaded model; `auto` is resolved when the config is built."""

    dtype: str = option("auto", "compute dtype. bf16: frozen base weights in bf16 and bf16 autocast (fast on GPUs and "
                        "CPUs with AVX-512 BF16, slow on CPUs without: docs/benchmarks.md); trainable weights and "
                        "optimiser state stay fp32. auto: bf16 where it is fast, else fp32", DTYPES)

    def derived(self) -> dict:
        """dtype auto becomes bf16 where bf16 matmuls are fast, else fp32 (config.yaml records it)."""
        from rlhfkit.models.loading import resolve_dtype

        return {"dtype": resolve_dtype(self.dtype)}


@dataclass
class SeedArgs:
    seed: int = option(0, "seed for initialisation and data order; sampling uses seed + rank * prime + iteration")

    def validate(self) -> None:
        check(0 <= self.seed < 2**63, f"seed ({self.seed}) must be in [0, 2**63 - 1]")


@dataclass
class PromptsArgs:
    prompts: str = option("builtin:reviews", "prompts: builtin:reviews|stories|arithmetic|instructions|python-tasks or a "
                          "JSONL/CSV/TXT file")


@dataclass
class MaxNewTokensArgs:
    max_new_tokens: int = option(64, "response length limit of the evaluation samples")


@dataclass
class TopPArgs:
    top_p: float = option(1.0, "1.0 = no nucleus truncation (recommended)")

    def validate(self) -> None:
        check(0 < self.top_p <= 1, f"top_p ({self.top_p}) must be in (0, 1]")


@dataclass
class PromptFormatArgs:
    """How prompts become model text: every command that formats prompts mixes this in."""

    chat_template: bool | None = option(None, "format prompts with the tokenizer's chat template. None: when it has "
                                        "one, else the plain 'User: ...\\n\\nAssistant: ' format; true: require it (an "
                                        "error if the tokenizer has none); false: always the plain format")
    system_prompt: str | None = option(None, "optional system message for chat-formatted prompts")


@dataclass
class PromptLimitArgs:
    """How long a prompt may be when sampling; every command that samples from prompts mixes this in."""

    max_prompt_length: int | None = option(None, "prompt tokens (after chat formatting) kept for sampling (None: "
                                           "the model's context window minus max_new_tokens)")
    prompt_overflow: str = option("truncate_left", "a longer prompt: truncate_left keeps its last max_prompt_length "
                                  "tokens (one warning says how many were cut); error stops before anything runs",
                                  OVERFLOW_MODES)

    def validate(self) -> None:
        check(self.max_prompt_length is None or self.max_prompt_length >= 1,
              f"max_prompt_length ({self.max_prompt_length}) must be >= 1")


@dataclass
class SampleCommandArgs(PromptLimitArgs, PromptFormatArgs, DtypeArgs, SeedArgs, MaxNewTokensArgs, PromptsArgs,
                        ModelNameArgs, FrozenAfterValidation):
    """The commands that sample from a model without training it (eval, tpo, prefs): which model, which
    prompts, how many, how they are formatted and sampled. Validated and frozen however built."""

    model = retune(help="the model that samples (a folder, a run's final/, or the default)")
    prompts = retune(help="prompts: builtin:NAME or a JSONL/CSV/TXT/Parquet file")
    max_new_tokens = retune(48, "completion length limit")
    dtype = retune(help="model weights/compute dtype; auto = bf16 where it is fast (GPU, CPU with AVX-512 BF16/AMX), "
                   "else fp32")
    seed = retune(help="seed for the prompt subset and sampling")
    num_prompts: int | None = option(None, "a seeded random subset of this many prompts (None = all)")
    temperature: float = option(1.0, "sampling temperature")
    batch_size: int = option(16, "sequences per generate() call")

    def validate(self) -> None:
        check(self.num_prompts is None or self.num_prompts >= 1, f"num_prompts ({self.num_prompts}) must be >= 1")


@dataclass
class PromptSplitArgs:
    """One split of `prompts` (eval, tpo)."""

    split: str = option("test", "split of `prompts` (files without a split field are used whole)", ("train", "test"))


@dataclass
class OutDirArgs:
    """The folder a command that writes no run folder writes its results to (eval, tpo)."""

    out_dir: str = option("runs/eval", "folder for report.json and samples.jsonl")


GENERATION_BATCH_HELP = ("prompts per generate() call on the CPU; on a CUDA GPU at least this many, all of them "
                         "where free GPU memory holds their KV cache (rollout/core.py generation_rows). Formerly "
                         "generation_batch_size, which now means TRL's (GRPO: completions per generation; "
                         "core/trl_batch.py)")


@dataclass
class EvalSamplingArgs(MaxNewTokensArgs):
    """Samples on held-out prompts before and after training, and how they are drawn: the offline
    preference trainers' judged evaluation and the online trainers' before/after check."""

    num_eval_prompts: int = option(48, "held-out prompts for the judged win rate over the starting model (0 = skip)")
    eval_samples_per_prompt: int = option(2, "completions per held-out prompt, before and after training")
    prompts_per_generate: int = option(16, GENERATION_BATCH_HELP)


@dataclass
class JudgedEvalArgs(EvalSamplingArgs):
    """The judged evaluation of offline preference trainers (DPO, KTO): samples of the starting and the
    trained model on held-out prompts, scored by a judge, and the win rate (trainers/judged.py)."""

    judge: str = option("sentiment", "reward function that judges samples: sentiment | arithmetic | length[:N] | "
                        "model:PATH | python:module:function")
    temperature: float = option(1.0, "sampling temperature of the evaluation samples")

    def validate(self) -> None:
        for k in ("max_new_tokens", "eval_samples_per_prompt", "prompts_per_generate"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")


@dataclass
class OptimizerArgs:
    """AdamW with linear warm-up (runtime/optim.py); one validation path for every trainer."""

    lr: float = option(1e-4, "AdamW learning rate")
    warmup_steps: int = option(4, "linear lr warm-up, in optimiser steps")
    warmup_ratio: float = option(0.0, "linear lr warm-up as a share of the run's planned optimiser steps, rounded up "
                                 "(transformers' warmup_ratio; a TRL warmup_steps below 1 means the same); 0 = "
                                 "warmup_steps decides")
    lr_scheduler_type: str = option("constant", "the lr after warm-up: constant; linear = decays to 0 at the last "
                                    "planned step; cosine = half a cosine to 0 (transformers' schedules; RL runs plan "
                                    "iterations x update epochs x mini-batches steps)", LR_SCHEDULES)
    weight_decay: float = option(0.0, "AdamW weight decay")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    max_grad_norm: float = option(1.0, "gradient-norm clip threshold (params/grad_norm is logged before clipping)")
    optim: str = option("adamw_torch", "the optimiser, by transformers' names: adamw_torch = AdamW (torch's fused "
                        "kernel in a single process, the same update); adamw_torch_fused = AdamW, fused wherever "
                        "torch has the kernel; sgd = plain SGD (no momentum) with weight_decay; adafactor = "
                        "transformers' Adafactor at lr (relative_step=False, scale_parameter=False, as the "
                        "Trainer sets it)", OPTIMIZERS)

    def validate(self) -> None:
        check(self.lr > 0, f"lr ({self.lr}) must be > 0")
        check(self.warmup_steps >= 0, f"warmup_steps ({self.warmup_steps}) must be >= 0")
        check(0 <= self.warmup_ratio < 1, f"warmup_ratio ({self.warmup_ratio}) must be in [0, 1)")
        check(self.weight_decay >= 0, f"weight_decay ({self.weight_decay}) must be >= 0")
        check(self.adam_eps > 0, f"adam_eps ({self.adam_eps}) must be > 0")
        check(self.max_grad_norm > 0, f"max_grad_norm ({self.max_grad_norm}) must be > 0")
        try:  # RL configs plan their steps from their options; a zero batch is their validate()'s to name
            per_iteration = getattr(self, "optimiser_steps_per_iteration", None)
        except ZeroDivisionError:
            per_iteration = None
        iterations = getattr(self, "iterations", None)
        # a huge rollout makes many steps an iteration: the rollout's memory check names it (trainers/rl.py)
        if isinstance(per_iteration, int) and isinstance(iterations, int) and per_iteration <= MAX_STEPS:
            check_planned_steps(iterations * per_iteration,
                                f"iterations ({iterations:,}) x {per_iteration} optimiser steps an iteration")
            check_warmup(self.warmup_steps, iterations * per_iteration, self.lr)  # refuses only; the run warns
        for key in ("max_steps", "epochs"):  # offline: the data decides the rest (trainers/offline.py)
            if isinstance(getattr(self, key, None), int):
                check_planned_steps(getattr(self, key), f"{key} ({getattr(self, key):,})")


@dataclass
class ModelArgs(DtypeArgs, ModelNameArgs, PromptFormatArgs):
    model_revision: str | None = option(None, "Hub revision (branch, tag or commit) of `model` when it is a Hub id")
    chat_template_path: str | None = option(None, "a Jinja chat template file, or a model/tokenizer folder whose "
                                            "template to use, replacing the tokenizer's own (saved with the trained "
                                            "model's tokenizer)")
    lora: bool = option(True, "train LoRA adapters (the reference is then the adapter-disabled base); false = full fine-tuning")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = option(0.0, "LoRA dropout; keep 0 for RL so rollouts and updates see the same policy")
    lora_target_modules: list[str] | None = option(None, "module names to adapt; all-linear = every linear layer but "
                                                   "the output layer (peft's); None chooses attention+MLP projections")
    lora_layers: int | None = option(None, "adapt only the top N transformer layers (None: all). Backward then stops "
                                     "below the lowest adapted layer: a large CPU speed-up for a small loss in capacity")

    def validate(self) -> None:
        if self.model_revision:
            rev = self.model.partition("@")[2]
            check(rev in ("", self.model_revision),
                  f"model_revision ({self.model_revision}) differs from the revision in model ({self.model})")
        check(self.lora_r >= 1, f"lora_r ({self.lora_r}) must be >= 1")
        check(self.lora_alpha > 0, f"lora_alpha ({self.lora_alpha}) must be > 0")
        check(0 <= self.lora_dropout < 1, f"lora_dropout ({self.lora_dropout}) must be in [0, 1)")
        check(self.lora_layers is None or self.lora_layers >= 1, f"lora_layers ({self.lora_layers}) must be >= 1")
        check(self.cpu_chunk_positions >= 1, f"cpu_chunk_positions ({self.cpu_chunk_positions}) must be >= 1")
        check(self.lora_target_modules is None or len(self.lora_target_modules) > 0,
              "lora_target_modules ([]) must name at least one module, or be None to choose them")

    def derived(self) -> dict:
        """Every loader reads `org/name@revision` (idempotent for a saved config); DtypeArgs resolves dtype."""
        model = f"{self.model.partition('@')[0]}@{self.model_revision}" if self.model_revision else self.model
        return {"model": model}

    gradient_checkpointing: bool = option(False, "recompute each transformer layer's activations in the backward pass "
                                          "instead of storing them: training activation memory drops from ~all "
                                          "layers to ~one layer, for ~30% more compute (same gradients)")
    cpu_chunk_positions: int = option(640, "CPU only: a micro-batch whose forward runs more positions than this "
                                      "(response tokens per row + prompt tokens per distinct prompt) runs in row "
                                      "chunks, with the same gradients: activations stay bounded (~49 KB per "
                                      "position and layer on SmolLM2-135M). Raise it where memory is plentiful: "
                                      "a long prompt shared by a group then runs fewer times (docs/benchmarks.md)")


@dataclass
class SamplingArgs(TopPArgs, PromptLimitArgs):
    temperature: float = option(1.0, "sampling temperature; log-probs, reference and entropy use the same T")
    top_k: int = option(0, "0 = no top-k truncation (recommended: truncation biases the stored log-probs)")
    stop_ids: list[int] | None = option(None, "token ids that end a response (default: the tokenizer's eos)")

    def validate(self) -> None:
        check(self.top_k >= 0, f"top_k ({self.top_k}) must be >= 0 (0 = no top-k truncation)")
        check(self.stop_ids is None or all(i >= 0 for i in self.stop_ids),
              f"stop_ids ({self.stop_ids}) must be token ids >= 0")


@dataclass
class ReferenceArgs:
    offload_reference: bool = option(False, "keep the frozen reference copy in CPU memory and move it to the "
                                     "accelerator only for its scoring pass (full fine-tuning or reference_model; "
                                     "with LoRA the reference is the adapter-disabled policy, there is no copy to "
                                     "offload; on a CPU-only machine it changes nothing)")


@dataclass
class GenerationArgs:
    generation_backend: str = option("hf", "who samples rollouts: hf = HF generate on the training policy (env's "
                                     "turns: rlhfkit's loop reusing each row's KV cache across turns, "
                                     "rollout/multiturn.py); lean = "
                                     "rlhfkit's own decode loop on the training policy (rollout/decode.py: same "
                                     "distribution, finished rows dropped; also for env's turns); graph = that "
                                     "loop with a static KV cache, each step one captured CUDA graph on CUDA "
                                     "(rollout/static_decode.py; the same steps uncaptured elsewhere); vllm = a "
                                     "vLLM engine on this GPU, its weights synced from the policy every iteration "
                                     "(extra `vllm`, CUDA only, untested by the project; falls back to hf with a "
                                     "message when unavailable). Log-probs always come from the trainer",
                                     GENERATION_BACKENDS)
    vllm_gpu_memory_utilization: float = option(0.3, "vllm: share of GPU memory the engine may take (weights + KV "
                                                 "cache); the rest stays for training")
    vllm_max_model_len: int | None = option(None, "vllm: longest prompt + response (None: the model's maximum)")

    def validate(self) -> None:
        check(0 < self.vllm_gpu_memory_utilization <= 1,
              f"vllm_gpu_memory_utilization ({self.vllm_gpu_memory_utilization}) must be in (0, 1]")
        check(self.vllm_max_model_len is None or self.vllm_max_model_len >= 1,
              f"vllm_max_model_len ({self.vllm_max_model_len}) must be >= 1 or None")


@dataclass
class RunArgs(SeedArgs, FrozenAfterValidation):
    output_dir: str = option("runs", "parent folder of run folders")
    run_name: str | None = option(None, "run folder name inside output_dir (default: COMMAND-DATE-TIME). An existing "
                                  "folder is refused unless resumed or overwrite=true; the live run locks it "
                                  "(docs/run-folders.md)")
    quiet: bool = option(False, "plain one-line logs instead of progress bars (for log files)")
    tensorboard: bool | None = option(None, "log to TensorBoard (None: when installed)")
    wandb: bool = option(False, "log to Weights & Biases (when installed)")
    save_every: int = option(10, "write a checkpoint to RUN/checkpoints every N iterations (sft/rm/dpo: optimiser "
                             "steps) and at the end; 0 = only when stopped by SIGINT/SIGTERM/SIGHUP")
    keep_checkpoints: int = option(2, "newest checkpoints kept (older ones are deleted)")
    resume: str | None = option(None, "continue from the newest complete checkpoint of a run folder (on the command "
                                "line: --resume RUN_DIR; its config.yaml is the base, key=value overrides apply), "
                                "or auto: continue output_dir/run_name if it has a checkpoint, else start afresh")
    overwrite: bool = option(False, "replace the run folder output_dir/run_name when it exists (its contents are "
                             "deleted); without it an existing run folder is refused unless resumed. Never a "
                             "live run's folder, one inside or holding another run's, or a folder of other files")
    max_nonfinite_steps: int = option(3, "an optimiser step whose loss or gradient norm is NaN/inf is skipped; stop "
                                      "with a diagnosis after this many in a row")
    save_merged: bool = option(False, "also save merged full weights (LoRA) in final/merged")
    logging_steps: int = option(1, "show metrics on the console and send them to TensorBoard/W&B every N "
                                "iterations (sft/rm/dpo/kto: optimiser steps), and at the first and last; "
                                "metrics.jsonl keeps every one")

    def validate(self) -> None:
        # RunArgs is mixed into every trainer's config: checked here so no validate() repeats it.
        check(self.save_every >= 0, f"save_every ({self.save_every}) must be >= 0 (0 = only when stopped)")
        check(self.keep_checkpoints >= 1, f"keep_checkpoints ({self.keep_checkpoints}) must be >= 1")
        check(self.max_nonfinite_steps >= 1, f"max_nonfinite_steps ({self.max_nonfinite_steps}) must be >= 1")
        check(self.logging_steps >= 1, f"logging_steps ({self.logging_steps}) must be >= 1")
        check_environment()  # what the run reads from the environment is checked like its options


@dataclass
class EvalSplitArgs:
    """Which split of the data is evaluated on (the online trainers, SFT, RM): data/splits.py."""

    eval_split: str = option("test", "the split of the data evaluated on (a built-in or Hub split, or records whose "
                             "`split` field has this value; TRL's dataset_test_split). Data without it is evaluated "
                             "on its training records, and the evaluation line says so")


@dataclass
class RolloutArgs(PromptsArgs, EvalSplitArgs, EvalSamplingArgs):
    """The online trainers' loop (PPO, TRPO, the GRPO family, online DPO): prompts, iterations, what is written."""

    eval_prompts: str | None = option(None, "held-out prompts for the before/after check (default: the eval_split "
                                      "of `prompts`; without one, a fixed sample of its training prompts, said so)")
    iterations: int = option(18, "iterations (rollout + update)")
    reward_weights: list[float] | None = option(None, "one weight per reward in `reward` (None: 1 each)")
    trunk_cache_mb: float = option(512.0, "with lora_layers, the layers below the adapted ones run once per rollout: "
                                   "their output (B x L x hidden x 4 bytes) is kept for the update when it fits in "
                                   "this many MB, else recomputed per micro-batch (0: always recompute)")
    log_samples: int = option(4, "completions per iteration written to samples.jsonl")


@dataclass
class PolicyGradientArgs:
    """The reward-driven trainers (PPO, TRPO, the GRPO family): the reward, its shaping, the update's batch and check."""

    reward: str = option("sentiment", "sentiment | arithmetic | " + REWARD_SPECS_HELP, several=True)
    rollout_batch_size: int = option(16, "prompts sampled per iteration, per process (N processes sample N x this "
                                     "different prompts; mini/micro batch sizes are per process too)")
    score_clip: float | None = option(None, "clip sequence scores to [-c, c]")
    no_stop_penalty: float | None = option(None, "score given to responses that never emit a stop token (None: keep)")
    micro_batch_size: int | str = option(8, "sequences per forward/backward; auto: on the CPU 8, on a CUDA GPU the "
                                         "largest power of two dividing mini_batch_size, at least 8, whose update fits "
                                         "the free memory by the memory estimate (runtime/batch_plan.py)")
    ratio_check_tol: float = option(1e-3, "max |ratio-1| allowed on the first micro-batch of each rollout; it repeats the "
                                    "scoring pass exactly, so anything above float noise means broken log-probs")


@dataclass
class ClippedRatioArgs:
    """PPO's clipped ratio and the KL estimate in the loss (PPO, the GRPO family)."""

    clip_eps: float = option(0.2, "PPO ratio clip range")
    kl_loss_estimator: str = option("k3", "KL estimate added to the loss with kl_penalty=loss: k3 (GRPO's; its gradient "
                                    "is that of KL(pi_ref || pi)) or k2 (the gradient of KL(pi || pi_ref) itself, "
                                    "on-policy; docs/learn/14-the-update.md, entry 17)", KL_LOSS_ESTIMATORS)


@dataclass
class BetaArgs:
    """beta, the KL strength: of the implicit reward (DPO, KTO, online DPO) or of the loss's KL term (GRPO)."""

    beta: float = option(0.1, "inverse temperature of the implicit reward beta * log(pi / pi_ref)")


@dataclass
class SharePromptsArgs:
    """Running a prompt several rows share once (GRPO's groups, DPO's pairs)."""

    share_prompts: bool = option(True, "run a pair's prompt once when sampling and in the DPO step, and a header all "
                                 "prompts share (a long system prompt) once per micro-batch (off under "
                                 "gradient_checkpointing)")


@dataclass
class LabelSmoothingArgs:
    """cDPO's label smoothing (DPO, online DPO)."""

    label_smoothing: float | None = option(None, "cDPO / rDPO label-flip probability (None: 0.1 for cdpo and robust, "
                                           "else 0)")

    @property
    def smoothing(self) -> float:
        if self.label_smoothing is not None:
            return self.label_smoothing
        return 0.1 if self.loss_type in ("cdpo", "robust") else 0.0


@dataclass
class OfflineArgs:
    """The offline trainers' passes and batches (SFT, RM, DPO, KTO)."""

    epochs: int = option(2, "passes over the training pairs")
    batch_size: int = option(16, "pairs per optimiser step (all processes together; each takes its share)")
    micro_batch_size: int = option(8, "pairs per forward/backward (2 x this many sequences)")


@dataclass
class DataArgs:
    """The training data of the trainers that read it from `data` (SFT, RM, KTO)."""

    data: str = option("", "preference pairs: a JSONL/CSV/Parquet file or saved `datasets` folder with prompt, "
                       "chosen, rejected (e.g. from `rlhfkit prefs make`), or builtin:prefs_reviews (the pairs DPO's "
                       "demo uses)")


@dataclass
class EvalDataArgs:
    """Held-out data given apart from the training data (TRL's eval_dataset): SFT, RM, DPO, KTO."""

    eval_data: str | None = option(None, "held-out pairs (default: records of eval_split; without them, the training "
                                   "pairs, or eval_fraction of them held back)")


@dataclass
class MaxLengthArgs:
    """TRL's max_length, tokens of prompt + response together (SFT and RM: their one limit; DPO and KTO:
    a cap beside max_prompt_length and max_response_length)."""

    max_length: int | None = option(None, "prompt + response tokens kept (TRL's max_length): after the prompt keeps "
                                    "its last max_prompt_length tokens, the response keeps its first max_length "
                                    "minus the prompt's tokens (at least 1), and at most max_response_length. "
                                    "None: no limit beyond those two")


@dataclass
class ExamplesArgs(EvalSplitArgs, EvalDataArgs, MaxLengthArgs, DataArgs):
    """Examples read whole, with a held-out share (SFT, RM)."""

    eval_fraction: float = option(0.0, "share of `data` held back from training for evaluation when it has no "
                                  "eval_split and no eval_data (0: hold nothing back, as TRL does; the evaluation "
                                  "then runs on training records and says so)")
    max_steps: int = option(0, "optimiser steps; 0 = epochs x ceil(pairs / batch_size)")
    eval_every: int = option(0, "evaluate every N optimiser steps (0 = only before and after training)")

    def validate(self) -> None:
        check(self.max_length is not None, "max_length must be a number of tokens here (None: dpo and kto only)")


@dataclass
class PairArgs(MaxLengthArgs):
    """Prompt + completion rows against a reference (DPO, KTO): lengths, the reference, the step cap."""

    max_prompt_length: int = option(192, "prompt tokens kept (the end of longer prompts)")
    prompt_overflow: str = option("truncate_left", "a prompt longer than max_prompt_length: truncate_left keeps its "
                                  "end (one warning says how many were cut); error stops before training",
                                  OVERFLOW_MODES)
    max_response_length: int = option(128, "response tokens kept (the start of longer responses, end-of-turn included)")
    reference_model: str | None = option(None, "reference model: a folder or Hub id org/name[@revision] (None: the "
                                         "adapter-disabled base with LoRA, else a frozen copy of the starting model)")
    precompute_ref_logps: bool | None = option(None, "compute reference log-probs once before training (None: when "
                                               "the run sees every pair at least once, i.e. when it is cheaper)")
    max_steps: int | None = option(None, "stop after this many optimiser steps (None: epochs decide)")

    def validate(self) -> None:
        check(self.max_length is None or self.max_length >= 2, f"max_length ({self.max_length}) must be >= 2")


@dataclass
class TeacherArgs:
    """A frozen teacher model sharing the policy's tokenizer (distill; GRPO's distill_coef term)."""

    teacher: str = option("", "a teacher: a causal-LM folder or Hub id org/name[@revision] sharing the policy's "
                          "tokenizer")
