"""FSDP2 on CPU: 2 gloo processes, each trainer sharded (rlhfkit's own `fully_shard`) against the
same trainer unsharded on the same 2 processes.

One launch of tests/scale/fsdp2_worker.py with the documented command (configs/accelerate/fsdp2.yaml,
ACCELERATE_USE_CPU=1; about 40 s on 2 cores) runs one short step of PPO (full fine-tuning: a frozen
reference copy and a value head), GRPO (LoRA: the adapter-disabled reference), DPO (full, with the
reference computed next to each micro-batch and judged samples) and SFT (full, with greedy samples
for ROUGE), each sharded and unsharded. Sampling, the log-prob pass, the reference, the final save
and checkpoints all run on the sharded weights. fp32 throughout, so the two differ only by float
rounding: sums in another order (the gradient norm over shards, a reduce-scatter instead of an
all-reduce) and the plain forward where the unsharded run shares prompts (models/policy.py
`scoring_shares`). The same launch also resumes PPO from a sharded checkpoint, runs the fsdp2-lora
preset's bf16 mixed precision, and checks that GRPO with one_step_off_policy stops with exit code 2.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_ddp import free_port, layer_scales, worker_env

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fsdp2_worker.py")
NAMES = ("ppo", "grpo", "dpo", "sft")
# float32 sums in another order. Largest errors seen: 5.5e-6 of the scale (a metric), 1.7e-5 (a weight:
# AdamW's first steps move an element by lr g / (|g| + eps), so an element whose gradient is a
# near-cancelled sum of size ~eps moves by an amount its rounding sets). The bounds leave a margin
# of about 10; a wrong gradient (one process's half batch, an unreduced shard) is off by O(1).
METRIC_REL, WEIGHT_REL = 1e-4, 2e-4
# bf16 rounding (8 bits of mantissa) of weights, activations and the norms' weights: 2^-8 ~ 4e-3 per value.
BF16_REL = 3e-2
pytestmark = pytest.mark.slow  # every trainer launched on 2 processes, sharded and not


@pytest.fixture(scope="module")
def out(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp2")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(REPO / "configs/accelerate/fsdp2.yaml"), "--num_processes", "2",
           "--main_process_port", str(free_port()), str(WORKER), str(tiny_model_dir), str(folder)]
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "error:" in line or "terminate" in line]
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n" + "\n".join(errors[-20:]) + f"\n{proc.stderr[-3000:]}"
    return folder


def first_row(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize("name", NAMES)
def test_the_sharded_run_was_sharded_and_the_other_not(out, name):
    sharded = json.loads((out / "fsdp2" / name / "summary.json").read_text())
    frozen_reference = {"reference": "sharded"} if name in ("ppo", "dpo") else {}  # full fine-tuning's copy
    assert sharded["fsdp2"] == {"processes": 2, "reshard_after_forward": True, "layer_classes": ["LlamaDecoderLayer"],
                                "mixed_precision": "no", **frozen_reference}
    assert "fsdp2" not in json.loads((out / "ddp" / name / "summary.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_sharded_step_logs_what_the_unsharded_one_logs(out, name):
    """Sampling (the same completions), the log-prob pass and the reference (rollout/kl, entropy),
    the loss and the update's statistics. Scale: the value itself, at least 1e-3 (a loss or a
    statistic near 0 is compared against that: its rounding is relative to terms of that size)."""
    a, b = first_row(out / "fsdp2" / name), first_row(out / "ddp" / name)
    numbers = {k: v for k, v in b.items() if isinstance(v, float) and not k.startswith(("timing/", "throughput/"))}
    assert len(numbers) >= 4
    for key, value in numbers.items():
        scale = max(abs(value), 1e-3)
        assert abs(a[key] - value) <= METRIC_REL * scale, f"{name}: {key}: {a[key]} against {value}"
    samples = [(out / d / name / "samples.jsonl") for d in ("fsdp2", "ddp")]
    if samples[1].is_file():
        assert samples[0].read_text() == samples[1].read_text()


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_step_zero_is_exact_on_sharded_weights(out, name):
    """The first update micro-batch repeats the log-prob pass bit for bit (ratio exactly 1); PPO's
    policy equals its frozen reference copy at step 0 (KL exactly 0)."""
    row = first_row(out / "fsdp2" / name)
    assert row["params/ratio_first_microbatch_maxdev"] == 0.0
    if name == "ppo":
        assert row["rollout/kl"] == 0.0


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no weights in {folder}"
    return {k: v for f in files if f.name != "value_head.safetensors" for k, v in load_file(f).items()}


@pytest.mark.parametrize("name", NAMES)
def test_final_weights_saved_from_shards_equal_the_unsharded_ones(out, name, tiny_model_dir):
    """final/ gathered from the shards: the whole model (full fine-tuning, loadable by plain
    transformers) or the adapter (GRPO), equal to the unsharded run's up to rounding. Scale: the
    norm of the layer's change in the step (LoRA's A does not move in a first step: its gradient is
    B^T(...) with B = 0, so the B change sets the scale)."""
    a, b = read_weights(out / "fsdp2" / name / "final"), read_weights(out / "ddp" / name / "final")
    assert a.keys() == b.keys()
    if name == "grpo":
        start = {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in b.items()}
    else:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(out / "fsdp2" / name / "final")  # plain transformers
        start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
        for key, value in loaded.state_dict().items():
            assert torch.equal(value, a.get(key, value)), key
    change = {k: b[k].float() - start[k].float() for k in b}
    assert sum(float(c.norm()) for c in change.values()) > 1e-4  # a real update
    scales = layer_scales(change)
    for key in b:
        error = float((a[key].float() - b[key].float()).norm())
        assert error <= WEIGHT_REL * scales[key], f"{name}: {key}: error {error:.2g}, {error / scales[key]:.2g} of scale"
    value_heads = [out / d / name / "final" / "value_head.safetensors" for d in ("fsdp2", "ddp")]
    if value_heads[1].is_file():
        from safetensors.torch import load_file

        va, vb = load_file(value_heads[0]), load_file(value_heads[1])
        for key in vb:
            assert float((va[key] - vb[key]).norm()) <= WEIGHT_REL * max(float(vb[key].norm()), 1e-6), key


def test_lora_preset_mixed_precision_keeps_step_zero_exact(out):
    """The fsdp2-lora preset's mixed_precision bf16 (layers gathered and run in bf16, gradients reduced
    in fp32, the value head in fp32) with dtype=bf16: the KL to the adapter-disabled reference is
    exactly 0 and the first update micro-batch repeats the log-prob pass."""
    run_dir = out / "fsdp2" / "ppo-bf16"
    assert json.loads((run_dir / "summary.json").read_text())["fsdp2"]["mixed_precision"] == "bf16"
    row = first_row(run_dir)
    assert row["rollout/kl"] == 0.0 and row["params/ratio_first_microbatch_maxdev"] == 0.0
    assert math.isfinite(row["loss/total"]) and row["params/grad_norm"] > 0
    assert (run_dir / "final" / "adapter_model.safetensors").is_file()


def test_a_run_resumed_from_a_sharded_checkpoint_continues_as_if_never_stopped(out):
    """PPO stopped after iteration 1 with a checkpoint (whole trainable weights and the optimiser's
    whole state, gathered from the shards) and resumed for iteration 2 (each process takes its
    shard back) ends with the weights of the run that did both iterations in one go, and logs the
    same second iteration. The same processes, seeds and order of operations: equal bit for bit."""
    straight, resumed = out / "fsdp2" / "ppo-2", out / "fsdp2" / "ppo-resumed"
    meta = json.loads((resumed / "checkpoints" / "step-1" / "meta.json").read_text())
    assert meta["world_size"] == 2
    a, b = read_weights(straight / "final"), read_weights(resumed / "final")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    second = json.loads((straight / "metrics.jsonl").read_text().splitlines()[1])
    for key, value in second.items():
        if isinstance(value, float) and not key.startswith(("timing/", "throughput/")):
            assert rows[1][key] == value, key


def test_a_bf16_run_gathers_its_layers_in_bf16_on_the_fp32_preset_and_stays_exact_at_step_zero(out):
    """fsdp2.yaml (mixed_precision 'no') with dtype=bf16 and full fine-tuning: the plan says bf16 (layers
    gathered and run in bf16, gradients reduced in fp32), the frozen reference copy is sharded with the
    same policy, so the KL is exactly 0 and the first update micro-batch repeats the log-prob pass.
    Against the same run unsharded (fp32 weights under bf16 autocast; the norms' weights there stay
    fp32): the same sampled completions and metrics within bf16 rounding."""
    run_dir = out / "fsdp2" / "ppo-bf16-full"
    plan = json.loads((run_dir / "summary.json").read_text())["fsdp2"]
    assert plan["mixed_precision"] == "bf16" and plan["reference"] == "sharded"
    row, twin = first_row(run_dir), first_row(out / "ddp" / "ppo-bf16-full")
    assert row["rollout/kl"] == 0.0 and row["params/ratio_first_microbatch_maxdev"] == 0.0
    for key, value in twin.items():
        if isinstance(value, float) and not key.startswith(("timing/", "throughput/")):
            assert abs(row[key] - value) <= BF16_REL * max(abs(value), 1e-2), f"{key}: {row[key]} against {value}"
