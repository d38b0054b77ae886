"""Several machines, simulated: two "machines" on loopback, each one torchrun with one CPU process
(gloo), started by the Slurm script of docs/scale.md exactly as written (the `SLURM_*` variables
set by hand, `scontrol` answering 127.0.0.1, `srun` running its command once).

Three launches of PPO on the tiny model (about 30 s on 2 cores):
- shared storage: both machines in one folder, 2 iterations straight;
- node-local disks: machine 0 in folder A, machine 1 in folder B (`output_dir=runs` is then
  another folder on each), 1 iteration with a checkpoint, then `--resume runs/x` for the second.
The run on separate disks must finish with a loadable final/ on machine 0, leave machine 1 only
the configuration, and continue bit for bit as the straight run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_ddp import free_port, worker_env

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # per launch; three launches (162 s in all alone on 2 busy cores, over 600 s beside other tests)
pytestmark = [pytest.mark.timeout(6 * TIMEOUT_S + 120),  # three launches, twice at worst
              pytest.mark.slow]  # three 2-process launches
PPO = ["rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=6", "num_eval_prompts=0",
       "reward=length:3", "dtype=fp32", "quiet=true", "tensorboard=false", "output_dir=runs", "save_every=1"]


def slurm_script() -> str:
    """The sbatch script between the slurm-script markers of docs/scale.md."""
    doc = (REPO / "docs/scale.md").read_text()
    block = re.search(r"<!-- slurm-script:start -->\n```bash\n(.*?)```\n<!-- slurm-script:end -->", doc, re.S)
    assert block, "docs/scale.md lost its Slurm script"
    return block.group(1)


def fake_slurm_tools(folder: Path) -> Path:
    """`scontrol show hostnames` -> 127.0.0.1 (every machine here); `srun [options] CMD...` -> CMD."""
    folder.mkdir()
    (folder / "scontrol").write_text('#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1\n')
    (folder / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    for tool in ("scontrol", "srun"):
        (folder / tool).chmod(0o755)
    return folder


def launch(script: Path, tools: Path, folders: tuple[Path, Path], args: list[str]) -> list[str]:
    """The script started on both "machines" at once, machine i in folders[i]; their outputs."""
    port = str(free_port())
    procs = []
    for node, folder in enumerate(folders):
        folder.mkdir(exist_ok=True)
        env = {**worker_env(), "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NNODES": "2", "SLURM_NODEID": str(node),
               "SLURM_GPUS_ON_NODE": "1", "MASTER_PORT": port, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30",
               "PATH": f"{tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen(["bash", str(script), *args], cwd=folder, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        # whether the other machine had ended, how, and what both printed: a launcher left waiting in
        # torchrun's exit barrier means the other machine's agent never reached it
        ended = [proc.poll() for proc in procs]
        for proc in procs:
            proc.kill()
        tails = [f"machine {node} ({'still running' if code is None else f'exited {code}'}):\n{printed(proc)[-3000:]}"
                 for node, (proc, code) in enumerate(zip(procs, ended))]
        raise AssertionError(f"a launch did not end within {TIMEOUT_S} s\n" + "\n".join(tails)) from None
    finally:
        for proc in procs:
            proc.kill()
    for node, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"machine {node} exited with {proc.returncode}:\n{out[-4000:]}"
    return outputs


def printed(proc: subprocess.Popen) -> str:
    """What a killed launch printed, read for 10 s at most (its workers may still hold the pipe)."""
    try:
        return proc.communicate(timeout=10)[0] or ""
    except subprocess.TimeoutExpired as e:
        return e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output or ""


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """{"shared": folder of the straight run, "a": machine 0's folder, "b": machine 1's}; printed outputs.
    The three launches run again in fresh folders once if one of them does not end cleanly (a second
    failure fails the test). Until 2026-12-07 one launch in a few had machine 1's process abort at
    interpreter exit after the run finished (SIGABRT, "terminate called without an active
    exception": a gloo thread freeing a finished all-reduce's tensors asked for the GIL while the
    interpreter finalised; a core dump showed it), and machine 0's launcher then waited 300 s at
    torchrun's exit barrier; a launched process now ends without finalisation
    (rlhfkit.cli.end_process, tests/scale/test_process_exit.py)."""
    try:
        return scenario(tiny_model_dir, tmp_path_factory.mktemp("multinode"))
    except AssertionError as first:  # an exit status other than 0, or a launch past TIMEOUT_S (`launch`)  # a bug of the run fails the second time too
        print(f"[multinode] a launch did not end cleanly; again in fresh folders:\n{first}")
        return scenario(tiny_model_dir, tmp_path_factory.mktemp("multinode-again"))


def scenario(tiny_model_dir, root: Path):
    """The three launches in `root`: runs()'s value."""
    script = root / "rlhfkit.sbatch"
    script.write_text(slurm_script())
    tools = fake_slurm_tools(root / "bin")
    args = ["ppo", f"model={tiny_model_dir}", *PPO]
    shared, a, b = root / "shared", root / "a", root / "b"
    printed = launch(script, tools, (shared, shared), [*args, "run_name=x", "iterations=2"])
    launch(script, tools, (a, b), [*args, "run_name=x", "iterations=1"])
    printed += launch(script, tools, (a, b), [*args, "--resume", "runs/x", "iterations=2"])
    return {"shared": shared / "runs/x", "a": a / "runs/x", "b": b / "runs/x"}, printed


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/", "time"))} for r in rows]


def test_separate_disks_resume_bit_for_bit_as_the_straight_run(runs):
    folders, _ = runs
    straight, resumed = metrics(folders["shared"]), metrics(folders["a"])
    assert [r["iteration"] for r in straight] == [0, 1] and len(straight[0]) > 10
    assert resumed == straight  # exact: the same weights, optimiser state and every process's RNG state


def test_separate_disks_final_model_loads_and_equals_the_straight_run(runs, tiny_model_dir):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folders, _ = runs
    final = folders["a"] / "final"
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), final)
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0
    for name in ("adapter_model.safetensors", "value_head.safetensors"):
        mine, straight = load_file(final / name), load_file(folders["shared"] / "final" / name)
        assert mine.keys() == straight.keys()
        assert all(torch.equal(mine[k], straight[k]) for k in mine), name


def test_machine_0_holds_the_run_and_machine_1_only_its_configuration(runs):
    folders, _ = runs
    step = folders["a"] / "checkpoints" / "step-2"
    assert sorted(p.name for p in step.iterdir()) == ["config.yaml", "meta.json", "rng-rank0.pt", "rng-rank1.pt",
                                                      "state.pt", "trainable.safetensors"]
    assert sorted(p.name for p in folders["b"].iterdir()) == ["config.yaml"]
    assert (folders["a"] / "config.yaml").read_text() == (folders["b"] / "config.yaml").read_text()


def test_summary_and_console_name_the_processes_and_sharding(runs):
    folders, printed = runs
    for run in ("shared", "a"):
        summary = json.loads((folders[run] / "summary.json").read_text())
        assert summary["processes"] == 2 and summary["sharding"] == "ddp"
    starts = [line for out in printed for line in out.splitlines() if line.startswith("[processes]")]
    assert starts == ["[processes] 2 (2 machines), sharding: ddp"] * 2  # once per launch, by the main process
