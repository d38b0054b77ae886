"""The run harness (runtime/run.py): one set-up, checkpoint and final-save sequence for every trainer."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlhfkit.core.config import build_config, option
from rlhfkit.core.run_files import checkpoints
from rlhfkit.runtime.optim import make_optimizer
from rlhfkit.runtime.run import Run
from rlhfkit.trainers.options import OptimizerArgs, RunArgs

TRAINERS = Path(__file__).resolve().parents[2] / "src" / "rlhfkit" / "trainers"


@dataclass
class ToyConfig(OptimizerArgs, RunArgs):
    """A config with only the harness's own groups."""

    dtype: str = option("fp32", "compute dtype")
    model: str | None = option(None, "the model a resumed run must keep (runtime/run_folder.FolderOptions)")
    steps: int = option(5, "steps")


def toy_run(tmp_path, resume=None, **over) -> tuple[Run, torch.nn.Module, dict]:
    cfg = build_config(ToyConfig, dict(output_dir=str(tmp_path / "runs"), run_name="toy", quiet=True,
                                       tensorboard=False, save_every=2, keep_checkpoints=10, resume=resume, **over))
    run = Run(cfg, "toy")
    run.open(total=cfg.steps, unit="step", note="kept")
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.0)).eval()
    opt, sched = make_optimizer(model.parameters(), cfg.lr, cfg.warmup_steps)
    counter: dict = {}  # a dict gets back the keys it lacks (runtime/checkpoint.py set_state)
    prepared = run.prepare(model, opt, sched, micro_batch_size=1, counter=counter)
    run.resume()
    return run, prepared, counter


def _train(run: Run, model, calls: list) -> None:
    for step in run.steps():
        loss = model(torch.ones(1, 3)).pow(2).sum()
        loss.backward()
        run.optimizer.step()
        run.optimizer.zero_grad()
        run.log(step, {"loss": loss.item()})
        calls.append(step)


def test_steps_checkpoint_when_due_and_at_the_end_and_finish_writes_the_summary(tmp_path):
    run, model, _ = toy_run(tmp_path)
    assert model.training  # prepare puts the trained model in train mode, explicitly
    evaluated = []
    before = run.once("eval_before", lambda: evaluated.append(1) or {"mean": 0.5})
    assert run.once("eval_before", lambda: evaluated.append(2) or {"mean": -1}) == before == {"mean": 0.5}
    assert evaluated == [1]  # computed once
    calls: list = []
    _train(run, model, calls)
    assert calls == [0, 1, 2, 3, 4]
    # every save_every=2 steps, and the final one at 5
    assert [p.name for p in checkpoints(run.run_dir)] == ["step-2", "step-4", "step-5"]
    saved = []
    summary = run.finish(lambda folder, state: saved.append((folder, state)) or {"final": str(folder)})
    assert saved == [(run.run_dir / "final", None)]  # one process: the live model is saved, no gathered state
    on_disk = json.loads((run.run_dir / "summary.json").read_text())
    assert on_disk == summary
    assert on_disk["note"] == "kept" and on_disk["eval_before"] == {"mean": 0.5}
    assert on_disk["final"] == str(run.run_dir / "final") and on_disk["run_dir"] == str(run.run_dir)
    assert len((run.run_dir / "metrics.jsonl").read_text().splitlines()) == 5


def test_a_resumed_run_starts_after_the_checkpoint_and_keeps_the_before_evaluation(tmp_path):
    run, model, counter = toy_run(tmp_path, steps=4)
    run.once("eval_before", lambda: {"mean": 0.25})
    counter["n"] = 7  # a checkpointed object's state
    _train(run, model, [])
    weights = [p.detach().clone() for p in model.parameters()]
    run.finish(lambda folder, state: None)

    again, model2, counter2 = toy_run(tmp_path, resume=str(tmp_path / "runs" / "toy"), steps=6)
    assert again.start == 4 and counter2["n"] == 7
    assert all(torch.equal(a, b) for a, b in zip(weights, model2.parameters()))
    assert again.once("eval_before", lambda: pytest.fail("the before-evaluation must not run again")) == {"mean": 0.25}
    calls: list = []
    _train(again, model2, calls)
    assert calls == [4, 5]
    again.close()  # the lock and the signal handlers go back


def _calls(tree: ast.AST) -> set[str]:
    """Names of called functions; a method call also as OWNER.method (`accelerator.prepare`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                names.add(f.attr)
                owner = f.value.attr if isinstance(f.value, ast.Attribute) else getattr(f.value, "id", "")
                names.add(f"{owner}.{f.attr}")
            else:
                names.add(getattr(f, "id", ""))
    return names


@pytest.mark.parametrize("path", sorted(TRAINERS.glob("*.py")), ids=lambda p: p.name)
def test_no_trainer_has_a_setup_checkpoint_or_save_sequence_of_its_own(path):
    """The harness owns these steps; a trainer that calls them again has grown a second harness."""
    harness_only = {"Accelerator", "seed_everything", "tune_malloc", "claim_run_folder", "save_config", "Tracker",
                    "Checkpointer", "NonFiniteGuard", "configure_deepspeed", "full_state_dict", "decided_on_main",
                    "accelerator.prepare", "write_json"}
    tree = ast.parse(path.read_text())
    own = _calls(tree) & harness_only
    assert not own, f"{path.name} calls {sorted(own)}: use rlhfkit.runtime.run.Run"


def test_final_adapter_names_its_base_absolutely_with_a_filled_card_and_final_metrics(tmp_path, tiny_model_dir,
                                                                                      monkeypatch):
    """A model given by a relative path: the adapter's base_model_name_or_path loads from any working
    directory; final/README.md is rlhfkit's card, not peft's template, and says what was evaluated; the
    returned summary holds the last step's metrics."""
    import json
    import shutil

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.sft import train
    from rlhfkit.trainers.sft_config import SFTConfig

    shutil.copytree(tiny_model_dir, tmp_path / "base")
    rows = [{"prompt": f"Say {i}.", "response": f"I say {i}."} for i in range(4)]
    (tmp_path / "sft.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    monkeypatch.chdir(tmp_path)
    summary = train(build_config(SFTConfig, dict(
        model="base", data="sft.jsonl", dtype="fp32", tensorboard=False, quiet=True, max_steps=2, batch_size=2,
        micro_batch_size=2, eval_fraction=0.0, rouge_examples=0, output_dir="runs", run_name="s")))
    final = tmp_path / "runs" / "s" / "final"
    base = json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str((tmp_path / "base").resolve())
    card = (final / "README.md").read_text()
    assert "Trained with `rlhfkit sft`" in card and "Model Card for Model ID" not in card
    assert f"adapter base: `{base}`" in card and "| data | `sft.jsonl` |" in card
    # no held-out split and eval_fraction 0: the evaluation ran on training records, and the card says so
    assert "## Metrics (evaluation on training records (the data has no held-out split) after training)" in card
    assert "| `loss` |" in card
    last = json.loads((tmp_path / "runs" / "s" / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["final_metrics"] == last and "loss/sft" in last
