"""rlhfkit against TRL 1.16 on the same work per optimiser step: GRPO, DPO, SFT and KTO, full fine-tuning and LoRA,
fp32 and bf16, in one process with the two sides alternating, the ratio printed; written to docs/benchmarks.md.

The work is given once, in TRL's names (`work()`: per_device_train_batch_size, gradient_accumulation_steps,
num_generations, max_completion_length, max_length, learning_rate, peft_config, ...), and the same dict builds
TRL's config (trl.GRPOConfig, ...) and rlhfkit's (rlhfkit.GRPOConfig, ...: rlhfkit reads TRL's batch names as TRL
does, src/rlhfkit/core/trl_batch.py). Both sides train the same model folder on the same `datasets.Dataset`. Only
the precision is said in each side's own words: rlhfkit `dtype=bf16` (frozen base weights bf16, trainable weights
fp32, bf16 autocast); TRL `bf16=True` (autocast) with the model loaded in bf16 under LoRA (peft keeps the adapters
fp32) and in fp32 for full fine-tuning, the same precisions. fp32: `bf16=False` (TRL's default is True).

The model is a randomly initialised model of SmolLM2-135M's config with SmolLM2's tokenizer (`--model` takes any
folder): loading is quick and a random model never stops sampling early, so both GRPO sides sample full-length
completions and the work per step is the same. A unit is one optimiser step (GRPO: one generation of
P x A completions and its one step, num_iterations 1). Each round runs every case on both sides, one after the
other, the side that goes first alternating between rounds; a side's first step is a warm-up and is left out.
Times are CPU seconds of this process (time.process_time) between the ends of consecutive optimiser steps
(rlhfkit: its Tracker.log, once per step; TRL: TrainerCallback.on_step_end); with one torch thread they equal wall
seconds on an idle core and other jobs on the machine do not inflate them, so the ratio holds under load where
seconds do not. ratio = TRL CPU s per step / rlhfkit CPU s per step (> 1: rlhfkit faster).

    python bench/bench_trl.py --threads 1                  # every case, 2 rounds, writes docs/benchmarks.md
    python bench/bench_trl.py --cases dpo-lora-fp32,sft-full-bf16 --rounds 3 --no-write
    python bench/bench_trl.py --smoke --model DIR          # plumbing check: 1 round, 2 steps, tiny shapes
    python bench/bench_trl.py --profile sft-full-fp32 --side rlhfkit   # cProfile of one side's run
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import benchdoc

ALGOS = ("grpo", "dpo", "sft", "kto")
CASES = [f"{a}-{adapter}-{dtype}" for a in ALGOS for adapter in ("full", "lora") for dtype in ("fp32", "bf16")]
SIDES = ("rlhfkit", "trl")
WARMUP = 1  # optimiser steps left out at the start of every run
WORDS = ["river", "garden", "storm", "train", "forest", "city", "song", "cat", "lamp", "bridge", "cloud", "stone",
         "apple", "road", "field", "boat"]  # one token each in SmolLM2's tokenizer: every prompt the same length
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sizes(smoke: bool) -> dict:
    """The shapes of the work: P sequences (DPO: pairs) per forward/backward, A accumulated, token limits."""
    if smoke:
        return {"P": 2, "A": 1, "completion": 4, "max_length": 48, "rows": 8}
    return {"P": 2, "A": 2, "completion": 16, "max_length": 64, "rows": 32}


def work(algo: str, adapter: str, smoke: bool, steps: int) -> dict:
    """The work of one case in TRL's names, given unchanged to TRL's config and to rlhfkit's."""
    from peft import LoraConfig

    s = sizes(smoke)
    lora = adapter == "lora"
    args = {"per_device_train_batch_size": s["P"], "gradient_accumulation_steps": s["A"], "max_steps": steps,
            "learning_rate": 1e-4 if lora else 1e-5, "lr_scheduler_type": "linear", "warmup_steps": 0,
            "weight_decay": 0.0, "max_grad_norm": 1.0, "optim": "adamw_torch_fused", "seed": 0, "logging_steps": 1,
            "report_to": "none", "save_strategy": "no",
            "gradient_checkpointing": False,  # TRL's default is True: a second forward per step rlhfkit does not run
            "peft_config": LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS,
                                      task_type="CAUSAL_LM") if lora else None}
    if algo == "grpo":
        args.update(num_generations=2 if smoke else 4, max_completion_length=s["completion"], temperature=1.0,
                    top_p=1.0, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", num_iterations=1)
    elif algo == "dpo":
        args.update(beta=0.1, loss_type="sigmoid", max_length=s["max_length"])
    elif algo == "sft":
        args.update(max_length=s["max_length"])
    else:
        args.update(beta=0.1, max_length=s["max_length"])
    return args


def dataset(algo: str, rows: int):
    """The same data for both sides, conversational (TRL's formats): GRPO prompts, DPO pairs, SFT conversations, KTO
    labelled completions. Every row of a kind has the same length in tokens."""
    from datasets import Dataset

    def user(i: int) -> list[dict]:
        return [{"role": "user", "content": f"Write one line about the {WORDS[i % len(WORDS)]}."}]

    def said(i: int, good: bool) -> list[dict]:
        w = WORDS[(i + 3) % len(WORDS)]
        text = f"The {w} is calm and the {w} is near." if good else f"A {w} was here, then the {w} went away."
        return [{"role": "assistant", "content": text}]

    if algo == "grpo":
        return Dataset.from_list([{"prompt": user(i)} for i in range(rows)])
    if algo == "dpo":
        return Dataset.from_list([{"prompt": user(i), "chosen": said(i, True), "rejected": said(i, False)}
                                  for i in range(rows)])
    if algo == "sft":
        return Dataset.from_list([{"messages": user(i) + said(i, True)} for i in range(rows)])
    return Dataset.from_list([{"prompt": user(i), "completion": said(i, i % 2 == 0), "label": i % 2 == 0}
                              for i in range(rows)])


def letter_e(completions, **kwargs) -> list[float]:
    """GRPO's reward on both sides: the share of 'e' in a completion (varies within every group)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [t.count("e") / max(len(t), 1) for t in texts]


def random_model(source: str, out: Path, layers: int | None = None) -> Path:
    """A randomly initialised model of `source`'s config (seed 0; `layers` transformer layers instead of the config's
    when given) with `source`'s tokenizer, saved in `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(source)
    if layers:
        config.num_hidden_layers = layers
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- the two sides


@contextlib.contextmanager
def step_stamps():
    """rlhfkit's Tracker.log (once per optimiser step; GRPO: once per generation) stamped while inside; yields the
    list of benchdoc.stamp() it fills."""
    from rlhfkit.runtime import tracker

    stamps: list[tuple[float, float]] = []
    original = tracker.Tracker.log

    def log(self, iteration, metrics):
        stamps.append(benchdoc.stamp())
        return original(self, iteration, metrics)

    tracker.Tracker.log = log
    try:
        yield stamps
    finally:
        tracker.Tracker.log = original


def run_rlhfkit(algo: str, dtype: str, args: dict, model: Path, data, out: str) -> dict:
    """One run of rlhfkit's trainer on the work; the CPU and wall seconds per optimiser step after the warm-up."""
    import rlhfkit

    cls = {"grpo": "GRPOConfig", "dpo": "DPOConfig", "sft": "SFTConfig", "kto": "KTOConfig"}[algo]
    own = {"grpo": {"num_eval_prompts": 0, "drop_zero_std_groups": False, "reward_funcs": letter_e,
                    "train_dataset": data},
           "dpo": {"num_eval_prompts": 0, "train_dataset": data, "precompute_ref_logps": False},
           "sft": {"max_eval_examples": 0, "rouge_examples": 0, "train_dataset": data},
           "kto": {"num_eval_prompts": 0, "train_dataset": data}}[algo]
    cfg = getattr(rlhfkit, cls)(**args, **own, model=str(model), dtype="bfloat16" if dtype == "bf16" else "float32",
                                output_dir=out, run_name=f"{algo}-rlhfkit", quiet=True, tensorboard=False)
    with step_stamps() as stamps:
        rlhfkit.train(cfg)
    rows = [json.loads(ln) for ln in open(Path(out) / f"{algo}-rlhfkit" / "metrics.jsonl")]
    res = benchdoc.unit_times(stamps)  # stamps[0] ends the warm-up step: units 2..
    res["tokens"] = rows[-1].get("rollout/response_length") if algo == "grpo" else None
    return res


def run_trl(algo: str, dtype: str, args: dict, model: Path, data, out: str) -> dict:
    """One run of TRL's trainer on the work; the CPU and wall seconds per optimiser step after the warm-up."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    stamps: list[tuple[float, float]] = []
    history: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(benchdoc.stamp())

        def on_log(self, a, state, control, logs=None, **k):
            history.append(dict(logs or {}))

    args = dict(args)
    peft_config = args.pop("peft_config")
    bf16 = dtype == "bf16"
    weights = torch.bfloat16 if bf16 and peft_config is not None else torch.float32
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=weights)
    tok = AutoTokenizer.from_pretrained(model)
    common = {"output_dir": out, "bf16": bf16, "fp16": False, "use_cpu": True, "disable_tqdm": True, **args}
    kind = {"grpo": (trl.GRPOConfig, trl.GRPOTrainer), "dpo": (trl.DPOConfig, trl.DPOTrainer),
            "sft": (trl.SFTConfig, trl.SFTTrainer), "kto": (trl.KTOConfig, trl.KTOTrainer)}[algo]
    config = kind[0](**common, **({"use_vllm": False, "log_completions": False} if algo == "grpo" else {}))
    extra = {"reward_funcs": letter_e} if algo == "grpo" else {}
    trainer = kind[1](model=policy, args=config, train_dataset=data, processing_class=tok, peft_config=peft_config,
                      callbacks=[Clock()], **extra)
    trainer.remove_callback(PrinterCallback)  # TRL prints every log dict without tqdm
    trainer.train()
    res = benchdoc.unit_times(stamps[WARMUP - 1:])
    lengths = [x["completions/mean_length"] for x in history if "completions/mean_length" in x]
    res["tokens"] = lengths[-1] if lengths else None
    return res


def run_side(side: str, case: str, model: Path, smoke: bool, steps: int) -> dict:
    """One side's run of `case` in a scratch folder removed afterwards."""
    algo, adapter, dtype = case.split("-")
    args = work(algo, adapter, smoke, steps)
    data = dataset(algo, sizes(smoke)["rows"])
    out = tempfile.mkdtemp(prefix=f"bench-trl-{side}-")
    try:
        return (run_rlhfkit if side == "rlhfkit" else run_trl)(algo, dtype, args, model, data, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_rounds(cases: list[str], model: Path, rounds: int, steps: int, smoke: bool, save: Path | None = None,
               meta: dict | None = None, sides=SIDES, first_round: int = 1) -> dict:
    """{case: {side: [per-round result or 'failed: ...']}}: every case on both sides, round after round, the side
    that goes first alternating (round r, counted from `first_round`, of CASES[i]: rlhfkit first when r + i is
    even, so a later run of some cases with first_round=2 goes the other way round). `save`: a JSON file rewritten
    after every run (`--from-json` renders a bench cut short)."""
    results: dict = {c: {s: [] for s in sides} for c in cases}
    for r in range(rounds):
        for case in cases:
            order = list(sides) if (r + first_round - 1 + CASES.index(case)) % 2 == 0 else list(reversed(sides))
            for side in order:
                t0 = time.time()
                try:
                    res = run_side(side, case, model, smoke, steps)
                except Exception as e:  # noqa: BLE001  (one failed side is a row saying why, not a lost bench)
                    res = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                results[case][side].append(res)
                if save:
                    save.write_text(json.dumps({**(meta or {}), "rounds": r + 1, "steps": steps,
                                                "results": results}, indent=1))
                shown = res if isinstance(res, str) else f"{res['cpu_s']:.2f} CPU s/step ({res['units']} steps)"
                print(f"round {r + first_round} {case} {side}: {shown} [{time.time() - t0:.0f} s]", flush=True)
        for case in cases:
            print(f"after round {r + first_round}: {case} {ratio_text(results[case])}", flush=True)
    return results


# ----------------------------------------------------------------------------- figures


def summary(per_side: dict) -> dict | None:
    """Mean CPU and wall s per step of each side over the rounds both sides ran, the ratio of the means (TRL /
    rlhfkit), and each round's ratio; None when no round has a good run of both."""
    pairs = [(o, t) for o, t in zip(per_side.get("rlhfkit", []), per_side.get("trl", []))
             if isinstance(o, dict) and isinstance(t, dict) and o["units"] and t["units"]]  # rounds both sides ran
    if not pairs:
        return None
    good = dict(zip(SIDES, zip(*pairs)))
    mean = {s: {k: sum(r[k] for r in good[s]) / len(good[s]) for k in ("cpu_s", "wall_s")} for s in SIDES}
    rounds = [t["cpu_s"] / o["cpu_s"] for o, t in pairs]
    return {**{f"{s}_{k}": mean[s][k] for s in SIDES for k in ("cpu_s", "wall_s")},
            "ratio": mean["trl"]["cpu_s"] / mean["rlhfkit"]["cpu_s"], "rounds": rounds}


def ratio_text(per_side: dict) -> str:
    s = summary(per_side)
    if s is None:
        return "; ".join(f"{side}: {r}" for side in SIDES for r in per_side.get(side, []) if isinstance(r, str)) or "-"
    return (f"TRL {s['trl_cpu_s']:.2f} / rlhfkit {s['rlhfkit_cpu_s']:.2f} CPU s per step = {s['ratio']:.2f}x "
            f"(rounds: {', '.join(f'{x:.2f}' for x in s['rounds'])})")


def table(results: dict) -> str:
    lines = ["| case | rlhfkit CPU s/step | TRL CPU s/step | ratio TRL / rlhfkit (CPU) | each round | "
             "rlhfkit wall s/step | TRL wall s/step |", "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for case, per_side in results.items():
        s = summary(per_side)
        if s is None:
            lines.append(f"| {case} | {ratio_text(per_side)} | | | | | |")
            continue
        lines.append(f"| {case} | {s['rlhfkit_cpu_s']:.2f} | {s['trl_cpu_s']:.2f} | **{s['ratio']:.2f}x** | "
                     f"{', '.join(f'{x:.2f}' for x in s['rounds'])} | {s['rlhfkit_wall_s']:.2f} | {s['trl_wall_s']:.2f} |")
    return "\n".join(lines)


def doc_text(results: dict, rounds: int, steps: int, load: float, smoke: bool, layers: int | None = None) -> str:
    s = sizes(smoke)
    return "\n".join([
        f"1-min load average at the start {load:.1f} (the machine was shared: read the ratios, not the seconds). "
        f"{rounds} round{'s' * (rounds > 1)} (the last may be cut short: 'each round' lists the rounds run), "
        f"{steps} optimiser steps per side per round, the first of each run a warm-up left out; one "
        "torch thread.", "",
        table(results), "",
        f"The work, in TRL's names given to both: `per_device_train_batch_size={s['P']}`, "
        f"`gradient_accumulation_steps={s['A']}` ({s['P'] * s['A']} sequences, DPO pairs, per optimiser step), "
        f"`max_length={s['max_length']}`, `learning_rate` 1e-5 (full) / 1e-4 (LoRA), `lr_scheduler_type=linear`, "
        "`warmup_steps=0`, `max_grad_norm=1.0`, `optim=adamw_torch_fused` (TRL's default here), "
        "`gradient_checkpointing=False` (TRL's default is True: it recomputes each forward); LoRA = `peft_config=LoraConfig(r=16, lora_alpha=32, "
        "target_modules=[q,k,v,o,gate,up,down]_proj)`. GRPO: `num_generations=4`, `max_completion_length="
        f"{s['completion']}`, `num_iterations=1`, `beta=0.0`, `loss_type=dapo`, `scale_rewards=group`, "
        "temperature 1, a reward in Python (the share of 'e' in a completion); rlhfkit with "
        "`drop_zero_std_groups=false` (TRL has no such option). DPO: `loss_type=sigmoid`, `beta=0.1`, the reference "
        "log-probs on the fly on both sides (TRL's default; rlhfkit `precompute_ref_logps=false`). KTO: `beta=0.1`. "
        "Data: 32 conversational rows (GRPO prompts, DPO pairs, SFT conversations, KTO labelled completions), every "
        "prompt 8 words, SmolLM2's chat template on both sides. rlhfkit's held-out evaluation off "
        "(`num_eval_prompts=0`, `max_eval_examples=0`); TRL has none without `eval_dataset`.",
        f"Model: a randomly initialised model of SmolLM2-135M-Instruct's config ({layers or 30} layers, hidden 576, "
        "vocabulary 49152, tied embeddings) with its tokenizer, the same folder for both sides."
        + (f" {layers} layers instead of 30 to fit the run in the CPU time the shared machine had: the output layer "
           "(28M weights) weighs more in a step than in the 135M model." if layers else ""),
    ])


# ----------------------------------------------------------------------------- driver


def profile(case: str, side: str, model: Path, smoke: bool, steps: int, top: int, out: str | None = None) -> None:
    """cProfile of one side's run of `case` (after one run unprofiled, so imports are not in it): the functions with
    the most cumulative and own time."""
    run_side(side, case, model, smoke, steps)
    prof = cProfile.Profile()
    prof.enable()
    run_side(side, case, model, smoke, steps)
    prof.disable()
    if out:
        prof.dump_stats(out)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of: " + ",".join(CASES))
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every case on both sides (default 2)")
    ap.add_argument("--steps", type=int, default=3,
                    help="optimiser steps per side per round, the first a warm-up left out (default 3; at least 2)")
    ap.add_argument("--model", default=None,
                    help="a model folder to train as it is (default: a random model of the default model's config "
                    "with its tokenizer)")
    ap.add_argument("--layers", type=int, default=None,
                    help="transformer layers of the random model (default: the config's, 30 for SmolLM2-135M)")
    ap.add_argument("--first-round", type=int, default=1,
                    help="number of the first round (2: each case's sides in the other order than a first run's)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--smoke", action="store_true",
                    help="plumbing check: tiny shapes, 1 round, 2 steps; figures meaningless, implies --no-write")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--json", default=None, help="also write the per-round results to this JSON file (after every run)")
    ap.add_argument("--from-json", default=None, metavar="FILE[,FILE]",
                    help="render (and write, unless --no-write) the results --json files hold instead of running (several "
                    "files: runs of other cases, merged; the highest load and round count are shown)")
    ap.add_argument("--profile", default=None, metavar="CASE", help="cProfile one side's run of CASE and stop")
    ap.add_argument("--profile-out", default=None, metavar="FILE", help="--profile: also save the stats (pstats) here")
    ap.add_argument("--side", default="rlhfkit", choices=SIDES, help="the side --profile runs (default rlhfkit)")
    a = ap.parse_args(argv)
    cases = a.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown or (a.profile and a.profile not in CASES):
        ap.error(f"unknown case {(unknown or [a.profile])[0]!r}; choose from {','.join(CASES)}")
    rounds, steps = (1, 2) if a.smoke else (a.rounds, a.steps)
    if steps < 2 or rounds < 1:
        ap.error("--steps must be >= 2 (the first is a warm-up) and --rounds >= 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    load = os.getloadavg()[0]
    if a.from_json:
        saved = merged([json.loads(Path(f).read_text()) for f in a.from_json.split(",")])
        return report(saved["results"], saved["rounds"], saved["steps"], saved.get("load", load), False, a.no_write,
                      saved.get("layers"))
    benchdoc.set_threads(a.threads)
    scratch = Path(benchdoc.scratch_dir())
    if a.model:
        model = Path(a.model)
    else:
        from rlhfkit.models.loading import resolve_model_path
        from rlhfkit.trainers.grpo_config import GRPOConfig

        model = random_model(str(resolve_model_path(GRPOConfig().model)), scratch / "model", a.layers)
    if a.profile:
        profile(a.profile, a.side, model, a.smoke, steps, 40, a.profile_out)
        return {}
    results = run_rounds(cases, model, rounds, steps, a.smoke, Path(a.json) if a.json else None,
                         {"load": load, "layers": a.layers}, first_round=a.first_round)
    return report(results, rounds, steps, load, a.smoke, a.no_write, a.layers)


def merged(saved: list[dict]) -> dict:
    """Several --json files as one: each case's rounds that a file ran on both sides, in file order. The files must
    have the same steps and layers."""
    if len({(d["steps"], d.get("layers")) for d in saved}) > 1:
        raise SystemExit("--from-json: the files differ in --steps or --layers")
    results: dict = {}
    for d in saved:
        for case, per_side in d["results"].items():
            n = min(len(runs) for runs in per_side.values())  # the rounds this file ran on both sides
            if n:
                into = results.setdefault(case, {side: [] for side in per_side})
                for side, runs in per_side.items():
                    into[side] += runs[:n]
    return {"results": {c: results[c] for c in CASES if c in results}, "steps": saved[0]["steps"],
            "layers": saved[0].get("layers"), "rounds": max(d["rounds"] for d in saved),
            "load": max(d.get("load", 0.0) for d in saved)}


def report(results: dict, rounds: int, steps: int, load: float, smoke: bool, no_write: bool,
           layers: int | None = None) -> dict:
    """Print the block; write it into docs/benchmarks.md unless `smoke` or `no_write`."""
    text = doc_text(results, rounds, steps, load, smoke, layers)
    print(text)
    if smoke:
        print("--smoke: tiny shapes, figures meaningless; docs/benchmarks.md left alone")
    elif not no_write:
        benchdoc.write_block("bench_trl", "rlhfkit and TRL 1.16 on matched work (bench/bench_trl.py)", text)
    return results


if __name__ == "__main__":
    main()
