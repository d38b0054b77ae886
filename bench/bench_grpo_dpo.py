"""GRPO and DPO step speed and peak memory against trl's stable trainers, written to docs/benchmarks.md.

Standard GRPO work = `rlhfkit grpo` defaults (read from GRPOConfig at run time): SmolLM2-135M-Instruct with LoRA
(r=16, alpha=32, attention+MLP projections), builtin:arithmetic, 8 prompts x G=8 = 64 completions per rollout,
16 new tokens, temperature 1, no top-k/top-p, exact-match arithmetic reward, 2 update epochs (mu), mini-batch 32,
micro-batch 16, token-mean loss, beta=0 (no reference model), fp32.
Standard DPO work = `rlhfkit dpo` defaults (read from DPOConfig): builtin:prefs_reviews, 16 pairs per optimiser
step in micro-batches of 8, LoRA, sigmoid loss, beta 0.1, prompt/response limits 192/128 tokens, reference = the
adapter-disabled base, fp32.

The same work is run by trl==1.12.0's GRPOTrainer and DPOTrainer (`--trl-python`, the `bench` extra), with every
knob mapped from the rlhfkit config (see `trl_grpo` / `trl_dpo` and the notes rendered under the tables). Each
configuration runs in its own subprocess so its peak RSS (ru_maxrss) is its own; the first unit of each is a warm-up
and is excluded from the means.

Units: GRPO "per step" = one rollout of 64 completions plus all of its updates (2 epochs x 2 mini-batches = 4
optimiser steps). rlhfkit: one iteration, from its metrics.jsonl timing keys (timing/rollout_s + timing/update_s).
TRL: generates once per `steps_per_generation x num_iterations` = 4 optimiser steps, so its unit is the wall time
of 4 consecutive optimiser steps (TrainerCallback.on_step_end stamps), starting at a generation.
DPO "per step" = one optimiser step of 16 pairs; reference log-prob precomputation is a one-off reported apart.
Each unit is timed in wall seconds and in CPU seconds (time.process_time of the configuration's process, all
threads). With `--threads 1` (OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every configuration's process) a
unit's CPU seconds equal its wall seconds on an idle core and other jobs do not inflate them, so the speed-ups
(TRL CPU s / rlhfkit CPU s) hold on a shared machine.

TRL at its own best settings on a CPU with fast bf16 (`trl-*-best`): model loaded in bf16 (`dtype=torch.bfloat16`:
`bf16=True` alone only autocasts, the weights stay as loaded, and TRL loads a model given by name in fp32 unless
`model_init_kwargs` says otherwise; `trl-dpo-best-autocast` is `bf16=True` alone) plus `bf16=True` (autocast), LoRA on every layer
(TRL has no frozen-trunk option), no gradient checkpointing (`trl-*-best-ckpt`: with it, TRL's default), and for
DPO 4 pairs per micro-batch (TRL's faster micro-batch here). They are compared with rlhfkit's defaults
(`grpo-default`, `dpo-default`: dtype=auto, bf16 here) and with `grpo-all-rows-bf16` (like for like at bf16).

    .venv-bench/bin/python bench/bench_grpo_dpo.py --trl-python .venv-bench/bin/python --threads 1   # all, writes
    .venv/bin/python bench/bench_grpo_dpo.py --configs grpo,dpo --no-write                 # rlhfkit only
    ... --configs grpo-all-rows,trl-grpo --steps 4 --dpo-steps 8 --no-write
    ... --smoke --steps 2 --configs dpo,trl-dpo     # plumbing check on a much smaller work (never written)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchdoc
import work_flops

# rlhfkit configurations: overrides of the command's defaults (run settings come from GRPO_RUN / DPO_RUN).
GRPO_CONFIGS = {
    "grpo": {},  # `rlhfkit grpo` as shipped (drop_zero_std_groups=True: all-equal-reward groups skip the update)
    "grpo-all-rows": {"drop_zero_std_groups": False},  # every row updated, like TRL
    "grpo-all-rows-unshared": {"drop_zero_std_groups": False, "share_prompts": False},  # and each row runs its prompt
    "grpo-lora-all": {"lora_layers": None},  # only run when the default adapts the top N layers only
    "grpo-default": {"dtype": "auto"},  # `rlhfkit grpo` with nothing set (dtype=auto: bf16 where it is fast)
    "grpo-all-rows-bf16": {"drop_zero_std_groups": False, "dtype": "bf16"},  # like for like with trl-grpo-best
}
DPO_CONFIGS = {
    "dpo": {"precompute_ref_logps": True},  # what a default run chooses (it sees every pair: precompute)
    "dpo-ref-on-the-fly": {"precompute_ref_logps": False},
    "dpo-default": {"precompute_ref_logps": True, "dtype": "auto"},  # and dtype=auto (bf16 here), every layer
}
# trl configurations -> the rlhfkit configurations they are compared with.
TRL_CONFIGS = {
    "trl-grpo": ["grpo", "grpo-all-rows", "grpo-all-rows-unshared", "grpo-lora-all"],
    "trl-dpo": ["dpo"],
    "trl-dpo-ref-on-the-fly": ["dpo-ref-on-the-fly"],
    "trl-grpo-best": ["grpo-default", "grpo-all-rows-bf16"],
    "trl-grpo-best-ckpt": ["grpo-default", "grpo-all-rows-bf16"],
    "trl-dpo-best": ["dpo-default"],
    "trl-dpo-best-ckpt": ["dpo-default"],
    "trl-dpo-best-autocast": ["dpo-default"],
}
# How each trl configuration runs: bf16 = model loaded in bf16 + bf16=True (autocast); ckpt = gradient
# checkpointing; fp32_weights = keep the weights fp32 under bf16=True; micro = DPO pairs per micro-batch (None:
# rlhfkit's micro_batch_size).
TRL_HOW = {"trl-grpo": {}, "trl-dpo": {}, "trl-dpo-ref-on-the-fly": {},
           "trl-grpo-best": {"bf16": True}, "trl-grpo-best-ckpt": {"bf16": True, "ckpt": True},
           "trl-dpo-best": {"bf16": True, "micro": 4}, "trl-dpo-best-ckpt": {"bf16": True, "ckpt": True, "micro": 4},
           # bf16=True alone (fp32 weights, autocast only): what TrainingArguments' flag does by itself on a CPU
           "trl-dpo-best-autocast": {"bf16": True, "fp32_weights": True, "micro": 4}}
# (label, TRL config, rlhfkit config, speed-up target, memory-ratio target): the CPU speed targets.
TARGETS = [("GRPO like for like (every row, LoRA every layer, fp32)", "trl-grpo", "grpo-all-rows", 3.0, 0.3),
           ("GRPO default vs TRL fp32", "trl-grpo", "grpo-default", 4.0, 0.3),
           ("GRPO default vs TRL best", "trl-grpo-best", "grpo-default", 4.0, 0.3),
           ("GRPO like for like at bf16 (every row)", "trl-grpo-best", "grpo-all-rows-bf16", 3.0, 0.3),
           ("DPO like for like (fp32, 8-pair micro-batches)", "trl-dpo", "dpo", 3.0, 0.3),
           ("DPO default vs TRL fp32", "trl-dpo", "dpo-default", 4.0, 0.3),
           ("DPO default (bf16, every layer) vs TRL best", "trl-dpo-best", "dpo-default", 4.0, 0.3)]
ALL = list(GRPO_CONFIGS) + list(DPO_CONFIGS) + list(TRL_CONFIGS)
GRPO_RUN = {"dtype": "fp32", "num_eval_prompts": 0, "quiet": True, "tensorboard": False, "save_every": 0}
DPO_RUN = {"dtype": "fp32", "num_eval_prompts": 0, "quiet": True, "tensorboard": False, "save_every": 0}
# --smoke: a much smaller work that only checks the plumbing (figures meaningless; never written to the docs).
SMOKE = {"grpo": {"rollout_batch_size": 16, "prompts_per_generate": 16, "mini_batch_size": 8, "micro_batch_size": 4,
                  "max_new_tokens": 4},
         "dpo": {"batch_size": 8, "micro_batch_size": 4}}
smoke = False  # set by main()
WARMUP = 1  # units excluded from the means
DPO_MAX_STEPS = 12  # 196 training pairs / 16: the 13th step of an epoch is a short batch of 4 pairs


def is_grpo(name: str) -> bool:
    return "grpo" in name


def grpo_config(name: str, iterations: int, out: str):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.grpo_config import GRPOConfig

    overrides = {**GRPO_CONFIGS.get(name, {}), **(SMOKE["grpo"] if smoke else {})}
    return build_config(GRPOConfig, {**GRPO_RUN, **overrides, "iterations": iterations, "output_dir": out,
                                     "run_name": name})


def dpo_config(name: str, steps: int, out: str):
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.dpo_config import DPOConfig

    overrides = {**DPO_CONFIGS.get(name, {"precompute_ref_logps": "on-the-fly" not in name}),
                 **({**SMOKE["dpo"], "prefs": smoke_prefs()} if smoke else {})}
    return build_config(DPOConfig, {**DPO_RUN, **overrides, "max_steps": steps, "output_dir": out, "run_name": name})


def smoke_prefs() -> str:
    """--smoke: the first 24 training and 2 held-out pairs of builtin:prefs_reviews, in a temporary file."""
    from rlhfkit.trainers.dpo import resolve_prefs

    lines = Path(resolve_prefs("builtin:prefs_reviews")).read_text().splitlines()
    train = [ln for ln in lines if '"split": "train"' in ln][:24]
    test = [ln for ln in lines if '"split": "test"' in ln][:2]
    path = Path(tempfile.gettempdir()) / "bench_grpo_dpo_smoke_prefs.jsonl"
    path.write_text("\n".join(train + test) + "\n")
    return str(path)


def peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


# ----------------------------------------------------------------------------- rlhfkit


def run_rlhfkit_grpo(name: str, steps: int) -> dict:
    from rlhfkit.trainers.grpo import train

    out = benchdoc.scratch_dir()
    cfg = grpo_config(name, steps, out)
    stamps = benchdoc.tracker_stamps()
    with grpo_shapes() as shapes:
        train(cfg)
    rows = [json.loads(line) for line in open(Path(out) / name / "metrics.jsonl")]
    timed = rows[WARMUP:] or rows
    res = {k: mean([r.get(f"timing/{k}", 0.0) for r in timed])
           for k in ("generate_s", "reward_s", "logprobs_s", "rollout_s", "update_s")}
    if not any("timing/logprobs_s" in r for r in timed):
        # rlhfkit grpo logs no timing/logprobs_s (its rollout metrics are taken before the scoring pass): the
        # rest of timing/rollout_s is that pass (+ the advantages, microseconds).
        res["logprobs_s"] = res["rollout_s"] - res["generate_s"] - res["reward_s"]
    res["unit_s"] = res["rollout_s"] + res["update_s"]  # generation + reward + teacher-forced pass + update
    timing = benchdoc.unit_times(stamps[WARMUP - 1:])  # log to log: units WARMUP+1..
    res["wall_unit_s"], res["cpu_s"], res["dtype"] = timing["wall_s"], timing["cpu_s"], cfg.dtype
    res["rows_updated"] = mean([r.get("rollout/update_fraction", 1.0) for r in timed])
    res["completion_tokens"] = mean([r["rollout/response_length"] for r in timed])
    res["units_timed"] = len(timed)
    res["lora_layers"] = cfg.lora_layers
    flops = grpo_flops(cfg, shapes)[WARMUP:]
    res["model_gflop"] = {k: mean([f[k] for f in flops]) / 1e9 for k in flops[0]} if flops else None
    res["peak_rss_gb"] = peak_rss_gb()
    shutil.rmtree(out, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
    return res


def run_rlhfkit_dpo(name: str, steps: int) -> dict:
    import rlhfkit.trainers.dpo as dpo

    out = benchdoc.scratch_dir()
    cfg = dpo_config(name, steps, out)
    precompute: list[float] = []
    original = dpo.precompute_reference

    def timed_precompute(*a, **k):
        t0 = time.perf_counter()
        table = original(*a, **k)
        precompute.append(time.perf_counter() - t0)
        return table

    dpo.precompute_reference = timed_precompute
    stamps = benchdoc.tracker_stamps()
    summary = dpo.train(cfg)
    rows = [json.loads(line) for line in open(Path(out) / name / "metrics.jsonl")]
    timed = rows[WARMUP:] or rows
    timing = benchdoc.unit_times(stamps[WARMUP - 1:])  # log to log: steps WARMUP+1..
    res = {"unit_s": mean([r["timing/step_s"] for r in timed]), "wall_unit_s": timing["wall_s"],
           "cpu_s": timing["cpu_s"], "dtype": cfg.dtype,
           "precompute_s": sum(precompute) if precompute else None,
           "precomputed": summary.get("precomputed_ref_logps"), "units_timed": len(timed),
           "model_gflop": {"total": mean([f / 1e9 for f in dpo_step_flops(cfg, dpo)[WARMUP:steps]])},
           "peak_rss_gb": peak_rss_gb()}
    shutil.rmtree(out, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
    return res


def grpo_flops(cfg, shapes: dict[int, dict]) -> list[dict[str, int]]:
    """work_flops.grpo_rollout of each iteration that grpo_shapes recorded, in iteration order."""
    shape = model_shape(cfg.model)
    return [work_flops.grpo_rollout(shape, s["sampled"], s.get("updated", []), lora_rank(cfg), cfg.lora_layers,
                                    cfg.update_epochs, s["prefix"], -(-s["rows"] // (cfg.prompts_per_generate or s["rows"])),
                                    -(-sum(len(r) for _, r in s.get("updated", [])) // cfg.micro_batch_size),
                                    with_pass=s["passes"] > 0)
            for s in [shapes[it] for it in sorted(shapes)]]


def model_shape(model: str):
    from transformers import AutoConfig

    from rlhfkit.estimate.flops import shape_of
    from rlhfkit.models.loading import resolve_model_path

    return shape_of(AutoConfig.from_pretrained(resolve_model_path(model)))


def lora_rank(cfg) -> int | None:
    """LoRA rank for rlhfkit.estimate.flops: None = full fine-tuning."""
    return cfg.lora_r if cfg.lora else None


@contextlib.contextmanager
def grpo_shapes():
    """{iteration: {'sampled': prompt_groups, 'updated': prompt_groups, 'passes': n}} of the rows each GRPO
    iteration sampled and updated, and how many log-prob passes it ran (none for an exactly on-policy update:
    trainers/grpo.py needs_logprob_pass): rlhfkit.trainers.rl.RLRun's sample, logprob_pass and update,
    wrapped while inside."""
    from rlhfkit.trainers.rl import RLRun

    shapes: dict[int, dict] = {}
    sample, logprob_pass, update = RLRun.sample, RLRun.logprob_pass, RLRun.update

    def groups(r):
        return work_flops.prompt_groups(r.query_ids, r.query_mask, r.response_mask)

    @functools.wraps(sample)
    def sample_(self, *a, **k):
        out = sample(self, *a, **k)
        it = shapes.setdefault(self.iteration, {"sampled": [], "rows": 0, "prefix": 0, "passes": 0})
        it["sampled"] += groups(out)
        it["rows"] += out.query_ids.shape[0]
        it["prefix"] = work_flops.common_prefix(out.query_ids, out.query_mask)
        return out

    @functools.wraps(logprob_pass)
    def logprob_pass_(self, rollout, *a, **k):
        shapes[self.iteration]["passes"] += 1
        return logprob_pass(self, rollout, *a, **k)

    @functools.wraps(update)
    def update_(self, rollout, *a, **k):
        shapes[self.iteration].setdefault("updated", []).extend(groups(rollout))
        return update(self, rollout, *a, **k)

    RLRun.sample, RLRun.logprob_pass, RLRun.update = sample_, logprob_pass_, update_
    try:
        yield shapes
    finally:
        RLRun.sample, RLRun.logprob_pass, RLRun.update = sample, logprob_pass, update


def dpo_step_flops(cfg, dpo) -> list[int]:
    """Model FLOPs of each planned DPO step (work_flops.dpo_step), planned as rlhfkit.trainers.dpo.train does."""
    import torch
    from transformers import AutoTokenizer

    from rlhfkit.models.loading import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
    pairs = dpo.load_pairs(cfg.prefs)[0]
    data, n = dpo.encode_pairs(tok, pairs, cfg), len(pairs)
    batches = dpo.plan_batches(n, cfg, torch.Generator().manual_seed(cfg.seed), 1,
                               dpo.pair_lengths(data, cfg.share_prompts))
    prompt, response = data.query_mask.sum(1).tolist(), data.response_mask.sum(1).long().tolist()
    shape = model_shape(cfg.model)

    def micro_batch(pairs: list[int]) -> tuple[int, list[tuple[int, int, int]]]:
        prefix = work_flops.common_prefix(data.query_ids[pairs], data.query_mask[pairs])
        return prefix, [(prompt[i], response[i], response[i + n]) for i in pairs]

    m = cfg.micro_batch_size
    return [work_flops.dpo_step(shape, [micro_batch(b.tolist()[i : i + m]) for i in range(0, len(b), m)],
                                lora_rank(cfg), cfg.lora_layers) for b in batches]


# ----------------------------------------------------------------------------- trl


def trl_imports():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's precompute progress bar
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    return torch, AutoModelForCausalLM, TrainerCallback


def clock(TrainerCallback):
    """(callback, stamps, logs): a stamp at train begin and at every optimiser-step end; TRL's own log lines."""
    stamps: list[tuple[float, float]] = []  # benchdoc.stamp(): (wall s, CPU s)
    history: list[dict] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            stamps.append(benchdoc.stamp())

        def on_step_end(self, *a, **k):
            stamps.append(benchdoc.stamp())

        def on_log(self, args, state, control, logs=None, **k):
            history.append(dict(logs or {}))

    return Clock(), stamps, history


def lora_config(model, cfg):
    """peft LoraConfig like rlhfkit's add_lora, on all layers (the TRL side always adapts every layer)."""
    from peft import LoraConfig

    from rlhfkit.models.lora import check_lora_targets

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=check_lora_targets(model, cfg.lora_target_modules), task_type="CAUSAL_LM",
                      bias="none")


def run_trl_grpo(name: str, steps: int) -> dict:
    """The standard GRPO work with trl's GRPOTrainer, knobs mapped from rlhfkit's GRPOConfig defaults."""
    tmp = benchdoc.scratch_dir()
    res = trl_grpo(grpo_config("grpo", steps, tmp), TRL_HOW[name], steps)
    shutil.rmtree(tmp, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
    return res


def trl_grpo(cfg, how: dict, steps: int, use_cpu: bool = True) -> dict:
    """`steps` rollouts of `cfg`'s work (a GRPOConfig: model, prompts, sizes) with trl's GRPOTrainer, run as `how`
    says (TRL_HOW), writing under cfg.output_dir; on the CPU unless `use_cpu` is False. Returns the figures."""
    torch, AutoModelForCausalLM, TrainerCallback = trl_imports()
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlhfkit.data.chat import format_prompts
    from rlhfkit.data.stream import PromptStream
    from rlhfkit.models import load_tokenizer
    from rlhfkit.models.loading import resolve_model_path
    from rlhfkit.rewards import score_batch
    from rlhfkit.trainers.rl import prepare_data

    tmp = cfg.output_dir
    torch.manual_seed(cfg.seed)
    reward_fn, train_records, _ = prepare_data(cfg)
    # rlhfkit's own prompt order (its PromptStream with the run seed); TRL then reads it in order.
    records = PromptStream(train_records, cfg.seed).next(cfg.prompts_per_iteration * steps)
    path = resolve_model_path(cfg.model)
    tok = load_tokenizer(str(path), padding_side="left")
    texts = format_prompts(tok, [r["prompt"] for r in records], cfg)  # chat template, as rlhfkit's rollouts
    data = Dataset.from_dict({"prompt": texts, "answer": [r.get("answer") for r in records],
                              "answer_value": [r.get("answer_value") for r in records]})

    def arithmetic(prompts, completions, answer=None, answer_value=None, **_):
        return score_batch(reward_fn, prompts, completions, {"answer": answer, "answer_value": answer_value})

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if how.get("bf16") else torch.float32)
    mini, micro = cfg.optimiser_batch, cfg.micro_batch_size
    steps_per_rollout = cfg.update_epochs * (cfg.rollout_batch_size // mini)
    args = GRPOConfig(
        output_dir=tmp, num_generations=cfg.group_size, generation_batch_size=cfg.rollout_batch_size,
        per_device_train_batch_size=micro, gradient_accumulation_steps=mini // micro, num_iterations=cfg.update_epochs,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
        beta=cfg.beta, epsilon=cfg.clip_eps, epsilon_high=cfg.clip_eps_high or cfg.clip_eps, loss_type="dapo",
        scale_rewards="group" if cfg.scale_rewards else "none", mask_truncated_completions=False,
        learning_rate=cfg.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay, adam_epsilon=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm,
        max_steps=steps * steps_per_rollout, shuffle_dataset=False, bf16=how.get("bf16", False), fp16=False,
        gradient_checkpointing=how.get("ckpt", False), use_cpu=use_cpu, use_vllm=False, log_completions=False, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=cfg.seed)
    callback, stamps, logs = clock(TrainerCallback)
    trainer = GRPOTrainer(model=model, reward_funcs=arithmetic, args=args, train_dataset=data, processing_class=tok,
                          peft_config=lora_config(model, cfg) if cfg.lora else None, callbacks=[callback])
    trainer.train()
    ends = stamps[::steps_per_rollout]  # train begin, then the end of every rollout's last optimiser step
    timing = benchdoc.unit_times(ends, WARMUP)
    n_units = len(ends) - 1
    first_step = [stamps[i * steps_per_rollout + 1][0] - stamps[i * steps_per_rollout][0] for i in range(n_units)]
    train_logs = [x for x in logs if "loss" in x or "reward" in x]
    per_rollout = train_logs[::steps_per_rollout][WARMUP:] or train_logs
    res = {"unit_s": timing["wall_s"], "cpu_s": timing["cpu_s"], "units_timed": timing["units"],
           "bf16": how.get("bf16", False), "gradient_checkpointing": how.get("ckpt", False),
           "first_step_of_rollout_s": mean(first_step[WARMUP:] or first_step),  # generation + 1 optimiser step
           "optimiser_steps_per_unit": steps_per_rollout, "generation_batch_size": args.generation_batch_size,
           "steps_per_generation": args.steps_per_generation,
           "completion_tokens": mean([x.get("completions/mean_length", float("nan")) for x in per_rollout]),
           "frac_reward_zero_std": mean([x.get("frac_reward_zero_std", float("nan")) for x in per_rollout]),
           "peak_rss_gb": peak_rss_gb()}
    return res


def run_trl_dpo(name: str, steps: int) -> dict:
    """The standard DPO work with trl's DPOTrainer, knobs mapped from rlhfkit's DPOConfig defaults."""
    tmp = benchdoc.scratch_dir()
    res = trl_dpo(dpo_config(name, steps, tmp), TRL_HOW[name], steps, precompute="on-the-fly" not in name)
    shutil.rmtree(tmp, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
    return res


def trl_dpo(cfg, how: dict, steps: int, precompute: bool, use_cpu: bool = True) -> dict:
    """`steps` optimiser steps of `cfg`'s work (a DPOConfig: model, pairs, sizes) with trl's DPOTrainer, run as `how`
    says (TRL_HOW), the reference log-probs precomputed or not, writing under cfg.output_dir; on the CPU unless
    `use_cpu` is False. Returns the figures."""
    torch, AutoModelForCausalLM, TrainerCallback = trl_imports()
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from rlhfkit.data.chat import end_of_turn, format_prompts
    from rlhfkit.models import load_tokenizer
    from rlhfkit.models.loading import resolve_model_path
    from rlhfkit.trainers.dpo import load_pairs, plan_batches

    tmp = cfg.output_dir
    torch.manual_seed(cfg.seed)
    pairs, _ = load_pairs(cfg.prefs)
    # rlhfkit's first-epoch shuffle (plan_batches with the run seed): TRL reads it sequentially, so each optimiser
    # step holds exactly the pairs rlhfkit's does. Inside a step rlhfkit orders the pairs by length (its own
    # default, fewer padded tokens); TRL keeps the shuffled order, as it would by itself.
    cfg.max_steps, cfg.epochs = None, 1
    order = torch.cat(plan_batches(len(pairs), cfg, torch.Generator().manual_seed(cfg.seed))).tolist()
    pairs = [pairs[i] for i in order]
    path = resolve_model_path(cfg.model)
    tok = load_tokenizer(str(path), padding_side="left")
    eot = end_of_turn(tok)
    texts = format_prompts(tok, [p.get("messages") or p["prompt"] for p in pairs], cfg)
    data = Dataset.from_dict({"prompt": texts, "chosen": [p["chosen"] + eot for p in pairs],
                              "rejected": [p["rejected"] + eot for p in pairs]})
    micro = how.get("micro") or cfg.micro_batch_size
    weights_bf16 = how.get("bf16") and not how.get("fp32_weights")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if weights_bf16 else torch.float32)
    args = DPOConfig(
        output_dir=tmp, per_device_train_batch_size=micro,
        gradient_accumulation_steps=cfg.batch_size // micro, max_steps=steps,
        loss_type=["sigmoid"], beta=cfg.beta, label_smoothing=cfg.smoothing,
        max_length=cfg.max_prompt_length + cfg.max_response_length, precompute_ref_log_probs=precompute,
        learning_rate=cfg.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay, adam_epsilon=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm,
        train_sampling_strategy="sequential", bf16=how.get("bf16", False), fp16=False,
        gradient_checkpointing=how.get("ckpt", False), use_cpu=use_cpu,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=cfg.seed)
    pre: list[float] = []

    class TimedDPOTrainer(DPOTrainer):  # only adds a clock around the one-off reference pass
        def _precompute_ref_logps(self, dataset, name, batch_size):
            t0 = time.perf_counter()
            out = super()._precompute_ref_logps(dataset, name, batch_size)
            pre.append(time.perf_counter() - t0)
            return out

    callback, stamps, _ = clock(TrainerCallback)
    trainer = TimedDPOTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                              peft_config=lora_config(model, cfg) if cfg.lora else None, callbacks=[callback])
    trainer.train()
    timing = benchdoc.unit_times(stamps, WARMUP)
    res = {"unit_s": timing["wall_s"], "cpu_s": timing["cpu_s"], "units_timed": timing["units"],
           "bf16": how.get("bf16", False), "fp32_weights": how.get("fp32_weights", False),
           "gradient_checkpointing": how.get("ckpt", False), "micro_pairs": micro,
           "precompute_s": sum(pre) if pre else None,
           "precomputed": precompute, "train_rows": len(trainer.train_dataset), "peak_rss_gb": peak_rss_gb()}
    return res


# ----------------------------------------------------------------------------- driver


def versions(python: str | None) -> dict:
    """Library versions seen by `python` (this interpreter when None)."""
    code = ("import json, importlib.metadata as m\nout = {}\nfor p in ('torch', 'transformers', 'peft', 'trl', "
            "'datasets'):\n    try: out[p] = m.version(p)\n    except Exception: pass\nprint(json.dumps(out))")
    try:
        proc = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(proc.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}


def machine(trl_python: str | None, threads: int | None = None) -> str:
    import torch

    cpu = "unknown CPU"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0]
    v = versions(trl_python)
    libs = ", ".join(f"{k} {v[k]}" for k in ("transformers", "peft", "trl", "datasets") if k in v)
    n = threads or torch.get_num_threads()
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({n} thread{'s' * (n != 1)} per "
            "configuration), "
            f"{libs}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, "
            f"1-min load average at start {load:.1f}")


def default_names(trl_python: str | None) -> list[str]:
    from rlhfkit.trainers.grpo_config import GRPOConfig

    names = [n for n in GRPO_CONFIGS if n != "grpo-lora-all" or GRPOConfig().lora_layers is not None]
    names += list(DPO_CONFIGS)
    return names + (list(TRL_CONFIGS) if trl_python else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None,
                    help="units per configuration, the first a warm-up: GRPO rollouts (default 4) and, unless "
                    "--dpo-steps is given, DPO optimiser steps (default 8)")
    ap.add_argument("--dpo-steps", type=int, default=None, help=f"DPO optimiser steps (at most {DPO_MAX_STEPS})")
    ap.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(ALL)}")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--trl-python", default=None,
                    help="python with trl==1.12.0 installed (the `bench` extra): also run trl's trainers")
    ap.add_argument("--smoke", action="store_true", help="check the plumbing on a much smaller work (16 completions "
                    "x 4 tokens; DPO on 24 pairs, 8 per step): figures meaningless, implies --no-write")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch/OpenMP threads per configuration (1: CPU seconds equal wall seconds on an idle core)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global smoke
    smoke = a.smoke
    grpo_steps = a.steps or 4
    dpo_steps = a.dpo_steps or a.steps or 8
    if not 1 <= dpo_steps <= DPO_MAX_STEPS:
        ap.error(f"DPO steps must be in 1..{DPO_MAX_STEPS} (one epoch of full 16-pair batches)")
    if a.one:
        benchdoc.set_threads(a.threads)
        steps = grpo_steps if is_grpo(a.one) else dpo_steps
        if a.one in TRL_CONFIGS:
            (run_trl_grpo if is_grpo(a.one) else run_trl_dpo)(a.one, steps)
        else:
            (run_rlhfkit_grpo if is_grpo(a.one) else run_rlhfkit_dpo)(a.one, steps)
        return
    names = a.configs.split(",") if a.configs else default_names(a.trl_python)
    unknown = [n for n in names if n not in ALL]
    if unknown:
        ap.error(f"unknown configs {unknown}; choose from {','.join(ALL)}")
    header = machine(a.trl_python, a.threads)
    print(header, flush=True)
    peak = matmul_peak(a.threads)
    print(f"matmul peak ({a.threads or 'default'} threads): " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in peak.items()),
          flush=True)
    results: dict[str, dict | str] = {}
    for name in names:
        python = a.trl_python if name in TRL_CONFIGS else sys.executable
        if python is None:
            results[name] = "skipped: pass --trl-python"
            print(f"{name}: {results[name]}", flush=True)
            continue
        steps = grpo_steps if is_grpo(name) else dpo_steps
        t0 = time.time()
        threads = ["--threads", str(a.threads)] if a.threads else []
        proc = subprocess.run([python, __file__, "--one", name, "--steps", str(grpo_steps), "--dpo-steps",
                               str(dpo_steps), *threads] + (["--smoke"] if smoke else []), capture_output=True,
                              text=True, env=benchdoc.thread_env(a.threads))
        m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
        results[name] = json.loads(m.group(1)) if m else f"failed: {proc.stderr.strip().splitlines()[-1:]}"
        print(f"{name} ({steps} units, {time.time() - t0:.0f} s in all): {results[name]}", flush=True)
        if not m:
            print(proc.stderr[-4000:], file=sys.stderr)
    table = render(header, results, grpo_steps, dpo_steps, peak)
    print(table)
    if smoke:
        print("--smoke: a reduced work, figures meaningless; docs/benchmarks.md left alone")
    elif not a.no_write:
        benchdoc.write_block("bench_grpo_dpo", "GRPO and DPO against TRL (bench/bench_grpo_dpo.py)", table)


def matmul_peak(threads: int | None) -> dict[str, float]:
    """{dtype: GFLOP/s}: this process's best torch.mm at the default model's shapes (bench/utilisation.py),
    with the threads each configuration gets."""
    from utilisation import measure_peak

    from rlhfkit.trainers.grpo_config import GRPOConfig

    benchdoc.set_threads(threads)
    return measure_peak({"decode": GRPOConfig().rollout_batch_size, "teacher-forced": 1024})["peak"]


# ----------------------------------------------------------------------------- rendering


def fmt(x, spec: str = ".1f") -> str:
    return "n/a" if x is None or x != x else format(x, spec)


def defaults():
    """(GRPOConfig(), DPOConfig(), number of DPO training pairs): the shipped defaults the text describes."""
    from rlhfkit.trainers.dpo import load_pairs
    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.grpo_config import GRPOConfig

    d = DPOConfig()
    return GRPOConfig(), d, len(load_pairs(d.prefs)[0])


def grpo_work(c) -> str:
    layers = "all layers" if c.lora_layers is None else f"the top {c.lora_layers} layers"
    return (f"{c.prompts}, {c.prompts_per_iteration} prompts x G={c.group_size} = {c.rollout_batch_size} completions "
            f"per rollout, {c.max_new_tokens} new tokens, temperature {c.temperature}, top-k/top-p off, reward "
            f"`{c.reward}` (exact match), {c.update_epochs} update epochs (mu), mini-batch {c.optimiser_batch}, "
            f"micro-batch {c.micro_batch_size}, loss {c.loss_agg}, clip {c.clip_eps}, beta {c.beta} (no reference), "
            f"LoRA r={c.lora_r} alpha={c.lora_alpha} on {layers}, lr {c.lr} with {c.warmup_steps} warm-up steps, "
            "fp32 unless the dtype column says otherwise")


def dpo_work(d, n_pairs: int) -> str:
    return (f"{d.prefs} ({n_pairs} training pairs), {d.batch_size} pairs per optimiser step in micro-batches of "
            f"{d.micro_batch_size} pairs (chosen and rejected in one forward), {d.loss_type} loss, beta {d.beta}, "
            f"prompt/response limits {d.max_prompt_length}/{d.max_response_length} tokens, LoRA r={d.lora_r} "
            f"alpha={d.lora_alpha}, reference = the adapter-disabled base, lr {d.lr}, "
            "fp32 unless the dtype column says otherwise")


CMP_HEAD = ["| TRL config | TRL CPU s/{u} | TRL wall s/{u} | TRL peak RSS GB | rlhfkit config | rlhfkit CPU s/{u} "
            "| rlhfkit wall s/{u} | speed-up (CPU) | speed-up (wall) | rlhfkit peak RSS GB | memory (rlhfkit / TRL) |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]


def compare_rows(results: dict, trl_name: str) -> list[str]:
    """One row per rlhfkit configuration compared with `trl_name`: speed-up = TRL s / rlhfkit s per unit, by CPU
    seconds and by wall seconds (rlhfkit wall = its phase timings, as before)."""
    lines = []
    t = results.get(trl_name)
    for ours_name in [n for n in TRL_CONFIGS[trl_name] if n in results] or ["(none run)"]:
        ours = results.get(ours_name, "not run")
        if not isinstance(t, dict) or not isinstance(ours, dict):
            why = t if isinstance(t, str) else ours if isinstance(ours, str) else "not run"
            lines.append(f"| {trl_name} | | | | {ours_name} | {why} | | | | | |")
            continue
        memory = ours["peak_rss_gb"] / t["peak_rss_gb"]
        lines.append(f"| {trl_name} | {fmt(t['cpu_s'], '.2f')} | {fmt(t['unit_s'], '.2f')} | {t['peak_rss_gb']:.2f} "
                     f"| {ours_name} | {fmt(ours['cpu_s'], '.2f')} | {fmt(ours['unit_s'], '.2f')} "
                     f"| **{t['cpu_s'] / ours['cpu_s']:.2f}x** | {t['unit_s'] / ours['unit_s']:.2f}x "
                     f"| {ours['peak_rss_gb']:.2f} | **{memory:.2f}** |")
    return lines


def trl_dtype(r: dict) -> str:
    """How a trl run computed: fp32, or bf16 weights + autocast, with gradient checkpointing marked."""
    return ("fp32" if not r.get("bf16") else "fp32 weights + bf16 autocast" if r.get("fp32_weights")
            else "bf16 weights + autocast") + (", grad. ckpt" if r.get("gradient_checkpointing") else "")


FLOOR_HEAD = ["| pair | rlhfkit config | dtype | model GFLOP per unit | matmul peak GFLOP/s | floor s | rlhfkit CPU s "
              "| rlhfkit share of peak | TRL CPU s | highest speed-up possible (TRL CPU s / floor) | target "
              "| share of peak the target needs |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]


def floor_rows(results: dict, peak: dict[str, float]) -> list[str]:
    """Per target pair: rlhfkit's model FLOPs per unit (work_flops: the least work) at the matmul peak of its
    dtype is a time no trainer beats on this machine, so TRL's CPU s over it bounds the speed-up."""
    lines = []
    for label, trl_name, ours_name, speed_target, _ in TARGETS:
        t, ours = results.get(trl_name), results.get(ours_name)
        if not isinstance(t, dict) or not isinstance(ours, dict) or not ours.get("model_gflop"):
            continue
        dtype = "bf16" if ours.get("dtype") == "bf16" else "fp32"
        work = ours["model_gflop"]["total"]
        floor = work / peak[dtype]
        lines.append(f"| {label} | {ours_name} | {dtype} | {work:.0f} | {peak[dtype]:.1f} | {floor:.2f} "
                     f"| {ours['cpu_s']:.2f} | {100 * floor / ours['cpu_s']:.0f}% | {t['cpu_s']:.2f} "
                     f"| **{t['cpu_s'] / floor:.2f}x** | >= {speed_target:g}x "
                     f"| {100 * floor * speed_target / t['cpu_s']:.0f}% |")
    return lines


def render(header: str, results: dict, grpo_steps: int, dpo_steps: int, peak: dict[str, float] | None = None) -> str:
    c, d, n_pairs = defaults()
    steps_per_rollout = c.update_epochs * (c.rollout_batch_size // c.optimiser_batch)
    accum = c.optimiser_batch // c.micro_batch_size
    lines = [f"Machine: {header}.",
             "CPU speed targets: like for like >= 3x and rlhfkit's defaults >= 4x faster per unit than trl's "
             "trainers, at <= 0.3x their peak memory (the first target: >= 1.5x at equal or lower memory). Speed-up = "
             "TRL CPU s / rlhfkit CPU s per unit (time.process_time of each configuration's process: with one "
             "thread per configuration it equals wall time on an idle core and other jobs do not inflate it; the "
             "wall-time ratio is shown next to it); memory = rlhfkit peak RSS / TRL peak RSS (each configuration "
             "in its own process). rlhfkit's wall s per unit are its phase timings (metrics.jsonl)."]
    grpo = {k: v for k, v in results.items() if is_grpo(k)}
    dpo = {k: v for k, v in results.items() if not is_grpo(k)}
    if grpo:
        lines += ["", f"**GRPO** (`rlhfkit grpo` defaults): {grpo_work(c)}. One unit = one rollout of "
                  f"{c.rollout_batch_size} completions and all its updates ({c.update_epochs} epochs x "
                  f"{c.rollout_batch_size // c.optimiser_batch} mini-batches = {steps_per_rollout} optimiser steps). "
                  "rlhfkit: one iteration, metrics.jsonl timing/rollout_s + timing/update_s (sampling, reward, "
                  "teacher-forced old log-probs, update). TRL generates once per steps_per_generation x "
                  f"num_iterations micro-steps = {steps_per_rollout} optimiser steps, so its unit is the wall time of "
                  f"those {steps_per_rollout} steps (on_step_end stamps, each group starting at a generation). "
                  f"{grpo_steps} units per configuration, the first excluded as warm-up.", "",
                  "| config | dtype | CPU s/rollout | s/rollout | generate s | reward s | old log-probs s | update s "
                  "| rows updated | completion tokens | peak RSS GB |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in grpo.items():
            if isinstance(r, str):
                lines.append(f"| {name} | {r} | | | | | | | | | |")
            elif name in TRL_CONFIGS:
                lines.append(f"| {name} | {trl_dtype(r)} | {fmt(r['cpu_s'])} | {fmt(r['unit_s'])} | | | | "
                             f"| 100% (all-equal-reward groups {fmt(100 * r['frac_reward_zero_std'], '.0f')}%) "
                             f"| {fmt(r['completion_tokens'])} | {r['peak_rss_gb']:.2f} |")
            else:
                lines.append(f"| {name} | {r.get('dtype', 'fp32')} | {fmt(r['cpu_s'])} | {fmt(r['unit_s'])} "
                             f"| {fmt(r['generate_s'])} | {fmt(r['reward_s'], '.3f')} "
                             f"| {fmt(r['logprobs_s'])} | {fmt(r['update_s'])} | {100 * r['rows_updated']:.0f}% "
                             f"| {fmt(r['completion_tokens'])} | {r['peak_rss_gb']:.2f} |")
        cmp = [row for t in TRL_CONFIGS if is_grpo(t) and t in grpo for row in compare_rows(results, t)]
        if cmp:
            lines += ["", *[h.format(u="rollout") for h in CMP_HEAD], *cmp]
        lines += ["", f"`grpo` is `rlhfkit grpo` as shipped: groups whose {c.group_size} completions all got the "
                  "same reward (advantage 0) are left out of the teacher-forced pass and the update "
                  "(drop_zero_std_groups), so its time depends on the share of such groups (\"rows updated\"; "
                  "with a 135M model most arithmetic groups score all 0). `grpo-all-rows` updates every row: the "
                  "same work as TRL, which has no such option. Both run each group's prompt once in sampling, "
                  "scoring and the update (share_prompts, docs/algorithms.md); `grpo-all-rows-unshared` runs it "
                  "for every row, as TRL does, which isolates that gain. \"old log-probs s\" = timing/logprobs_s."]
    if dpo:
        lines += ["", f"**DPO** (`rlhfkit dpo` defaults): {dpo_work(d, n_pairs)}. One unit = one optimiser step of "
                  f"{d.batch_size} pairs (rlhfkit: metrics.jsonl timing/step_s; TRL: wall time between on_step_end "
                  f"stamps). {dpo_steps} steps per configuration, the first excluded as warm-up. A default "
                  f"`rlhfkit dpo` run ({d.epochs} epochs) precomputes the reference log-probs of all {n_pairs} pairs "
                  "once (`precompute_ref_logps=None` chooses it when the run visits every pair; `dpo` sets it, as a "
                  "short run would not); TRL's default computes them on the fly (`precompute_ref_log_probs=False`); "
                  "both ways are timed. The one-off precomputation is not in the per-step figure and is reported "
                  "apart.", "",
                  f"| config | dtype | pairs per micro-batch | CPU s/step | s/step | reference precompute s (one-off, "
                  f"{n_pairs} pairs) | peak RSS GB |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in dpo.items():
            if isinstance(r, str):
                lines.append(f"| {name} | {r} | | | | | |")
            else:
                pre = fmt(r["precompute_s"]) if r.get("precompute_s") is not None else "- (on the fly)"
                dtype = trl_dtype(r) if name in TRL_CONFIGS else r.get("dtype", "fp32")
                lines.append(f"| {name} | {dtype} | {r.get('micro_pairs', d.micro_batch_size)} "
                             f"| {fmt(r['cpu_s'], '.2f')} | {fmt(r['unit_s'], '.2f')} | {pre} | {r['peak_rss_gb']:.2f} |")
        cmp = [row for t in TRL_CONFIGS if not is_grpo(t) and t in dpo for row in compare_rows(results, t)]
        if cmp:
            lines += ["", *[h.format(u="step") for h in CMP_HEAD], *cmp]
    if any(k in TRL_CONFIGS for k in results):
        lines += ["", "Against the CPU speed targets (speed-up of CPU s per unit):", "",
                  benchdoc.ratio_table([t for t in TARGETS if t[1] in results or t[2] in results], results)]
    floors = floor_rows(results, peak) if peak else []
    if floors:
        lines += ["", "How far each target is from the hardware: rlhfkit's model FLOPs per unit (bench/work_flops.py: "
                  "unpadded lengths, a shared prompt once, the chat header all prompts share once per forward call, "
                  "adapters merged while sampling, a row's decode ending at its last token; the mean over the timed "
                  "units) at this process's best torch.mm rate in the "
                  "configuration's dtype (bench/utilisation.py's shapes, the same threads) is a floor neither "
                  "trainer can beat here; TRL's CPU s over that floor is the largest speed-up any trainer could "
                  "show against it, and a target of k x needs k x floor / TRL CPU s of the peak over the whole unit.", "", *FLOOR_HEAD, *floors]
    if not any(k in TRL_CONFIGS for k in results):
        return "\n".join(lines + ["", "TRL comparison: not run (pass --trl-python with an interpreter that has "
                                        "trl==1.12.0, the `bench` extra)."])
    lines += [
        "", "How trl==1.12.0 is set up (every value mapped from the rlhfkit defaults above):", "",
        "- Same model files (`AutoModelForCausalLM.from_pretrained`), tokenizer and text: prompts are formatted "
        "by rlhfkit (`rlhfkit.data.chat.format_prompts`: SmolLM2's chat template) and given to TRL as plain "
        "text, so both see the same token ids; TRL reads rlhfkit's own prompt / pair order (`shuffle_dataset=False`, "
        "`train_sampling_strategy=\"sequential\"`), so every optimiser step holds the same pairs in both (inside a "
        "DPO step rlhfkit runs them longest first, its default; TRL in the shuffled order, its default). Datasets are "
        "built with `datasets.Dataset.from_dict`.",
        "- `trl-grpo`, `trl-dpo`, `trl-dpo-ref-on-the-fly`, like rlhfkit's fp32 rows: fp32 (`bf16=False`), no gradient "
        "checkpointing (TRL's default is on). `trl-*-best`: model loaded with `dtype=torch.bfloat16` and "
        "`bf16=True` (autocast; peft keeps the LoRA weights fp32, as rlhfkit's dtype=bf16 does), no gradient "
        "checkpointing, DPO with 4 pairs per micro-batch x 4 accumulation steps; `-ckpt`: the same with "
        "`gradient_checkpointing=True`. All: CPU (`use_cpu=True`), AdamW "
        "with the same lr, warm-up steps (`constant_with_warmup`), weight decay, eps and grad-norm clip; LoRA through "
        f"peft, r={c.lora_r}, alpha={c.lora_alpha}, dropout {c.lora_dropout}, on the modules rlhfkit picks "
        "(`rlhfkit.models.lora.default_lora_targets`: q/k/v/o/gate/up/down projections) of all layers; "
        "`report_to=\"none\"`, `save_strategy=\"no\"`, `logging_steps=1`.",
        f"- GRPOTrainer: `num_generations={c.group_size}`, `generation_batch_size={c.rollout_batch_size}` (so "
        f"`steps_per_generation={c.rollout_batch_size // c.micro_batch_size}`), `per_device_train_batch_size="
        f"{c.micro_batch_size}` x `gradient_accumulation_steps={accum}` = {c.optimiser_batch} sequences per optimiser "
        f"step (rlhfkit's mini-batch), `num_iterations={c.update_epochs}` (mu), `max_completion_length="
        f"{c.max_new_tokens}`, `temperature={c.temperature}`, `top_k={c.top_k}`, `top_p={c.top_p}`, "
        f"`beta={c.beta}` (no reference model), `epsilon={c.clip_eps}`, `scale_rewards=\"group\"`, "
        "`loss_type=\"dapo\"` (token mean over the accumulated batch: rlhfkit's token-mean), "
        "`mask_truncated_completions=False`, the same reward function (`rlhfkit.rewards.get_reward(\"arithmetic\")` "
        "through `rlhfkit.rewards.score_batch`), transformers `generate` (`use_vllm=False`), `log_completions=False`. "
        "Like rlhfkit, TRL then runs one teacher-forced pass for the old log-probs (its generation spans more than "
        "one optimiser step).",
        f"- DPOTrainer: `per_device_train_batch_size={d.micro_batch_size}` x `gradient_accumulation_steps="
        f"{d.batch_size // d.micro_batch_size}`, `loss_type=[\"sigmoid\"]`, `beta={d.beta}`, `label_smoothing=0`, "
        f"`max_length={d.max_prompt_length + d.max_response_length}` (TRL has one limit, not rlhfkit's separate "
        f"prompt {d.max_prompt_length} / response {d.max_response_length}; the longest pair, 54 + 36 tokens, is cut "
        "by neither), responses end with `<|im_end|>` in both, reference = peft adapters disabled, "
        "`precompute_ref_log_probs` as the configuration name says (`precompute_ref_batch_size` unset: TRL then "
        f"precomputes in micro-batches of {d.micro_batch_size} pairs, like rlhfkit; TRL also writes the table to a "
        "datasets cache file, inside its precompute time).",
        "- Not matched (no knob): TRL's DPO forward computes logits over prompt and response tokens (rlhfkit's over "
        "the response only) and logs entropy / token accuracy; TRL's GRPO computes per-token entropy in every "
        "training forward (rlhfkit once, in its scoring pass); TRL pads a whole generation batch to one width before "
        "splitting it (rlhfkit trims each micro-batch); TRL's warm-up starts at lr 0 (rlhfkit at lr / warm-up "
        "steps); TRL's second GRPO epoch reuses the first epoch's micro-batches (rlhfkit reshuffles); sampling seeds "
        "differ, so completions, their lengths and the share of all-equal-reward groups differ (shown above).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
