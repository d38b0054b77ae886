"""The option groups trainer configs are made of (each field's help text is its --help line).

A command's config is a dataclass that mixes in the groups it needs and adds its own fields;
`runtime.config.build_config` runs every group's `validate()` (mixins first), so a range is
checked in one place, then applies the values a group's `derived()` works out (the resolved dtype)
and freezes the config (RunArgs is FrozenAfterValidation): nothing assigns a field afterwards. A subclass may redefine a field to change its default (e.g. `lr`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.choices import DTYPES, GENERATION_BACKENDS, LR_SCHEDULES, PROMPT_OVERFLOW_MODES
from rlhfkit.core.config import FrozenAfterValidation, check, option

OVERFLOW_MODES = PROMPT_OVERFLOW_MODES
# The reward specs the RL trainers take after their built-in default (`reward=` help text)
REWARD_SPECS_HELP = ("length[:N] | model:PATH (an `rlhfkit rm` folder, or any AutoModelForSequenceClassification "
                     "folder or Hub id) | python:module:function (called as TRL calls rewards: prompts=, completions=, "
                     "each prompt field as a keyword); a,b (or a YAML list) = several, summed with reward_weights, each "
                     "logged as reward/NAME. In Python: a callable or a list")


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
class JudgedEvalArgs:
    """The judged evaluation of offline preference trainers (DPO, KTO): samples of the starting and the
    trained model on held-out prompts, scored by a judge, and the win rate (trainers/judged.py)."""

    judge: str = option("sentiment", "reward function that judges samples: sentiment | arithmetic | length[:N] | "
                        "model:PATH | python:module:function")
    num_eval_prompts: int = option(48, "held-out prompts for the judged win rate over the starting model (0 = skip)")
    eval_samples_per_prompt: int = option(2, "completions per held-out prompt, before and after training")
    max_new_tokens: int = option(64, "response length limit of the evaluation samples")
    temperature: float = option(1.0, "sampling temperature of the evaluation samples")
    generation_batch_size: int = option(16, "prompts per generate() call on the CPU; on a CUDA GPU at "
                                        "least this many, all of them where free GPU memory holds their KV "
                                        "cache (rollout/core.py generation_rows)")

    def validate(self) -> None:
        for k in ("max_new_tokens", "eval_samples_per_prompt", "generation_batch_size"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")


@dataclass
class OptimizerArgs:
    """AdamW with linear warm-up (runtime/optim.py); one validation path for every trainer."""

    lr: float = option(1e-4, "AdamW learning rate")
    warmup_steps: int = option(4, "linear lr warm-up, in optimiser steps")
    lr_scheduler_type: str = option("constant", "the lr after warm-up: constant; linear = decays to 0 at the last "
                                    "planned step; cosine = half a cosine to 0 (transformers' schedules; RL runs plan "
                                    "iterations x update epochs x mini-batches steps)", LR_SCHEDULES)
    weight_decay: float = option(0.0, "AdamW weight decay")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    max_grad_norm: float = option(1.0, "gradient-norm clip threshold (params/grad_norm is logged before clipping)")

    def validate(self) -> None:
        check(self.lr > 0, f"lr ({self.lr}) must be > 0")
        check(self.warmup_steps >= 0, f"warmup_steps ({self.warmup_steps}) must be >= 0")
        check(self.weight_decay >= 0, f"weight_decay ({self.weight_decay}) must be >= 0")
        check(self.adam_eps > 0, f"adam_eps ({self.adam_eps}) must be > 0")
        check(self.max_grad_norm > 0, f"max_grad_norm ({self.max_grad_norm}) must be > 0")


@dataclass
class ModelArgs(PromptFormatArgs):
    model: str = option("smollm2-135m-instruct", "policy: 'smollm2-135m-instruct' (built in), a local HF model folder, "
                        "or a Hub id org/name[@revision] (downloaded once into the HF_HOME cache)")
    model_revision: str | None = option(None, "Hub revision (branch, tag or commit) of `model` when it is a Hub id")
    chat_template_path: str | None = option(None, "a Jinja chat template file, or a model/tokenizer folder whose "
                                            "template to use, replacing the tokenizer's own (saved with the trained "
                                            "model's tokenizer)")
    dtype: str = option("auto", "compute dtype. bf16: frozen base weights in bf16 and bf16 autocast (fast on GPUs and "
                        "CPUs with AVX-512 BF16, slow on CPUs without: docs/benchmarks.md); trainable weights and "
                        "optimiser state stay fp32. auto: bf16 where it is fast, else fp32", DTYPES)
    lora: bool = option(True, "train LoRA adapters (the reference is then the adapter-disabled base); false = full fine-tuning")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = option(0.0, "LoRA dropout; keep 0 for RL so rollouts and updates see the same policy")
    lora_target_modules: list[str] | None = option(None, "module names to adapt; None chooses attention+MLP projections")
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
        """Every loader reads `org/name@revision` (idempotent for a saved config); dtype auto becomes
        bf16 where bf16 matmuls are fast, else fp32 (config.yaml records the resolved dtype)."""
        from rlhfkit.models.loading import resolve_dtype

        model = f"{self.model.partition('@')[0]}@{self.model_revision}" if self.model_revision else self.model
        return {"model": model, "dtype": resolve_dtype(self.dtype)}

    gradient_checkpointing: bool = option(False, "recompute each transformer layer's activations in the backward pass "
                                          "instead of storing them: training activation memory drops from ~all "
                                          "layers to ~one layer, for ~30% more compute (same gradients)")
    cpu_chunk_positions: int = option(640, "CPU only: a micro-batch whose forward runs more positions than this "
                                      "(response tokens per row + prompt tokens per distinct prompt) runs in row "
                                      "chunks, with the same gradients: activations stay bounded (~49 KB per "
                                      "position and layer on SmolLM2-135M). Raise it where memory is plentiful: "
                                      "a long prompt shared by a group then runs fewer times (docs/benchmarks.md)")


@dataclass
class SamplingArgs(PromptLimitArgs):
    temperature: float = option(1.0, "sampling temperature; log-probs, reference and entropy use the same T")
    top_k: int = option(0, "0 = no top-k truncation (recommended: truncation biases the stored log-probs)")
    top_p: float = option(1.0, "1.0 = no nucleus truncation (recommended)")
    stop_ids: list[int] | None = option(None, "token ids that end a response (default: the tokenizer's eos)")

    def validate(self) -> None:
        check(self.top_k >= 0, f"top_k ({self.top_k}) must be >= 0 (0 = no top-k truncation)")
        check(0 < self.top_p <= 1, f"top_p ({self.top_p}) must be in (0, 1]")
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

    def __post_init__(self) -> None:
        check(0 < self.vllm_gpu_memory_utilization <= 1,
              f"vllm_gpu_memory_utilization ({self.vllm_gpu_memory_utilization}) must be in (0, 1]")
        check(self.vllm_max_model_len is None or self.vllm_max_model_len >= 1,
              f"vllm_max_model_len ({self.vllm_max_model_len}) must be >= 1 or None")
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:  # the other mixins' checks (RunArgs)
            parent()


@dataclass
class RunArgs(FrozenAfterValidation):
    output_dir: str = option("runs", "parent folder of run folders")
    run_name: str | None = option(None, "run folder name inside output_dir (default: COMMAND-DATE-TIME). An existing "
                                  "folder is refused unless resumed or overwrite=true; the live run locks it "
                                  "(docs/run-folders.md)")
    seed: int = option(0, "seed for initialisation and data order; sampling uses seed + rank * prime + iteration")
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
                             "deleted); without it an existing run folder is refused unless resumed")
    max_nonfinite_steps: int = option(3, "an optimiser step whose loss or gradient norm is NaN/inf is skipped; stop "
                                      "with a diagnosis after this many in a row")

    def __post_init__(self) -> None:
        # RunArgs is mixed into every trainer's config: checked here so no validate() repeats it.
        check(self.save_every >= 0, f"save_every ({self.save_every}) must be >= 0 (0 = only when stopped)")
        check(self.keep_checkpoints >= 1, f"keep_checkpoints ({self.keep_checkpoints}) must be >= 1")
        check(self.max_nonfinite_steps >= 1, f"max_nonfinite_steps ({self.max_nonfinite_steps}) must be >= 1")
        check(0 <= self.seed < 2**63, f"seed ({self.seed}) must be in [0, 2**63 - 1]")


@dataclass
class EnvArgs:
    """Multi-turn rollouts against an environment (rollout/multiturn.py, docs/environments.md)."""

    env: str = option("", "environment the policy acts in over several turns (e.g. arithmetic-tool, self-correct; "
                      "rlhfkit.envs.make_env_factory reads the spec); its rewards replace `reward`, and `prompts` "
                      "left at its default become the environment's own problems. \"\" = single-turn rollouts")
    max_turns: int = option(4, "env: most model turns per episode")
    max_total_tokens: int = option(256, "env: most tokens after the prompt per episode, model turns and environment "
                                   "messages together (a turn that would pass it is cut and the row marked not stopped); "
                                   "max_new_tokens still limits each model turn")

    def validate(self) -> None:
        check(self.max_turns >= 1, f"max_turns ({self.max_turns}) must be >= 1")
        check(self.max_total_tokens >= 1, f"max_total_tokens ({self.max_total_tokens}) must be >= 1")
        if self.env and self.generation_backend == "vllm":
            check(False, f"env ({self.env}) samples its turns on the training policy; set generation_backend=hf "
                  f"or lean (got {self.generation_backend})")


@dataclass
class AgentArgs:
    """Episodes from the user's own OpenAI-client agent (rollout/agent.py, docs/environments.md)."""

    agent: str = option("", "python:FILE.py:FN (or python:MODULE:FN): FN(client, record) runs one episode with the "
                        "openai client it is given (an OpenAI-compatible server on 127.0.0.1 backed by the policy "
                        "being trained) and returns its reward, or one reward per model reply; the sampled tokens are "
                        "trained exactly as sampled. Its rewards replace `reward`. \"\" = no agent")
    agent_concurrency: int = option(8, "agent: episodes run at once (threads; requests that arrive together are "
                                    "sampled in one batch)")
    agent_timeout: float = option(120.0, "agent: seconds an episode may take; a slower one is dropped "
                                  "(agent/timeout_rate) and its client's key revoked")
    agent_max_calls: int = option(32, "agent: most requests one episode may make (more are refused, and the "
                                  "episode dropped)")
    agent_model: str = option("policy", "agent: the model name the server answers to (give your agent's own, e.g. "
                              "gpt-4o-mini, to run it unchanged); other names are refused")

    def validate(self) -> None:
        if not self.agent:
            return
        check(self.agent_concurrency >= 1, f"agent_concurrency ({self.agent_concurrency}) must be >= 1")
        check(self.agent_timeout > 0, f"agent_timeout ({self.agent_timeout}) must be > 0")
        check(self.agent_max_calls >= 1, f"agent_max_calls ({self.agent_max_calls}) must be >= 1")
        check(bool(self.agent_model), "agent_model must not be empty")
