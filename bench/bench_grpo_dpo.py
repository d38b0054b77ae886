"""GRPO and DPO step speed and peak memory against trl's stable trainers (issue 5), written to docs/benchmarks.md.

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

    .venv-bench/bin/python bench/bench_grpo_dpo.py --trl-python .venv-bench/bin/python   # all, writes the docs
    .venv/bin/python bench/bench_grpo_dpo.py --configs grpo,dpo --no-write                 # rlhfkit only
    ... --configs grpo-all-rows,trl-grpo --steps 4 --dpo-steps 8 --no-write
    ... --smoke --steps 2 --configs dpo,trl-dpo     # plumbing check on a much smaller work (never written)
"""

from __future__ import annotations

import argparse
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

# rlhfkit configurations: overrides of the command's defaults (run settings come from GRPO_RUN / DPO_RUN).
GRPO_CONFIGS = {
    "grpo": {},  # `rlhfkit grpo` as shipped (drop_zero_std_groups=True: all-equal-reward groups skip the update)
    "grpo-all-rows": {"drop_zero_std_groups": False},  # every row updated, like TRL
    "grpo-all-rows-unshared": {"drop_zero_std_groups": False, "share_prompts": False},  # and each row runs its prompt
    "grpo-lora-all": {"lora_layers": None},  # only run when the default adapts the top N layers only
}
DPO_CONFIGS = {
    "dpo": {"precompute_ref_logps": True},  # what a default run chooses (it sees every pair: precompute)
    "dpo-ref-on-the-fly": {"precompute_ref_logps": False},
}
# trl configurations -> the rlhfkit configurations they are compared with.
TRL_CONFIGS = {
    "trl-grpo": ["grpo", "grpo-all-rows", "grpo-all-rows-unshared", "grpo-lora-all"],
    "trl-dpo": ["dpo"],
    "trl-dpo-ref-on-the-fly": ["dpo-ref-on-the-fly"],
}
ALL = list(GRPO_CONFIGS) + list(DPO_CONFIGS) + list(TRL_CONFIGS)
GRPO_RUN = {"dtype": "fp32", "num_eval_prompts": 0, "quiet": True, "tensorboard": False, "save_every": 0}
DPO_RUN = {"dtype": "fp32", "num_eval_prompts": 0, "quiet": True, "tensorboard": False, "save_every": 0}
# --smoke: a much smaller work that only checks the plumbing (figures meaningless; never written to the docs).
SMOKE = {"grpo": {"rollout_batch_size": 16, "generation_batch_size": 16, "mini_batch_size": 8, "micro_batch_size": 4,
                  "max_new_tokens": 4},
         "dpo": {"batch_size": 8, "micro_batch_size": 4}}
smoke = False  # set by main()
WARMUP = 1  # units excluded from the means
DPO_MAX_STEPS = 12  # 196 training pairs / 16: the 13th step of an epoch is a short batch of 4 pairs


def is_grpo(name: str) -> bool:
    return "grpo" in name


def grpo_config(name: str, iterations: int, out: str):
    from rlhfkit.runtime.config import build_config
    from rlhfkit.trainers.grpo_config import GRPOConfig

    overrides = {**GRPO_CONFIGS.get(name, {}), **(SMOKE["grpo"] if smoke else {})}
    return build_config(GRPOConfig, {**GRPO_RUN, **overrides, "iterations": iterations, "output_dir": out,
                                     "run_name": name})


def dpo_config(name: str, steps: int, out: str):
    from rlhfkit.runtime.config import build_config
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


def wall_clock():
    """Stamps every Tracker.log call (one per rlhfkit iteration / optimiser step): a wall-time cross-check
    (stamp k - stamp k-1 = unit k, logging and checkpoint checks included)."""
    from rlhfkit.runtime import tracker

    stamps: list[float] = []
    original = tracker.Tracker.log

    def log(self, iteration, metrics):
        stamps.append(time.perf_counter())
        return original(self, iteration, metrics)

    tracker.Tracker.log = log
    return stamps


# ----------------------------------------------------------------------------- rlhfkit


def run_rlhfkit_grpo(name: str, steps: int) -> dict:
    from rlhfkit.trainers.grpo import train

    out = benchdoc.scratch_dir()
    cfg = grpo_config(name, steps, out)
    stamps = wall_clock()
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
    res["wall_unit_s"] = mean([b - a for a, b in zip(stamps[WARMUP - 1:], stamps[WARMUP:])])
    res["rows_updated"] = mean([r.get("rollout/update_fraction", 1.0) for r in timed])
    res["completion_tokens"] = mean([r["rollout/response_length"] for r in timed])
    res["units_timed"] = len(timed)
    res["lora_layers"] = cfg.lora_layers
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
    stamps = wall_clock()
    summary = dpo.train(cfg)
    rows = [json.loads(line) for line in open(Path(out) / name / "metrics.jsonl")]
    timed = rows[WARMUP:] or rows
    res = {"unit_s": mean([r["timing/step_s"] for r in timed]),
           "wall_unit_s": mean([b - a for a, b in zip(stamps[WARMUP - 1:], stamps[WARMUP:])]),
           "precompute_s": sum(precompute) if precompute else None,
           "precomputed": summary.get("precomputed_ref_logps"), "units_timed": len(timed),
           "peak_rss_gb": peak_rss_gb()}
    shutil.rmtree(out, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
    return res


# ----------------------------------------------------------------------------- trl


def trl_imports():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's precompute progress bar
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    return torch, AutoModelForCausalLM, TrainerCallback


def clock(TrainerCallback):
    """(callback, stamps, logs): a stamp at train begin and at every optimiser-step end; TRL's own log lines."""
    stamps: list[float] = []
    history: list[dict] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **k):
            history.append(dict(logs or {}))

    return Clock(), stamps, history


def lora_config(model, cfg):
    """peft LoraConfig like rlhfkit's add_lora, on all layers (the TRL side always adapts every layer)."""
    from peft import LoraConfig

    from rlhfkit.models.policy import check_lora_targets

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=check_lora_targets(model, cfg.lora_target_modules), task_type="CAUSAL_LM",
                      bias="none")


def run_trl_grpo(name: str, steps: int) -> dict:
    """The standard GRPO work with trl's GRPOTrainer, knobs mapped from rlhfkit's GRPOConfig defaults."""
    torch, AutoModelForCausalLM, TrainerCallback = trl_imports()
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlhfkit.data.chat import format_prompts
    from rlhfkit.data.stream import PromptStream
    from rlhfkit.models import load_tokenizer
    from rlhfkit.models.loading import resolve_model_path
    from rlhfkit.rewards import score_batch
    from rlhfkit.trainers.rl import prepare_data

    tmp = benchdoc.scratch_dir()
    cfg = grpo_config("grpo", steps, tmp)
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

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
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
        max_steps=steps * steps_per_rollout, shuffle_dataset=False, bf16=False, fp16=False,
        gradient_checkpointing=False, use_cpu=True, use_vllm=False, log_completions=False, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=cfg.seed)
    callback, stamps, logs = clock(TrainerCallback)
    trainer = GRPOTrainer(model=model, reward_funcs=arithmetic, args=args, train_dataset=data, processing_class=tok,
                          peft_config=lora_config(model, cfg) if cfg.lora else None, callbacks=[callback])
    trainer.train()
    ends = stamps[::steps_per_rollout]  # train begin, then the end of every rollout's last optimiser step
    units = [b - a for a, b in zip(ends, ends[1:])]
    timed = units[WARMUP:] or units
    first_step = [stamps[i * steps_per_rollout + 1] - stamps[i * steps_per_rollout] for i in range(len(units))]
    train_logs = [x for x in logs if "loss" in x or "reward" in x]
    per_rollout = train_logs[::steps_per_rollout][WARMUP:] or train_logs
    res = {"unit_s": mean(timed), "units_timed": len(timed),
           "first_step_of_rollout_s": mean(first_step[WARMUP:] or first_step),  # generation + 1 optimiser step
           "optimiser_steps_per_unit": steps_per_rollout, "generation_batch_size": args.generation_batch_size,
           "steps_per_generation": args.steps_per_generation,
           "completion_tokens": mean([x.get("completions/mean_length", float("nan")) for x in per_rollout]),
           "frac_reward_zero_std": mean([x.get("frac_reward_zero_std", float("nan")) for x in per_rollout]),
           "peak_rss_gb": peak_rss_gb()}
    shutil.rmtree(tmp, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
    return res


def run_trl_dpo(name: str, steps: int) -> dict:
    """The standard DPO work with trl's DPOTrainer, knobs mapped from rlhfkit's DPOConfig defaults."""
    torch, AutoModelForCausalLM, TrainerCallback = trl_imports()
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from rlhfkit.data.chat import end_of_turn, format_prompts
    from rlhfkit.models import load_tokenizer
    from rlhfkit.models.loading import resolve_model_path
    from rlhfkit.trainers.dpo import load_pairs, plan_batches

    precompute = "on-the-fly" not in name
    tmp = benchdoc.scratch_dir()
    cfg = dpo_config(name, steps, tmp)
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
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    args = DPOConfig(
        output_dir=tmp, per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=cfg.batch_size // cfg.micro_batch_size, max_steps=steps,
        loss_type=["sigmoid"], beta=cfg.beta, label_smoothing=cfg.smoothing,
        max_length=cfg.max_prompt_length + cfg.max_response_length, precompute_ref_log_probs=precompute,
        learning_rate=cfg.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay, adam_epsilon=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm,
        train_sampling_strategy="sequential", bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True,
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
    units = [b - a for a, b in zip(stamps, stamps[1:])]
    timed = units[WARMUP:] or units
    res = {"unit_s": mean(timed), "units_timed": len(timed), "precompute_s": sum(pre) if pre else None,
           "precomputed": precompute, "train_rows": len(trainer.train_dataset), "peak_rss_gb": peak_rss_gb()}
    shutil.rmtree(tmp, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)
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


def machine(trl_python: str | None) -> str:
    import torch

    cpu = "unknown CPU"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0]
    v = versions(trl_python)
    libs = ", ".join(f"{k} {v[k]}" for k in ("transformers", "peft", "trl", "datasets") if k in v)
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
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
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global smoke
    smoke = a.smoke
    grpo_steps = a.steps or 4
    dpo_steps = a.dpo_steps or a.steps or 8
    if not 1 <= dpo_steps <= DPO_MAX_STEPS:
        ap.error(f"DPO steps must be in 1..{DPO_MAX_STEPS} (one epoch of full 16-pair batches)")
    if a.one:
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
    header = machine(a.trl_python)
    print(header, flush=True)
    results: dict[str, dict | str] = {}
    for name in names:
        python = a.trl_python if name in TRL_CONFIGS else sys.executable
        if python is None:
            results[name] = "skipped: pass --trl-python"
            print(f"{name}: {results[name]}", flush=True)
            continue
        steps = grpo_steps if is_grpo(name) else dpo_steps
        t0 = time.time()
        proc = subprocess.run([python, __file__, "--one", name, "--steps", str(grpo_steps), "--dpo-steps",
                               str(dpo_steps)] + (["--smoke"] if smoke else []), capture_output=True, text=True)
        m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
        results[name] = json.loads(m.group(1)) if m else f"failed: {proc.stderr.strip().splitlines()[-1:]}"
        print(f"{name} ({steps} units, {time.time() - t0:.0f} s in all): {results[name]}", flush=True)
        if not m:
            print(proc.stderr[-4000:], file=sys.stderr)
    table = render(header, results, grpo_steps, dpo_steps)
    print(table)
    if smoke:
        print("--smoke: a reduced work, figures meaningless; docs/benchmarks.md left alone")
    elif not a.no_write:
        benchdoc.write_block("bench_grpo_dpo", "GRPO and DPO against TRL (bench/bench_grpo_dpo.py)", table)


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
            f"LoRA r={c.lora_r} alpha={c.lora_alpha} on {layers}, lr {c.lr} with {c.warmup_steps} warm-up steps, fp32")


def dpo_work(d, n_pairs: int) -> str:
    return (f"{d.prefs} ({n_pairs} training pairs), {d.batch_size} pairs per optimiser step in micro-batches of "
            f"{d.micro_batch_size} pairs (chosen and rejected in one forward), {d.loss_type} loss, beta {d.beta}, "
            f"prompt/response limits {d.max_prompt_length}/{d.max_response_length} tokens, LoRA r={d.lora_r} "
            f"alpha={d.lora_alpha}, reference = the adapter-disabled base, lr {d.lr}, fp32")


CMP_HEAD = ["| TRL config | TRL s/{u} | TRL peak RSS GB | rlhfkit config | rlhfkit s/{u} | speed-up (TRL s / rlhfkit s) "
            "| rlhfkit peak RSS GB | memory (rlhfkit / TRL) | target met |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]


def compare_rows(results: dict, trl_name: str) -> list[str]:
    """One row per rlhfkit configuration compared with `trl_name`; target: >= 1.5x at memory ratio <= 1."""
    lines = []
    t = results.get(trl_name)
    for ours_name in [n for n in TRL_CONFIGS[trl_name] if n in results] or ["(none run)"]:
        ours = results.get(ours_name, "not run")
        if not isinstance(t, dict) or not isinstance(ours, dict):
            why = t if isinstance(t, str) else ours if isinstance(ours, str) else "not run"
            lines.append(f"| {trl_name} | | | {ours_name} | {why} | | | | |")
            continue
        speed, memory = t["unit_s"] / ours["unit_s"], ours["peak_rss_gb"] / t["peak_rss_gb"]
        met = "yes" if speed >= 1.5 and memory <= 1.0 else "no"
        lines.append(f"| {trl_name} | {fmt(t['unit_s'], '.2f')} | {t['peak_rss_gb']:.2f} | {ours_name} | "
                     f"{fmt(ours['unit_s'], '.2f')} | **{speed:.2f}x** | {ours['peak_rss_gb']:.2f} | "
                     f"**{memory:.2f}** | {met} |")
    return lines


def render(header: str, results: dict, grpo_steps: int, dpo_steps: int) -> str:
    c, d, n_pairs = defaults()
    steps_per_rollout = c.update_epochs * (c.rollout_batch_size // c.optimiser_batch)
    accum = c.optimiser_batch // c.micro_batch_size
    lines = [f"Machine: {header}.",
             "Target (issue 5): rlhfkit at least 1.5x faster per step than trl's stable trainers at equal or lower "
             "peak memory. Speed-up = TRL s / rlhfkit s; memory = rlhfkit peak RSS / TRL peak RSS (each "
             "configuration in its own process)."]
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
                  "| config | s/rollout | generate s | reward s | old log-probs s | update s | rows updated "
                  "| completion tokens | peak RSS GB |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, r in grpo.items():
            if isinstance(r, str):
                lines.append(f"| {name} | {r} | | | | | | | |")
            elif name in TRL_CONFIGS:
                lines.append(f"| {name} | {fmt(r['unit_s'])} | | | | | 100% (all-equal-reward groups "
                             f"{fmt(100 * r['frac_reward_zero_std'], '.0f')}%) | {fmt(r['completion_tokens'])} "
                             f"| {r['peak_rss_gb']:.2f} |")
            else:
                lines.append(f"| {name} | {fmt(r['unit_s'])} | {fmt(r['generate_s'])} | {fmt(r['reward_s'], '.3f')} "
                             f"| {fmt(r['logprobs_s'])} | {fmt(r['update_s'])} | {100 * r['rows_updated']:.0f}% "
                             f"| {fmt(r['completion_tokens'])} | {r['peak_rss_gb']:.2f} |")
        if "trl-grpo" in grpo:
            lines += ["", *[h.format(u="rollout") for h in CMP_HEAD], *compare_rows(results, "trl-grpo")]
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
                  f"| config | s/step | reference precompute s (one-off, {n_pairs} pairs) | peak RSS GB |",
                  "| --- | ---: | ---: | ---: |"]
        for name, r in dpo.items():
            if isinstance(r, str):
                lines.append(f"| {name} | {r} | | |")
            else:
                pre = fmt(r["precompute_s"]) if r.get("precompute_s") is not None else "- (on the fly)"
                lines.append(f"| {name} | {fmt(r['unit_s'], '.2f')} | {pre} | {r['peak_rss_gb']:.2f} |")
        cmp = [row for t in ("trl-dpo", "trl-dpo-ref-on-the-fly") if t in dpo for row in compare_rows(results, t)]
        if cmp:
            lines += ["", *[h.format(u="step") for h in CMP_HEAD], *cmp]
    if not any(k in TRL_CONFIGS for k in results):
        return "\n".join(lines + ["", "TRL comparison: not run (pass --trl-python with an interpreter that has "
                                        "trl==1.12.0, the `bench` extra)."])
    lines += [
        "", "How trl==1.12.0 is set up (every value mapped from the rlhfkit defaults above):", "",
        "- Same model files (`AutoModelForCausalLM.from_pretrained`, fp32), tokenizer and text: prompts are formatted "
        "by rlhfkit (`rlhfkit.data.chat.format_prompts`: SmolLM2's chat template) and given to TRL as plain "
        "text, so both see the same token ids; TRL reads rlhfkit's own prompt / pair order (`shuffle_dataset=False`, "
        "`train_sampling_strategy=\"sequential\"`), so every optimiser step holds the same pairs in both (inside a "
        "DPO step rlhfkit runs them longest first, its default; TRL in the shuffled order, its default). Datasets are "
        "built with `datasets.Dataset.from_dict`.",
        "- Both: fp32 (`bf16=False`), no gradient checkpointing (TRL's default is on), CPU (`use_cpu=True`), AdamW "
        "with the same lr, warm-up steps (`constant_with_warmup`), weight decay, eps and grad-norm clip; LoRA through "
        f"peft, r={c.lora_r}, alpha={c.lora_alpha}, dropout {c.lora_dropout}, on the modules rlhfkit picks "
        "(`rlhfkit.models.policy.default_lora_targets`: q/k/v/o/gate/up/down projections) of all layers; "
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
