"""PPO iteration speed on the standard work, written to docs/benchmarks.md.

Standard work: SmolLM2-135M-Instruct, 16 prompts per iteration (builtin:reviews), 48 new tokens,
temperature 1, 2 PPO epochs, mini-batch 8, sentiment reward; LoRA and full fine-tuning, fp32 and
bf16 (bf16 only where it is fast: see rlhfkit.models.loading.fast_bf16_available, or --force-bf16).

Each configuration runs in its own subprocess so peak RSS is per configuration. The first
iteration is a warm-up and is excluded from the means.

With `--trl-python PY` (an interpreter that has trl==1.12.0, the `bench` extra), the same work is
also run by trl's experimental PPOTrainer (configurations `trl-*`), so the ratios come from one run.
TRL's design needs a separate value model and a reward *model* (both AutoModelForSequenceClassification
built from the same SmolLM2 weights); it cannot take a Python reward function. So TRL does one more
135M forward per rollout (the reward model) and trains a full 135M value model, as its users do.
The `trl-*-fp32` configurations run it like for like with rlhfkit's fp32 ones (fp32, no gradient checkpointing,
no sample generations); `trl-best` is what a TRL user would pick on a CPU with fast bf16: every model loaded in
bf16 (`dtype=torch.bfloat16`: `bf16=True` by itself only autocasts, the weights stay as loaded, and TRL loads a
model given by name in fp32 unless `model_init_kwargs` says otherwise) plus `bf16=True` (autocast), LoRA on every layer, no gradient checkpointing (`trl-best-ckpt`: with it, TRL's default).

Timing: each unit's wall seconds and CPU seconds (time.process_time of the configuration's process, all threads).
With `--threads 1` (OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every configuration's process) a unit's CPU
seconds equal its wall seconds on an idle core and are not inflated by other jobs, so the speed-ups (TRL CPU s /
rlhfkit CPU s) hold on a shared machine.

    python bench/bench_ppo.py [--iterations 3] [--threads 1] [--configs lora-fp32,full-fp32] [--no-write]
    python bench/bench_ppo.py --configs full-fp32 --set share_prefix=false --no-write   # one side of an A/B
    .venv-bench/bin/python bench/bench_ppo.py --trl-python .venv-bench/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import benchdoc

CONFIGS = {
    "lora-fp32": {"lora": True, "dtype": "fp32", "lr": 1e-3, "lora_layers": None},
    "lora-top12-fp32": {"lora": True, "dtype": "fp32", "lr": 1e-3, "lora_layers": 12},  # the demo default
    "lora-bf16": {"lora": True, "dtype": "bf16", "lr": 1e-3, "lora_layers": None},
    "full-fp32": {"lora": False, "dtype": "fp32", "lr": 1e-5},
    "full-bf16": {"lora": False, "dtype": "bf16", "lr": 1e-5},
    "default": {"lora": True, "dtype": "auto", "lr": 1e-3},  # PPOConfig's dtype (auto) and adapter (lora_layers)
}
STANDARD = {"rollout_batch_size": 16, "max_new_tokens": 48, "temperature": 1.0, "ppo_epochs": 2,
            "mini_batch_size": 8, "micro_batch_size": 8, "num_eval_prompts": 0, "prompts": "builtin:reviews",
            "reward": "sentiment", "quiet": True, "tensorboard": False}
# trl==1.12.0 experimental PPOTrainer on the same work: how it runs, and the rlhfkit configs it is compared with.
TRL_CONFIGS = {
    "trl-lora-fp32": {"lora": True, "bf16": False, "ckpt": False, "vs": ["lora-fp32", "lora-top12-fp32"]},
    "trl-full-fp32": {"lora": False, "bf16": False, "ckpt": False, "vs": ["full-fp32"]},
    "trl-best": {"lora": True, "bf16": True, "ckpt": False, "vs": ["default", "lora-bf16"]},
    "trl-best-ckpt": {"lora": True, "bf16": True, "ckpt": True, "vs": ["default", "lora-bf16"]},
}
# (label, TRL config, rlhfkit config, speed-up target, memory-ratio target): the CPU speed targets.
TARGETS = [("like for like (LoRA every layer, fp32)", "trl-lora-fp32", "lora-fp32", 3.0, 0.3),
           ("default vs TRL fp32", "trl-lora-fp32", "default", 4.0, 0.3),
           ("default vs TRL best", "trl-best", "default", 4.0, 0.3),
           ("like for like at bf16 (LoRA every layer)", "trl-best", "lora-bf16", 3.0, 0.3)]


def run_one(name: str, iterations: int, overrides: dict | None = None) -> dict:
    """Run one configuration in this process (`overrides`: extra PPOConfig fields); print a JSON line
    with its figures."""
    import resource

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    out = benchdoc.scratch_dir()
    cfg = build_config(PPOConfig, {**STANDARD, **CONFIGS[name], **(overrides or {}), "iterations": iterations,
                                   "output_dir": out, "run_name": name})
    stamps = benchdoc.tracker_stamps()
    train(cfg)
    rows = [json.loads(line) for line in open(Path(out) / name / "metrics.jsonl")]
    rows = rows[1:] or rows  # drop the warm-up iteration
    mean = lambda k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    res = {k: mean(f"timing/{k}") for k in ("generate_s", "reward_s", "logprobs_s", "update_s")}
    res["iteration_s"] = res["generate_s"] + res["reward_s"] + res["logprobs_s"] + res["update_s"]
    res["tokens_per_s"] = mean("throughput/tokens_per_s")
    clock = benchdoc.unit_times(stamps)  # log to log: iterations 2.., the warm-up left out
    res.update(cpu_s=clock["cpu_s"], wall_unit_s=clock["wall_s"], dtype=cfg.dtype, lora_layers=cfg.lora_layers)
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps(res), flush=True)
    return res


def run_trl(name: str, iterations: int) -> dict:
    """The standard work with trl's PPOTrainer in this process; prints a JSON line with its figures."""
    from rlhfkit.models.loading import resolve_model_path

    res = trl_ppo(resolve_model_path("smollm2-135m-instruct"), STANDARD, TRL_CONFIGS[name], iterations)
    print("RESULT " + json.dumps(res), flush=True)
    return res


def trl_ppo(path, work: dict, how: dict, iterations: int, use_cpu: bool = True) -> dict:
    """`iterations` of `work` (STANDARD's keys) with trl's PPOTrainer on the model folder `path`, run as `how` says
    (TRL_CONFIGS' lora / bf16 / ckpt), on the CPU unless `use_cpu` is False. Returns the figures."""
    import resource

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from rlhfkit.data.chat import format_prompts
    from rlhfkit.data.prompts import load_prompts
    from rlhfkit.models import load_tokenizer
    from rlhfkit.models.lora import default_lora_targets
    from rlhfkit.trainers.options import ModelArgs

    torch.manual_seed(0)
    tok = load_tokenizer(str(path), padding_side="left")
    # TRL derives the attention mask from `token != pad`; SmolLM2's pad is its eos (<|im_end|>), which
    # also closes every chat turn in the prompt. A distinct pad keeps TRL's masks right.
    tok.pad_token = "<|endoftext|>"
    n = work["rollout_batch_size"]
    records = load_prompts(work["prompts"], split="train", seed=0)[: n * iterations]
    texts = format_prompts(tok, [r["prompt"] for r in records], ModelArgs())
    data = Dataset.from_dict({"input_ids": [tok(t, add_special_tokens=False)["input_ids"] for t in texts]})
    lora, dtype = how["lora"], torch.bfloat16 if how["bf16"] else torch.float32
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    value = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    reward = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    for m in (policy, value, reward):
        m.config.pad_token_id = tok.pad_token_id
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=default_lora_targets(policy),
                             task_type="CAUSAL_LM") if lora else None
    args = PPOConfig(output_dir=benchdoc.scratch_dir(), per_device_train_batch_size=work["micro_batch_size"],
                     gradient_accumulation_steps=n // work["micro_batch_size"],
                     num_mini_batches=n // work["mini_batch_size"], num_ppo_epochs=work["ppo_epochs"],
                     total_episodes=n * iterations, local_rollout_forward_batch_size=n,
                     response_length=work["max_new_tokens"], temperature=work["temperature"],
                     stop_token="eos", learning_rate=1e-3 if lora else 1e-5, bf16=how["bf16"], fp16=False,
                     gradient_checkpointing=how["ckpt"], num_sample_generations=0, report_to="none",
                     save_strategy="no", logging_steps=1, disable_tqdm=True, use_cpu=use_cpu, seed=0)

    stamps: list[tuple[float, float]] = []
    logged: list[dict] = []  # TRL's own metrics per iteration

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            stamps.append(benchdoc.stamp())

        def on_step_end(self, *a, **k):
            stamps.append(benchdoc.stamp())

        def on_log(self, args, state, control, logs=None, **k):
            logged.append(dict(logs or {}))

    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None,
                         reward_model=reward, value_model=value, train_dataset=data, eval_dataset=data,
                         peft_config=peft_config, callbacks=[Clock()])
    trainer.train()
    clock = benchdoc.unit_times(stamps, warmup=1)  # one optimiser step = one iteration; the first is a warm-up
    res = {"iteration_s": clock["wall_s"], "cpu_s": clock["cpu_s"],
           "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
           "iterations_timed": clock["units"], "trl_ratio_mean": [r.get("val/ratio") for r in logged]}
    res["tokens_per_s"] = n * work["max_new_tokens"] / res["iteration_s"]  # TRL keeps every position
    return res


def machine(threads: int | None = None) -> str:
    import torch

    cpu = "unknown CPU"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from rlhfkit.models.loading import fast_bf16_available

    load = os.getloadavg()[0]
    n = threads or torch.get_num_threads()
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({n} thread{'s' * (n != 1)} per "
            "configuration), "
            f"Python {platform.python_version()}, fast bf16: {fast_bf16_available()}, "
            f"{time.strftime('%Y-%m-%d')}, 1-min load average at start {load:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3, help="iterations per configuration (first is warm-up)")
    ap.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(CONFIGS)}")
    ap.add_argument("--force-bf16", action="store_true", help="run bf16 configurations even without fast bf16")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--trl-python", default=None,
                    help="python with trl==1.12.0 installed: also run the same work with trl's PPOTrainer")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a PPOConfig field in the rlhfkit configurations (repeatable; for A/Bs, "
                         "e.g. --set share_prefix=false); use with --no-write")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch/OpenMP threads per configuration (1: CPU seconds equal wall seconds on an idle core)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    overrides = dict(parse_override(kv) for kv in a.set)
    if a.one:
        benchdoc.set_threads(a.threads)
        if a.one in TRL_CONFIGS:
            run_trl(a.one, a.iterations)
        else:
            run_one(a.one, a.iterations, overrides)
        return
    from rlhfkit.models.loading import fast_bf16_available

    names = a.configs.split(",") if a.configs else list(CONFIGS) + (list(TRL_CONFIGS) if a.trl_python else [])
    header = machine(a.threads) + (f"; overrides {overrides}" if overrides else "")
    print(header)
    results: dict[str, dict | str] = {}
    for name in names:
        if name not in CONFIGS and name not in TRL_CONFIGS:
            raise SystemExit(f"unknown config {name!r}; choose from {','.join([*CONFIGS, *TRL_CONFIGS])}")
        if name in CONFIGS and CONFIGS[name]["dtype"] == "bf16" and not (fast_bf16_available() or a.force_bf16):
            results[name] = "skipped: no fast bf16 on this machine (bf16 matmuls are slower than fp32 here)"
            print(f"{name}: {results[name]}")
            continue
        python = a.trl_python if name in TRL_CONFIGS else sys.executable
        if python is None:
            results[name] = "skipped: pass --trl-python"
            continue
        sets = [] if name in TRL_CONFIGS else [arg for kv in a.set for arg in ("--set", kv)]
        threads = ["--threads", str(a.threads)] if a.threads else []
        proc = subprocess.run([python, __file__, "--one", name, "--iterations", str(a.iterations), *threads, *sets],
                              capture_output=True, text=True, env=benchdoc.thread_env(a.threads))
        m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
        results[name] = json.loads(m.group(1)) if m else f"failed: {proc.stderr.strip().splitlines()[-1:]}"
        print(name, results[name], flush=True)
    table = render(header, results, a.iterations)
    print(table)
    if not a.no_write:
        benchdoc.write_block("bench_ppo", "PPO iteration (bench/bench_ppo.py)", table)


def parse_override(kv: str) -> tuple[str, object]:
    """'key=value' -> (key, value parsed as YAML: false, 12, 0.5, null)."""
    import yaml

    key, sep, value = kv.partition("=")
    if not sep:
        raise SystemExit(f"--set {kv!r}: expected KEY=VALUE")
    return key, yaml.safe_load(value)


def render(header: str, results: dict, iterations: int) -> str:
    base = results.get("lora-fp32")
    lines = [f"Machine: {header}.", "",
             f"Standard work: {json.dumps({k: v for k, v in STANDARD.items() if k not in ('quiet', 'tensorboard')})}; "
             f"{iterations} iterations per configuration, the first excluded as warm-up; seconds per iteration. "
             "Phase columns are wall seconds (metrics.jsonl timing keys); `CPU s` is the process's CPU time per "
             "iteration (time.process_time, all threads), `wall s` the wall time between log calls. With one thread "
             "per configuration CPU s equal wall s on an idle core and other jobs do not inflate them: compare "
             "configurations by CPU s. `vs lora-fp32` = lora-fp32 CPU s / this config's CPU s.", "",
             "| config | dtype | adapted layers | generate s | reward s | logprobs+ref s | update s | CPU s | wall s "
             "| vs lora-fp32 | tokens/s | peak RSS GB |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        if name in TRL_CONFIGS:
            continue
        if isinstance(r, str):
            lines.append(f"| {name} | {r} | | | | | | | | | | |")
            continue
        ratio = f"{base['cpu_s'] / r['cpu_s']:.2f}x" if isinstance(base, dict) else "n/a"
        layers = "all" if r.get("lora_layers") is None else f"top {r['lora_layers']}"
        layers = layers if CONFIGS[name]["lora"] else "full fine-tuning"
        lines.append(f"| {name} | {r.get('dtype', '')} | {layers} | {r['generate_s']:.1f} | {r['reward_s']:.3f} "
                     f"| {r['logprobs_s']:.1f} | {r['update_s']:.1f} | {r['cpu_s']:.1f} | {r['wall_unit_s']:.1f} "
                     f"| {ratio} | {r['tokens_per_s']:.1f} | {r['peak_rss_gb']:.2f} |")
    lines.append("")
    lines += render_trl(results)
    return "\n".join(lines)


def render_trl(results: dict) -> list[str]:
    """rlhfkit against trl's PPOTrainer on the same work: speed-up = TRL CPU s / rlhfkit CPU s per iteration."""
    trl = {k: v for k, v in results.items() if k in TRL_CONFIGS}
    if not trl:
        return ["TRL comparison: not run (pass --trl-python with an interpreter that has trl==1.12.0)."]
    lines = ["TRL comparison (trl==1.12.0 `trl.experimental.ppo.PPOTrainer`, same prompts, 16 x 48 tokens, "
             "2 epochs, mini-batch 8). `trl-lora-fp32` / `trl-full-fp32`: fp32, no gradient checkpointing (like for "
             "like with rlhfkit's fp32 rows); `trl-best`: TRL's best settings here: policy, value and reward models "
             "loaded in bf16 plus `bf16=True` (autocast), LoRA on every layer, no gradient checkpointing; "
             "`trl-best-ckpt`: the same with TRL's default gradient checkpointing. Speed-up = TRL CPU s / rlhfkit "
             "CPU s per iteration (wall-time ratio next to it); memory = rlhfkit peak RSS / TRL peak RSS.", "",
             "| TRL config | TRL CPU s | TRL wall s | TRL peak RSS GB | rlhfkit config | rlhfkit CPU s | rlhfkit wall s "
             "| speed-up (CPU) | speed-up (wall) | rlhfkit peak RSS GB | memory ratio (rlhfkit / TRL) |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, t in trl.items():
        for ours_name in [n for n in TRL_CONFIGS[name]["vs"] if n in results] or ["(none run)"]:
            ours = results.get(ours_name)
            if isinstance(t, str) or not isinstance(ours, dict):
                lines.append(f"| {name} | {t if isinstance(t, str) else 'ok'} | | | {ours_name} | "
                             f"{ours if isinstance(ours, str) else 'not run'} | | | | | |")
                continue
            lines.append(f"| {name} | {t['cpu_s']:.1f} | {t['iteration_s']:.1f} | {t['peak_rss_gb']:.2f} | {ours_name} "
                         f"| {ours['cpu_s']:.1f} | {ours['wall_unit_s']:.1f} | {t['cpu_s'] / ours['cpu_s']:.2f}x "
                         f"| {t['iteration_s'] / ours['wall_unit_s']:.2f}x | {ours['peak_rss_gb']:.2f} "
                         f"| {ours['peak_rss_gb'] / t['peak_rss_gb']:.2f} |")
    lines += ["", "Against the CPU speed targets (speed-up of CPU s per iteration):", "",
              benchdoc.ratio_table(TARGETS, results)]
    lines += ["", "TRL needs a reward *model* and a separate value model (its design), so it also runs a 135M "
              "reward-model forward per rollout and trains a full 135M value model; rlhfkit puts a value head on "
              "the shared base and calls the reward function. `lora-top12-fp32` and `default` use rlhfkit's default "
              "adapter (LoRA on the top 12 of 30 layers; TRL has no frozen-trunk option); `lora-fp32` and "
              "`lora-bf16` adapt every layer, like the TRL runs. `default` is `dtype=auto` (bf16 where bf16 matmuls "
              "are fast, as here: frozen base in bf16 with autocast, trainable weights fp32, the same split peft "
              "keeps for TRL's adapters)."]
    return lines


if __name__ == "__main__":
    main()
