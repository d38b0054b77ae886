"""Worker for tests/scale/test_fsdp2.py, run on 2 CPU processes by the documented launch

    ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 \\
        fsdp2_worker.py MODEL_DIR OUT_DIR

Each run below goes through the CLI twice on the same two processes: sharded, as the launch asks
(FSDP2, OUT_DIR/fsdp2/NAME), and unsharded (ACCELERATE_USE_FSDP=false for that run: plain data
parallelism, OUT_DIR/ddp/NAME), with the same seeds and the same prompts per process. Sampling, the
log-prob pass, the reference, the update and the final save then see the same weights either way.
PPO with full fine-tuning and dtype=bf16 runs on the fsdp2.yaml preset as it is (mixed_precision
'no'): rlhfkit gathers the layers in bf16 for a bf16 run; it runs sharded and unsharded. The LoRA bf16
run uses the fsdp2-lora preset's mixed precision and runs sharded only (its step-0 exactness checks
need no twin). PPO runs 2 iterations straight
and 1 + a checkpoint + a resume (ppo-2, ppo-resumed). GRPO with one_step_off_policy must stop with
exit code 2 (its sampler needs whole weights).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

RUNS = {  # name -> (command, arguments); full fine-tuning keeps a frozen reference copy, LoRA disables the adapter
    "ppo": ("ppo", ["lora=false", "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
                    "max_new_tokens=6", "num_eval_prompts=0", "iterations=1", "reward=length:3", "lr=1e-3"]),
    "grpo": ("grpo", ["rollout_batch_size=4", "group_size=2", "mini_batch_size=4", "micro_batch_size=2",
                      "max_new_tokens=6", "num_eval_prompts=2", "iterations=1", "update_epochs=1", "beta=0.05",
                      "reward=length:3", "lr=1e-3"]),
    "dpo": ("dpo", ["lora=false", "max_steps=1", "batch_size=4", "micro_batch_size=2", "num_eval_prompts=2",
                    "max_new_tokens=6", "max_response_length=16", "lr=1e-3"]),
    "sft": ("sft", ["lora=false", "max_steps=1", "batch_size=4", "micro_batch_size=2", "max_eval_examples=2",
                    "max_length=64", "rouge_max_new_tokens=6", "lr=1e-3"]),
}
# dtype=bf16 with the fsdp2.yaml preset (mixed_precision 'no'): rlhfkit gathers the layers in bf16
# (runtime/fsdp2.py for_compute_dtype); run sharded and unsharded
BF16_FULL = ("ppo", ["lora=false", "dtype=bf16", "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
                     "max_new_tokens=6", "num_eval_prompts=0", "iterations=1", "reward=length:3", "lr=1e-3"])
BF16_RUNS = {
    "ppo-bf16": ("ppo", ["dtype=bf16", "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
                         "max_new_tokens=6", "num_eval_prompts=0", "iterations=1", "reward=length:3"]),
}


def run(out: Path, name: str, command: str, args: list[str], model_dir: str, expect: int = 0) -> None:
    from rlhfkit.cli import main

    dtype = [] if any(a.startswith("dtype=") for a in args) else ["dtype=fp32"]
    common = [f"model={model_dir}", *dtype, f"output_dir={out}", f"run_name={name}", "quiet=true",
              "tensorboard=false", "save_every=0"]
    code = main([command, *common, *args])
    assert code == expect, f"rlhfkit {command} ({name}) exited with {code}, not {expect}"


def main(model_dir: str, out: Path) -> None:
    for name, (command, args) in RUNS.items():
        os.environ["ACCELERATE_USE_FSDP"] = "true"
        run(out / "fsdp2", name, command, args, model_dir)
        os.environ["ACCELERATE_USE_FSDP"] = "false"
        run(out / "ddp", name, command, args, model_dir)
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    command, args = RUNS["ppo"]  # checkpoints: 2 iterations straight, and 1 + a checkpoint + a resume for the 2nd
    two = [a for a in args if not a.startswith("iterations=")]
    run(out / "fsdp2", "ppo-2", command, [*two, "iterations=2"], model_dir)
    run(out / "fsdp2", "ppo-resumed", command, [*two, "iterations=1", "save_every=1"], model_dir)
    run(out / "fsdp2", "ppo-resumed", command, [*two, "iterations=2", "save_every=1",
                                                f"resume={out / 'fsdp2' / 'ppo-resumed'}"], model_dir)
    command, args = RUNS["grpo"]  # the off-policy sampler needs whole weights: refused with one line
    run(out / "fsdp2", "grpo-off-policy", command, [*args, "one_step_off_policy=true"], model_dir, expect=2)
    command, args = BF16_FULL
    run(out / "fsdp2", "ppo-bf16-full", command, args, model_dir)
    os.environ["ACCELERATE_USE_FSDP"] = "false"
    run(out / "ddp", "ppo-bf16-full", command, args, model_dir)
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16"  # read by rlhfkit's plan; accelerate keeps its own 'no'
    for name, (command, args) in BF16_RUNS.items():
        run(out / "fsdp2", name, command, args, model_dir)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    # Every run is done and written. Leave without the interpreter's finalisation (rlhfkit.cli.end_process):
    # now and then (2 of about 30 launches here) a gloo process aborted in it after complete FSDP2 runs
    # ("terminate called without an active exception"), which would fail the launch for nothing.
    import torch

    from rlhfkit.cli import end_process

    torch.distributed.barrier()
    end_process(0)
