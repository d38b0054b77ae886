"""Every training command on CUDA in bf16, with the step-0 exactness checks of the CPU tests.

Marked `gpu`: skipped without CUDA (tests/conftest.py). On a GPU machine:
    pytest -m gpu tests/test_gpu.py
Each case is one short run of tests/command_matrix.py on the tiny Llama. At step 0 the policy is the
reference and the first update micro-batch repeats the scoring pass, so on any device: the ratio's
largest deviation from 1 is exactly 0, the rollout KL exactly 0, DPO's first loss log 2 and KTO's 0.5
(sigmoid(0)) with a zero reward margin. The FSDP2 presets run through `accelerate launch` on one GPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhfkit.cli import main as cli_main

from command_matrix import COMMANDS, command_line

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
RATIO = {"params/ratio_first_microbatch_maxdev": 0.0}
STEP_ZERO = {  # case: metric -> exact value in the first logged row (bf16, CUDA)
    **{name: {**RATIO, "rollout/kl": 0.0} for name in ("ppo-lora-top-trunk", "ppo-full-reference",
                                                        "ppo-critic-model", "grpo", "reinforce_pp")},
    **{name: RATIO for name in ("rloo", "gspo", "dapo")},
    "grpo-one-step-off-policy": {**RATIO, "rollout/mismatch_kl": 0.0},
    "trpo": {"rollout/kl": 0.0},
    "dpo": {"loss/dpo": math.log(2), "rewards/margin": 0.0},
    "online-dpo": {"loss/dpo": math.log(2), "rewards/margin": 0.0},
    "kto": {"loss/kto": 0.5, "rewards/margin": 0.0, "params/kl_reference_point": 0.0},
}


def first_row(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


def check_step_zero(name: str, row: dict) -> None:
    for key, want in STEP_ZERO.get(name, {}).items():
        if key.startswith("loss/"):  # a float32 mean of per-pair losses: rounding of the mean only
            assert row[key] == pytest.approx(want, rel=1e-6, abs=0), key
        else:
            assert row[key] == want, key
    losses = [v for k, v in row.items() if k.startswith("loss/")]
    assert all(math.isfinite(v) for v in losses)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_one_iteration_on_cuda_in_bf16(tmp_path, tiny_model_dir, name):
    torch.cuda.reset_peak_memory_stats()
    assert cli_main(command_line(name, tmp_path, tiny_model_dir, dtype="bf16")) == 0
    assert torch.cuda.max_memory_allocated() > 0  # the run's tensors were on the GPU
    run_dir = tmp_path / "runs" / "t"
    check_step_zero(name, first_row(run_dir))
    assert (run_dir / "final").is_dir()


@pytest.mark.parametrize("preset", ["fsdp2", "fsdp2-lora"])
@pytest.mark.parametrize("name", ["ppo-full-reference", "grpo", "dpo", "sft"])
def test_fsdp2_preset_on_one_gpu(tmp_path, tiny_model_dir, preset, name):
    """`accelerate launch --config_file configs/accelerate/PRESET.yaml --num_processes 1 -m rlhfkit.cli ...`."""
    argv = command_line(name, tmp_path, tiny_model_dir, dtype="bf16")
    if preset == "fsdp2" and "lora=false" not in argv:
        argv.append("lora=false")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / f"{preset}.yaml"), "--num_processes", "1", "-m", "rlhfkit.cli", *argv]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=540,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert done.returncode == 0, done.stderr[-3000:]
    check_step_zero(name, first_row(tmp_path / "runs" / "t"))
    assert (tmp_path / "runs" / "t" / "final").is_dir()
