"""Data parallelism on CPU: 2 processes (gloo, `accelerate launch`) against 1 process.

One `accelerate launch` of tests/scale/ddp_worker.py (about 40 s on 2 cores) runs, on each of 2
processes with B rows, one optimiser step of the policy update of PPO/GRPO (token-mean and
seq-mean), SFT, the reward model and DPO, then every trainer's CLI for one iteration. A plain
single process runs the same steps on all 2B rows. With global normalisers (tokens, sequences and
pairs summed over processes and micro-batches) the two must give the same update: SGD(lr=1)
makes the parameter change equal to minus the gradient, and the two processes' rows have very
different token counts, so any per-process normalisation would change it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

WORKER = Path(__file__).with_name("ddp_worker.py")
STEPS = ("policy-token-mean", "policy-seq-mean", "sft", "rm", "dpo")
TRAINERS = ("ppo", "grpo", "sft", "rm", "dpo", "dapo", "rloo", "kto", "online-dpo")
ITERATIONS = {"dapo": 2, "rloo": 2}
ONE_STEP = ("sft", "rm", "dpo", "kto")  # max_steps=1: one optimiser step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict[str, str]:
    """CPU processes over gloo on any machine: with a GPU visible, the processes' Accelerators and
    trainers would put both processes on the one cuda:0 (NCCL refuses two ranks on one device)."""
    return {**os.environ, "ACCELERATE_USE_CPU": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def launch_command(num_processes: int) -> list[str]:
    """The documented CPU launch (docs/scale.md): --multi_gpu with ACCELERATE_USE_CPU=1 really starts
    N gloo processes (--cpu --num_processes N would silently start one)."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    return [accelerate, "launch", "--multi_gpu", "--num_processes", str(num_processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]


def run(cmd: list[str], timeout: int = 300) -> None:
    proc = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def single_process_steps(model_dir: Path, out: Path) -> None:
    """The worker's steps in this process (one process: no launcher, saves a Python start-up)."""
    spec = importlib.util.spec_from_file_location("ddp_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    for agg in ("token-mean", "seq-mean"):
        worker.policy_step(str(model_dir), out, agg)
    for step in (worker.sft_step, worker.rm_step, worker.dpo_step):
        step(str(model_dir), out)


@pytest.fixture(scope="module")
def outputs(tiny_model_dir, tmp_path_factory):
    """(2-process folder, 1-process folder)."""
    two, one = tmp_path_factory.mktemp("ddp2"), tmp_path_factory.mktemp("ddp1")
    run([*launch_command(2), str(WORKER), "all", str(tiny_model_dir), str(two)])
    single_process_steps(tiny_model_dir, one)
    return two, one


def layer_scales(change: dict[str, torch.Tensor]) -> dict[str, float]:
    """The scale each tensor's error is measured against: the norm of its whole layer's change
    (weight and bias together), at least 1e-6 of the whole update's norm.

    Not the tensor's own norm: the Bradley-Terry loss has exactly zero gradient on the score head's
    bias (r_chosen - r_rejected cancels it), so that change is float32 rounding noise of the per-pair
    terms (7e-9, while the head's weight changes by 0.7) and an error relative to it is ~1 by chance.
    The noise is relative to the terms summed, which are the weight's too."""
    layer_sq: dict[str, float] = {}
    for key, c in change.items():
        layer = key.rsplit(".", 1)[0]
        layer_sq[layer] = layer_sq.get(layer, 0.0) + float(c.norm()) ** 2
    floor = 1e-6 * sum(layer_sq.values()) ** 0.5
    return {key: max(layer_sq[key.rsplit(".", 1)[0]] ** 0.5, floor) for key in change}


@pytest.mark.parametrize("name", STEPS)
def test_two_processes_give_the_update_of_one_process_with_twice_the_batch(outputs, name):
    two, one = outputs
    a, b = torch.load(two / f"{name}-2.pt"), torch.load(one / f"{name}-1.pt")
    assert a["change"].keys() == b["change"].keys() and len(a["change"]) > 0
    assert sum(float(c.abs().sum()) for c in b["change"].values()) > 1e-3  # a real update
    scales = layer_scales(b["change"])
    for key, change in b["change"].items():  # float32 sums in another order: <= 1.1e-6 of the scale measured
        error = float((a["change"][key] - change).norm())
        assert error <= 1e-5 * scales[key], f"{name}: {key}: error {error:.2g}, {error / scales[key]:.2g} of its scale"
    for key, value in b["stats"].items():  # logged losses and stats are global too
        if isinstance(value, float):
            assert a["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), f"{name}: {key}"


def test_each_process_samples_its_own_prompts_with_its_own_seed(outputs):
    from rlhfkit.data.stream import PromptStream

    two, _ = outputs
    ranks = json.loads((two / "shard.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1]
    single = PromptStream([{"prompt": f"p{i}"} for i in range(10)], seed=3)
    for it in range(3):
        mine = [r["prompts"][it] for r in ranks]
        assert mine[0] != mine[1]
        # together the processes draw what one process drawing twice as many would
        assert sorted(mine[0] + mine[1]) == sorted(r["prompt"] for r in single.next(6))
    assert set(ranks[0]["seeds"]).isdisjoint(ranks[1]["seeds"])


@pytest.mark.parametrize("command", TRAINERS)
def test_every_trainer_cli_runs_one_iteration_on_two_processes(outputs, command):
    run_dir = outputs[0] / "runs" / command
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS.get(command, 1)))  # once, by the main process
    assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
    # rm's final/ is the standard sequence-classification model; its adapter form is in final/rlhfkit_rm
    adapter = run_dir / "final" / ("rlhfkit_rm" if command == "rm" else "") / "adapter_config.json"
    assert adapter.is_file()
    if command in ONE_STEP:  # the warm-up counts optimiser steps, not processes: lr x min(1, 2 / warmup_steps) after one
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert cfg["warmup_steps"] > 2  # else the schedule is flat at step 1 and this checks nothing
        assert rows[0]["params/lr"] == pytest.approx(cfg["lr"] * 2 / cfg["warmup_steps"], rel=1e-9)


def test_dynamic_sampling_on_two_processes_counts_groups_over_both(outputs):
    """DAPO on 2 processes x 2 prompts: each iteration keeps at most the 4 groups asked for globally,
    draws at most max_sampling_rounds rounds, and logs the extra samples those rounds cost."""
    run_dir = outputs[0] / "runs" / "dapo"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        rounds, kept = r["rollout/sampling_rounds"], r["rollout/kept_groups"]
        assert 1 <= rounds <= 4 and rounds == int(rounds)
        assert 0 <= kept <= 2 and kept == int(kept)  # per process: 4 rows / group size 2
        assert r["rollout/extra_samples"] == (rounds - 1) * 4


def test_processes_share_one_run_folder_without_a_run_name(outputs):
    folders = list((outputs[0] / "unnamed").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("sft-") and "19990101" not in folders[0].name
    assert (folders[0] / "final" / "adapter_config.json").is_file()


def test_an_exactly_on_policy_update_skips_the_logprob_pass_on_both_processes(outputs):
    """rloo's defaults (one epoch, one optimiser step, no reference): every process skips the teacher-forced
    pass (a process that ran it alone would wait in its collectives); two iterations finish, pi_old is the
    update's own log-prob, so the first micro-batch's ratio is exactly 1, and grpo (beta=0.05) still runs it."""
    rows = [json.loads(line) for line in (outputs[0] / "runs" / "rloo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["timing/logprobs_s"] for r in rows] == [0.0, 0.0]
    assert [r["params/ratio_first_microbatch_maxdev"] for r in rows] == [0.0, 0.0]
    grpo = json.loads((outputs[0] / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()[0])
    assert grpo["timing/logprobs_s"] > 0
