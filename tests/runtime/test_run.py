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
from rlhfkit.runtime.run import Launch, Run
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
    launch = Launch(cfg)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.0)).eval()
    opt, sched = make_optimizer(model.parameters(), cfg.lr, cfg.warmup_steps)
    counter: dict = {}  # a dict gets back the keys it lacks (runtime/checkpoint.py set_state)
    run = Run(launch, "toy", cfg.steps, model, opt, sched, 1, unit="step", summary={"note": "kept"}, counter=counter)
    run.resume()
    return run, run.model, counter


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


def test_a_run_is_complete_when_built(tmp_path):
    """Every attribute the harness has is set by the constructor: none starts as None to be filled later."""
    run, model, _ = toy_run(tmp_path)
    with run:
        unset = sorted(k for k, v in vars(run).items() if v is None and k not in ("fsdp2", "resume_from"))
        assert unset == []  # fsdp2: no FSDP2 launch; resume_from: a new run
        assert run.run_dir.is_dir() and (run.run_dir / "config.yaml").is_file()
        assert model.training and run.core is model and run.start == 0


def _lock_free(run_dir: Path, tmp_path) -> bool:
    """Whether another run can take `run_dir` now (its lock released)."""
    from rlhfkit.runtime.run_folder import claim_run_folder

    cfg = build_config(ToyConfig, dict(output_dir=str(run_dir.parent), run_name=run_dir.name, quiet=True,
                                       tensorboard=False, resume=str(run_dir)))
    try:
        folder = claim_run_folder(cfg, "toy")
    except Exception:
        return False
    folder.close()
    return True


def test_leaving_the_block_after_an_error_removes_a_run_that_logged_nothing(tmp_path):
    run, _, _ = toy_run(tmp_path)
    with pytest.raises(RuntimeError, match="data went away"):
        with run:
            raise RuntimeError("data went away")
    assert not run.run_dir.exists()  # created by this run, nothing logged: nothing to keep


def test_leaving_the_block_after_an_error_marks_a_run_with_steps_failed_and_releases_it(tmp_path):
    from rlhfkit.runtime.run_folder import FAILED

    run, model, _ = toy_run(tmp_path)
    with pytest.raises(RuntimeError, match="diverged"):
        with run:
            _train(run, model, [])
            raise RuntimeError("diverged")
    assert (run.run_dir / FAILED).is_file()
    assert _lock_free(run.run_dir, tmp_path)


def test_a_signal_stop_after_steps_is_not_a_failure(tmp_path):
    from rlhfkit.runtime.faults import Interrupted
    from rlhfkit.runtime.run_folder import FAILED

    run, model, _ = toy_run(tmp_path)
    with pytest.raises(Interrupted):
        with run:
            _train(run, model, [])
            raise Interrupted("stopped by SIGTERM", 15)
    assert not (run.run_dir / FAILED).exists() and _lock_free(run.run_dir, tmp_path)


def test_a_failure_while_the_run_is_built_leaves_nothing_behind(tmp_path):
    """The folder is taken before the model is prepared: a prepare that fails releases and removes it."""
    cfg = build_config(ToyConfig, dict(output_dir=str(tmp_path / "runs"), run_name="toy", quiet=True,
                                       tensorboard=False))
    launch = Launch(cfg)

    class Unpreparable(torch.nn.Linear):
        def train(self, mode: bool = True):
            raise RuntimeError("no train mode")

    model = Unpreparable(3, 3)
    opt, sched = make_optimizer(model.parameters(), cfg.lr, cfg.warmup_steps)
    with pytest.raises(RuntimeError, match="no train mode"):
        Run(launch, "toy", 3, model, opt, sched, 1)
    assert not (tmp_path / "runs" / "toy").exists()
    assert signal_handlers_are_the_defaults()


def signal_handlers_are_the_defaults() -> bool:
    import signal

    return signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler


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
