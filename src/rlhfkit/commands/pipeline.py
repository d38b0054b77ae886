"""`rlhfkit pipeline [CONFIG.yaml] [key=value | stage.key=value ...]`: the whole RLHF chain.

  1. sft    supervised fine-tuning of `model`                    -> OUT/sft/final(/merged)
  2. prefs  sample k completions per prompt from the SFT model,
            rank them with the ground-truth scorer               -> OUT/prefs/prefs.jsonl
  3. rm     reward model on those pairs (backbone: the SFT model) -> OUT/rm/final
  4. ppo    PPO from the SFT model with reward=model:OUT/rm/final -> OUT/ppo/final
  5. eval   PPO model vs SFT model on held-out prompts, judged by the learned reward model
            and by the ground truth                               -> OUT/eval/report.json
  then a before/after table (OUT/summary.md, OUT/summary.json).

Configuration: the packaged default (rlhfkit/configs/pipeline.yaml), then CONFIG.yaml on top
(section by section), then key=value / stage.key=value overrides. Each stage section holds keys
of that command's config (`rlhfkit sft --help`, ...); the pipeline fills in the links between
stages (model paths, data files, the reward) unless a section sets them itself.

A stage is skipped when its folder is complete: it holds `rlhfkit_stage.json` with the same
fingerprint (a hash of the stage's resolved config and of its upstream stages' fingerprints).
A changed config, or a changed upstream stage, reruns the stage (its folder is cleared first);
an interrupted stage reruns because it never wrote its marker.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import shutil
import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rlhfkit.commands import COMMANDS, load
from rlhfkit.core.allocator import trim_heap
from rlhfkit.core.argv import pair_argv
from rlhfkit.core.config import build_config, coerce, read_yaml, to_dict
from rlhfkit.errors import ConfigError, UserError

STAGES = ("sft", "prefs", "rm", "ppo", "eval")
MARKER = "rlhfkit_stage.json"
TOP_KEYS = {"output_dir": "runs/pipeline", "model": "smollm2-135m-instruct", "dtype": "auto", "seed": 0,
            "quiet": False, "stages": list(STAGES), "prompts": "builtin:reviews", "ground_truth": "sentiment"}
# Keys that change how a stage reports (or saves, resumes, handles faults), not what it produces.
NOT_FINGERPRINTED = {"quiet", "tensorboard", "wandb", "overwrite", "save_every", "keep_checkpoints", "resume",
                     "max_nonfinite_steps"}


# ----------------------------------------------------------------------------- config


def default_config_path() -> Path:
    return Path(str(resources.files("rlhfkit") / "configs" / "pipeline.yaml"))


def load_pipeline_config(argv: list[str]) -> dict:
    """Default YAML <- user YAML (per section) <- key=value overrides; checked against every stage."""
    cfg = _normalise(read_yaml(default_config_path()), str(default_config_path()))
    for arg in argv:
        if arg.endswith((".yaml", ".yml")) and "=" not in arg:
            cfg = merge(cfg, _normalise(read_yaml(arg), arg))
        elif "=" in arg:
            key, _, raw = arg.partition("=")
            key = key.lstrip("-").replace("-", "_")
            try:
                val = yaml.safe_load(raw) if raw.strip() else ""
            except yaml.YAMLError:
                val = raw
            section, dot, sub = key.partition(".")
            cfg = merge(cfg, _normalise({section: {sub: val}} if dot else {key: val}, "command line"))
        else:
            raise ConfigError(f"unexpected argument '{arg}': expected CONFIG.yaml, key=value or stage.key=value")
    for key, default in TOP_KEYS.items():  # the types of the defaults
        value = cfg.get(key, copy.deepcopy(default))
        cfg[key] = coerce(key, value, list[str] if isinstance(default, list) else type(default))
    for s in cfg["stages"]:
        if s not in STAGES:
            raise ConfigError(f"stages: unknown stage {s!r} (expected some of {', '.join(STAGES)})")
    return cfg


def _normalise(data: dict, source: str) -> dict:
    out: dict = {}
    for k, v in data.items():
        if k in STAGES:
            if v is None:
                v = {}
            if not isinstance(v, dict):
                raise ConfigError(f"{source}: section '{k}' must be a mapping of key: value")
            out[k] = dict(v)
        elif k in TOP_KEYS:
            out[k] = v
        else:
            import difflib

            close = difflib.get_close_matches(str(k), [*TOP_KEYS, *STAGES], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{source}: unknown pipeline key {str(k)!r}{hint}")
    return out


def merge(base: dict, over: dict) -> dict:
    """Top-level keys replace; stage sections merge key by key."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = {**out.get(k, {}), **v} if k in STAGES else v
    for k, v in TOP_KEYS.items():
        out.setdefault(k, copy.deepcopy(v))
    for s in STAGES:
        out.setdefault(s, {})
    return out


# ----------------------------------------------------------------------------- stage configs


def resolve_dtype(dtype: str) -> str:
    """'auto' -> bf16 on GPUs and CPUs with AVX-512 BF16/AMX, else fp32 (on an AVX2-only CPU bf16
    matmuls are emulated and a SmolLM2 training step measured 10-15x slower than fp32)."""
    from rlhfkit.models.loading import resolve_dtype as resolve

    if dtype not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"dtype={dtype!r}: expected one of auto, fp32, bf16")
    return resolve(dtype)


def output_folder(value: Any) -> Path:
    """`output_dir` as an absolute path; anything that cannot name a folder is a ConfigError."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"output_dir={value!r}: expected a folder path")
    return Path(value).expanduser().resolve()


def stage_configs(cfg: dict) -> dict[str, Any]:
    """The typed config of every enabled stage, with the links between stages filled in."""
    out_dir = output_folder(cfg["output_dir"])
    dtype = resolve_dtype(cfg["dtype"])
    common = {"dtype": dtype, "seed": cfg["seed"]}
    run = {**common, "output_dir": str(out_dir), "quiet": cfg["quiet"]}
    enabled = set(cfg["stages"])
    policy = cfg["model"]
    built: dict[str, Any] = {}

    def make(stage: str, defaults: dict):  # the section's own keys win over the links
        cls = load(COMMANDS[stage].config)
        return build_config(cls, {**defaults, **cfg[stage]}, source=f"pipeline section '{stage}'")

    sft = make("sft", {**run, "model": policy, "run_name": "sft", "save_merged": True})
    if "sft" in enabled:
        built["sft"] = sft
        final = Path(sft.output_dir).resolve() / sft.run_name / "final"
        policy = str(final / "merged" if sft.lora and sft.save_merged else final)
    prefs_file = str(out_dir / "prefs" / "prefs.jsonl")
    built["prefs"] = make("prefs", {**common, "model": policy, "prompts": cfg["prompts"],
                                                 "scorer": cfg["ground_truth"], "out": prefs_file, "overwrite": True})
    built["rm"] = make("rm", {**run, "model": policy, "data": built["prefs"].out, "run_name": "rm"})
    rm_path = str(Path(built["rm"].output_dir).resolve() / built["rm"].run_name / "final")
    built["ppo"] = make("ppo", {**run, "model": policy, "prompts": cfg["prompts"],
                                           "reward": f"model:{rm_path}", "run_name": "ppo", "num_eval_prompts": 0})
    ppo_final = str(Path(built["ppo"].output_dir).resolve() / built["ppo"].run_name / "final")
    rewards = [f"learned_rm={built['ppo'].reward}", f"ground_truth={cfg['ground_truth']}"]
    built["eval"] = make("eval", {**common, "model": ppo_final,
                                              "ref_model": policy, "prompts": cfg["prompts"], "rewards": rewards,
                                              "out_dir": str(out_dir / "eval")})
    return {s: c for s, c in built.items() if s in enabled}


def stage_folder(stage: str, c: Any) -> Path:
    if stage == "prefs":
        return Path(c.out).parent
    if stage == "eval":
        return Path(c.out_dir)
    return Path(c.output_dir) / c.run_name


def stage_outputs_present(stage: str, c: Any) -> bool:
    folder = stage_folder(stage, c)
    if stage == "prefs":
        return Path(c.out).is_file()
    if stage == "eval":
        return (folder / "report.json").is_file()
    if stage == "sft" and c.lora and c.save_merged:
        return (folder / "final" / "merged" / "config.json").is_file()
    return (folder / "final").is_dir()


def fingerprint(stage: str, c: Any, upstream: list[str]) -> str:
    d = {k: v for k, v in to_dict(c).items() if k not in NOT_FINGERPRINTED}
    blob = json.dumps({"stage": stage, "config": d, "upstream": upstream}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_complete(stage: str, c: Any, fp: str) -> bool:
    marker = stage_folder(stage, c) / MARKER
    if not marker.is_file() or not stage_outputs_present(stage, c):
        return False
    try:
        return json.loads(marker.read_text()).get("fingerprint") == fp
    except ValueError:
        return False


def run_stage(stage: str, c: Any) -> dict:
    """Run one stage's command in-process (its `run` in rlhfkit.commands.COMMANDS); returns its summary."""
    from rlhfkit.trainers.ppo import RatioCheckError

    try:
        return load(COMMANDS[stage].run)(c)
    except RatioCheckError as e:
        raise UserError(str(e)) from None


# ----------------------------------------------------------------------------- run


def run_pipeline(cfg: dict) -> dict:
    """Run (or skip) every enabled stage in order, then write and print the before/after table."""
    configs = stage_configs(cfg)  # every section is validated before anything runs
    out_dir = Path(cfg["output_dir"]).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "pipeline.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    fps: list[str] = []
    timings: dict[str, dict] = {}
    for stage in STAGES:
        if stage not in configs:
            continue
        c = configs[stage]
        fp = fingerprint(stage, c, fps)
        fps.append(fp)
        folder = stage_folder(stage, c)
        if is_complete(stage, c, fp):
            info = json.loads((folder / MARKER).read_text())
            timings[stage] = {"seconds": info.get("seconds"), "skipped": True}
            print(f"[pipeline] {stage}: complete in {folder}, skipped", flush=True)
            continue
        if folder.exists() and out_dir in folder.parents:  # never clear a folder outside output_dir
            print(f"[pipeline] {stage}: {folder} is incomplete or stale, clearing it", flush=True)
            shutil.rmtree(folder)
        print(f"[pipeline] {stage}: running -> {folder}", flush=True)
        t0 = time.time()
        summary = run_stage(stage, c)
        gc.collect()  # the stage's model, optimiser and data are garbage now:
        trim_heap()  # hand their freed heap back, so the next stage starts low (core/allocator.py)
        secs = time.time() - t0
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARKER).write_text(json.dumps({"stage": stage, "fingerprint": fp, "seconds": secs,
                                                 "summary": summary}, indent=2, default=str))
        timings[stage] = {"seconds": secs, "skipped": False}
        print(f"[pipeline] {stage}: done in {secs:.0f} s", flush=True)
    result: dict = {"output_dir": str(out_dir), "stages": timings}
    if "eval" in configs:
        report = json.loads((Path(configs["eval"].out_dir) / "report.json").read_text())
        result["report"] = report
        table = before_after_table(report, timings)
        (out_dir / "summary.md").write_text(table + "\n")
        print(table, flush=True)
    (out_dir / "summary.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def before_after_table(report: dict, timings: dict | None = None) -> str:
    """Markdown table: starting model (before PPO) vs PPO model (after), with win rates."""
    before, after = report.get("reference") or {}, report["model"]
    rows = ["| metric | before (PPO start) | after (PPO) | change |", "| --- | ---: | ---: | ---: |"]
    for key, a in after.items():
        if key == "accuracy_n":
            continue
        b = before.get(key)
        av = a["mean"] if isinstance(a, dict) else a
        bv = b["mean"] if isinstance(b, dict) else b
        if not isinstance(av, (int, float)):
            continue
        label = f"{key} (mean)" if isinstance(a, dict) else key
        change = f"{av - bv:+.3f}" if isinstance(bv, (int, float)) else ""
        rows.append(f"| {label} | {bv:.3f} | {av:.3f} | {change} |" if isinstance(bv, (int, float))
                    else f"| {label} | | {av:.3f} | |")
    for name, w in (report.get("win_rate") or {}).items():
        rows.append(f"| win rate vs start, judged by {name} | | {w['win_rate']:.3f} | "
                    f"{w['wins']} wins, {w['ties']} ties, {w['losses']} losses |")
    text = "\n".join(rows)
    if timings:
        t = ", ".join(f"{s} {v['seconds']:.0f} s" + (" (skipped)" if v.get("skipped") else "")
                      for s, v in timings.items() if v.get("seconds") is not None)
        text += f"\n\nStage times: {t}. Prompts: {report['config']['prompts']} ({report['config']['split']}, n={report['n']})."
    return text


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print("usage: rlhfkit pipeline [CONFIG.yaml] [key=value | --key value | stage.key=value ...]\n")
        print(__doc__.strip())
        print(f"\nDefault config: {default_config_path()}")
        return 0
    run_pipeline(load_pipeline_config(pair_argv(argv)))
    return 0
