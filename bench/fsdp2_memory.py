"""Peak resident memory of each process of a 2-process FSDP2 run on the CPU, against
`rlhfkit estimate-memory ... sharding=fsdp2 num_devices=2` (and the same run unsharded against
sharding=none).

The run: `rlhfkit ppo` with full fine-tuning in fp32 (the frozen reference copy sharded too) on the
materialised SmolLM2-135M (or --model), one iteration of 4 rows, launched as docs/scale.md says
(ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2),
one torch thread per process. Each process reports its VmHWM (the kernel's peak resident set) after
the run; the estimate gets the run's own shapes (the widest chat-formatted prompt of the built-in
review prompts, 54 tokens, and the run's batch sizes). Memory figures do not depend on the machine's
load; the run takes about a minute on 2 free cores.

    python bench/fsdp2_memory.py [--model DIR] [--modes fsdp2,ddp] [--save-json runs/fsdp2_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GIB = 2**30
RUN = ["lora=false", "dtype=fp32", "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2",
       "prompts_per_generate=4", "max_new_tokens=16", "num_eval_prompts=0", "iterations=1", "reward=length:3",
       "save_every=0", "quiet=true", "tensorboard=false"]
# the same run for estimate-memory: 54 = the widest built-in review prompt after the chat template
ESTIMATE = ["method=ppo", "device=cpu", "lora=false", "dtype=fp32", "num_devices=2", "micro_batch_size=2",
            "prompts_per_generate=4", "rollout_batch_size=4", "mini_batch_size=4", "max_new_tokens=16",
            "prompt_length=54"]
SHARDING = {"fsdp2": "sharding=fsdp2", "ddp": "sharding=none"}


def vm_hwm() -> int:
    """This process's peak resident set in bytes (VmHWM, Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(model: str, out: Path) -> None:
    """One process of the launch: the run, then its peak into out/rank-R.json."""
    import torch

    from rlhfkit.cli import main

    code = main(["ppo", f"model={model}", f"output_dir={out}", "run_name=run", *RUN])
    rank = int(os.environ.get("RANK", "0"))
    (out / f"rank-{rank}.json").write_text(json.dumps({"code": code, "vm_hwm": vm_hwm()}))
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/scale/fsdp2_worker.py: no gloo teardown at exit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, model: str, out: Path) -> list[int]:
    """Peaks (bytes) of the 2 processes of one launch; `mode` fsdp2 (sharded) or ddp (the same preset
    with ACCELERATE_USE_FSDP=false: plain data parallelism)."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
    if mode == "ddp":
        env["ACCELERATE_USE_FSDP"] = "false"  # read after the launcher sets it: the process runs unsharded
    cmd = [accelerate, "launch", "--config_file", str(REPO / "configs/accelerate/fsdp2.yaml"), "--num_processes", "2",
           "--main_process_port", str(free_port()), str(Path(__file__).resolve()), "--worker", model, str(out)]
    if mode == "ddp":
        cmd = [*cmd[:2], *cmd[4:]]  # no config file: the launcher would set ACCELERATE_USE_FSDP=true again
        cmd[2:2] = ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: the launch failed:\n{proc.stderr[-3000:]}")
    return [json.loads((out / f"rank-{r}.json").read_text())["vm_hwm"] for r in range(2)]


def estimated(mode: str) -> dict[str, float]:
    sys.path.insert(0, str(REPO / "src"))
    from rlhfkit.commands.estimate_memory import PROG, for_method
    from rlhfkit.core.command_line import parse_values
    from rlhfkit.estimate.memory import MemoryArgs, estimate

    return estimate(for_method(parse_values(MemoryArgs, [*ESTIMATE, SHARDING[mode]], PROG)[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(Path.home() / ".cache/rlhfkit/models/smollm2-135m-instruct"),
                        help="the model folder (default: the materialised SmolLM2-135M-Instruct)")
    parser.add_argument("--modes", default="fsdp2,ddp", help="fsdp2 (sharded), ddp (unsharded), comma-separated")
    parser.add_argument("--save-json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]))
        return 0
    results = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"fsdp2-memory-{mode}-") as tmp:
            peaks = launch(mode, args.model, Path(tmp))
        est = estimated(mode)
        phases = {k: est[k] / GIB for k in ("loading phase", "generation phase", "training phase", "peak")}
        results[mode] = {"measured_gib": [p / GIB for p in peaks], "estimate_gib": phases}
        ratio = max(peaks) / est["peak"]
        print(f"{mode}: measured peak per process {', '.join(f'{p / GIB:.3f}' for p in peaks)} GiB; estimate "
              f"{est['peak'] / GIB:.3f} GiB (loading {phases['loading phase']:.3f}, generation "
              f"{phases['generation phase']:.3f}, training {phases['training phase']:.3f}); largest / estimate "
              f"{ratio:.2f} ({'within' if abs(ratio - 1) <= 0.2 else 'OUTSIDE'} 20%)")
    if args.save_json:
        args.save_json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
