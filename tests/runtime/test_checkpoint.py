"""rlhfkit.runtime.checkpoint: atomic writes, what counts as complete, pruning, RNG and log handling."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from rlhfkit.core.run_files import CHECKPOINTS, META, WEIGHTS, checkpoints, latest_checkpoint
from rlhfkit.errors import UserError
from rlhfkit.runtime.checkpoint import (
    load_rng,
    load_state,
    load_trainable,
    truncate_logs,
    write_checkpoint,
)


def _model(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    m[0].requires_grad_(False)  # a frozen "base": not saved
    return m


def _state(step):
    """The smallest state.pt a resume accepts (runtime/checkpointer.py Checkpointer.state)."""
    return {"step": step, "optimizer": {"state": {}, "param_groups": []}, "optimizer_format": "torch",
            "scheduler": {}, "objects": {}}


def _write(run, step, model=None, keep=5):
    return write_checkpoint(run, step, model=model or _model(), state=_state(step), config_text="seed: 0\n", keep=keep)


def test_written_checkpoint_holds_trainable_weights_state_and_rng(tmp_path):
    model = _model(1)
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    path = _write(tmp_path, 7, model)
    expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
    assert path == tmp_path / CHECKPOINTS / "step-7" and latest_checkpoint(tmp_path) == path
    assert json.loads((path / META).read_text())["step"] == 7 and load_state(path) == _state(7)
    from safetensors.torch import load_file

    assert set(load_file(str(path / WEIGHTS))) == {"1.weight", "1.bias"}  # requires_grad only
    fresh = _model(2)
    load_trainable(fresh, path)
    assert torch.equal(fresh[1].weight, model[1].weight) and not torch.equal(fresh[0].weight, model[0].weight)
    from rlhfkit.core.seeding import set_rng_state

    set_rng_state(load_rng(path, 0))  # the states at save time: the same draws again
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected
    assert load_rng(path, 1) is None


def test_only_complete_folders_count_and_leftovers_are_ignored(tmp_path):
    _write(tmp_path, 1)
    root = tmp_path / CHECKPOINTS
    (root / ".tmp-step-3").mkdir()  # a crash before the rename
    (root / ".tmp-step-3" / META).write_text(json.dumps({"step": 3, "files": []}))
    (root / "step-2").mkdir()  # no meta.json: not a checkpoint
    (root / "step-4").mkdir()  # meta.json names a missing file
    (root / "step-4" / META).write_text(json.dumps({"step": 4, "files": ["state.pt"]}))
    (root / "notes").mkdir()
    assert checkpoints(tmp_path) == [root / "step-1"]
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_keep_prunes_the_oldest_and_a_step_saved_again_is_replaced(tmp_path):
    for step in (1, 2, 3, 10):  # numeric order, not text order (10 > 3)
        _write(tmp_path, step, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-3", "step-10"]
    _write(tmp_path, 10, keep=2)
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).iterdir()) == ["step-10", "step-3"]


def test_weights_of_another_model_are_a_one_line_error(tmp_path):
    path = _write(tmp_path, 1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    other[0].requires_grad_(False)
    with pytest.raises(UserError, match="1.weight has shape"):
        load_trainable(other, path)
    with pytest.raises(UserError, match="does not fit this model"):
        load_trainable(torch.nn.Linear(4, 1), path)


def test_truncate_logs_keeps_rows_before_the_step_and_drops_a_torn_line(tmp_path):
    rows = [{"iteration": i, "x": i} for i in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 5, "x"')
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps({"iteration": i // 2}) + "\n" for i in range(8)))
    kept = truncate_logs(tmp_path, 3)
    assert kept == rows[:3]
    assert [json.loads(x)["iteration"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert [json.loads(x)["iteration"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == [0, 0, 1, 1,
                                                                                                           2, 2]


def test_a_checkpoint_written_under_fsdp2_resumes_under_fsdp2_only(tmp_path):
    """Under FSDP2 state.pt keeps the optimiser's whole state keyed by parameter name, which a plain
    optimiser cannot load: one line instead of a KeyError deep in torch (and the other way round)."""
    from types import SimpleNamespace

    from rlhfkit.runtime.checkpointer import Checkpointer

    model = _model()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    state = {"step": 1, "optimizer": {"state": {}, "param_groups": []}, "optimizer_format": "fsdp2",
             "scheduler": sched.state_dict(), "objects": {}}
    path = write_checkpoint(tmp_path, 1, model=model, state=state, config_text="seed: 0\n")
    one_process = SimpleNamespace(distributed_type=None, process_index=0, num_processes=1, is_main_process=True)
    checkpointer = Checkpointer(SimpleNamespace(save_every=0, keep_checkpoints=2), tmp_path, "ppo", one_process,
                                SimpleNamespace(print=print), model=model, optimizer=opt, scheduler=sched)
    with pytest.raises(UserError, match=r"^resume: .*step-1 was written under FSDP2; resume it under FSDP2 too"):
        checkpointer.resume(path)


# ----------------------------------------------------------------------------- checks and fallback


def test_meta_records_the_size_and_sha256_of_every_file(tmp_path):
    import hashlib

    path = _write(tmp_path, 3)
    meta = json.loads((path / META).read_text())
    assert set(meta["sizes"]) == set(meta["files"]) == set(meta["sha256"])
    for name in meta["files"]:
        data = (path / name).read_bytes()
        assert meta["sizes"][name] == len(data) and meta["sha256"][name] == hashlib.sha256(data).hexdigest()


def _damage(path, how):
    """Damage a checkpoint file the ways a full disk, a bad copy or a bit flip do."""
    f = path / WEIGHTS
    data = f.read_bytes()
    if how == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif how == "deleted":
        f.unlink()
    elif how == "empty-meta":
        (path / META).write_text("")
    elif how == "step":
        meta = json.loads((path / META).read_text())
        (path / META).write_text(json.dumps({**meta, "step": 1}))


@pytest.mark.parametrize("how, problem", [
    ("truncated", r"trainable.safetensors has \d+ bytes, \d+ were written"),
    ("flipped", "trainable.safetensors does not match the sha256"),
    ("deleted", "trainable.safetensors is missing"),
    ("empty-meta", r"meta.json is unreadable"),
    ("step", "meta.json says step 1, the folder step-2"),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before_with_a_notice(how, problem, tmp_path):
    from rlhfkit.core.run_files import resumable_checkpoint

    one, two = _write(tmp_path, 1), _write(tmp_path, 2)
    assert resumable_checkpoint(tmp_path) == (two, [])
    _damage(two, how)
    found, notices = resumable_checkpoint(tmp_path)
    assert found == one and len(notices) == 1
    assert notices[0].startswith(f"[resume] skipping step-2: {two}/") and notices[0].endswith(
        "; resuming from step-1 instead")
    assert __import__("re").search(problem, notices[0])


def _old_format(path):
    """A checkpoint as written before sizes and hashes were recorded."""
    meta = json.loads((path / META).read_text())
    (path / META).write_text(json.dumps({k: v for k, v in meta.items() if k not in ("sizes", "sha256")}))


def test_files_of_two_checkpoints_mixed_or_unreadable_are_one_line(tmp_path):
    from rlhfkit.core.run_files import STATE
    from rlhfkit.runtime.checkpointer import read_checked

    model = _model()
    three, four = _write(tmp_path, 3, model), _write(tmp_path, 4, model)
    _old_format(four)
    (four / STATE).write_bytes((three / STATE).read_bytes())  # step-3's state.pt copied into step-4
    with pytest.raises(UserError, match="state.pt is from step 3, but the checkpoint is step-4: its files come "
                                        "from different checkpoints"):
        read_checked(four)
    _old_format(three)
    _damage(three, "truncated")
    with pytest.raises(UserError, match=rf"resume: cannot read {three / WEIGHTS} \(.*\); delete that checkpoint"):
        read_checked(three)


# ----------------------------------------------------------------------------- structure, old checkpoints


def _reseal(path):
    """Record the sizes and sha256 of the files as they are now (a damage that checksums cannot see)."""
    from rlhfkit.core.run_files import file_digest

    meta = json.loads((path / META).read_text())
    meta["sizes"] = {f: (path / f).stat().st_size for f in meta["files"]}
    meta["sha256"] = {f: file_digest(path / f) for f in meta["files"]}
    (path / META).write_text(json.dumps(meta))


def _misshape(path, how):
    """Files that pass their checksums but hold the wrong thing."""
    from rlhfkit.core.run_files import CONFIG, STATE

    if how == "meta-list":
        (path / META).write_text(json.dumps([json.loads((path / META).read_text())]))
        return
    if how == "meta-files":
        meta = json.loads((path / META).read_text())
        (path / META).write_text(json.dumps({**meta, "files": "state.pt"}))
        return
    if how == "state-list":
        torch.save([1, 2, 3], path / STATE)
    elif how == "state-step":
        torch.save(_state(1), path / STATE)
    elif how == "state-no-optimizer":
        torch.save({**_state(2), "optimizer": [0]}, path / STATE)
    elif how == "state-pickle":
        (path / STATE).write_bytes(b"not a zip file at all")
    elif how == "rng-list":
        torch.save(["python", "numpy"], path / "rng-rank0.pt")
    elif how == "config-list":
        (path / CONFIG).write_text("- seed\n- 0\n")
    elif how == "weights-garbage":
        (path / WEIGHTS).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    _reseal(path)


@pytest.mark.parametrize("how, problem", [
    ("meta-list", r"meta.json is unreadable \(TypeError: a JSON list, not an object\)"),
    ("meta-files", r"meta.json is unreadable \(TypeError: 'files' is not a list of file names\)"),
    ("state-list", "state.pt holds a list, not the checkpoint's state dict"),
    ("state-step", "state.pt is from step 1, but the checkpoint is step-2"),
    ("state-no-optimizer", r"state.pt has no optimizer state \('optimizer': list\)"),
    ("state-pickle", r"state.pt is unreadable \(RuntimeError"),
    ("rng-list", "rng-rank0.pt holds a list, not RNG states"),
    ("config-list", "config.yaml holds a list, not a configuration"),
    ("weights-garbage", r"trainable.safetensors is unreadable \("),
])
def test_a_newest_checkpoint_of_the_wrong_structure_falls_back_like_a_damaged_one(how, problem, tmp_path):
    """Checksums recomputed to match: only the structure shows the damage (meta.json a list used to
    be an AttributeError traceback; state.pt a list a TypeError deep in the resume)."""
    from rlhfkit.core.run_files import resumable_checkpoint

    one, two = _write(tmp_path, 1), _write(tmp_path, 2)
    _misshape(two, how)
    found, notices = resumable_checkpoint(tmp_path)
    assert found == one and len(notices) == 1, notices
    assert notices[0].startswith(f"[resume] skipping step-2: {two}/") and notices[0].endswith(
        "; resuming from step-1 instead")
    assert __import__("re").search(problem, notices[0]), notices[0]
    assert latest_checkpoint(tmp_path) in (one, two)  # no traceback from the completeness check either


def test_weights_record_their_step_and_weights_of_another_step_fall_back(tmp_path):
    from safetensors import safe_open

    from rlhfkit.core.run_files import resumable_checkpoint

    model = _model()
    one, two = _write(tmp_path, 1, model), _write(tmp_path, 2, model)
    with safe_open(str(two / WEIGHTS), framework="pt") as f:
        assert f.metadata() == {"step": "2"}
    (two / WEIGHTS).write_bytes((one / WEIGHTS).read_bytes())  # step-1's weights copied into step-2
    _reseal(two)
    found, notices = resumable_checkpoint(tmp_path)
    assert found == one and notices == [f"[resume] skipping step-2: {two / WEIGHTS} holds the weights of step 1, not "
                                        "of step-2; resuming from step-1 instead"]


def test_a_checkpoint_without_sizes_and_sha256_resumes_only_with_a_notice(tmp_path):
    """Written before sizes and sha256 were recorded: taken, with a notice that it cannot be
    verified; the weights' own step still catches step-1's weights copied in."""
    from rlhfkit.core.run_files import resumable_checkpoint

    one, two = _write(tmp_path, 1), _write(tmp_path, 2)
    _old_format(one)
    _old_format(two)
    found, notices = resumable_checkpoint(tmp_path)
    assert found == two and notices == [
        "[resume] step-2 has no recorded sizes and sha256 (written by an older rlhfkit): its files cannot be "
        "verified, only their structure and the step recorded in its weights; resuming from it"]
    (two / WEIGHTS).write_bytes((one / WEIGHTS).read_bytes())
    found, notices = resumable_checkpoint(tmp_path)
    assert found == one and len(notices) == 2
    assert notices[0] == (f"[resume] skipping step-2: {two / WEIGHTS} holds the weights of step 1, not of step-2; "
                          "resuming from step-1 instead")
    assert notices[1].startswith("[resume] step-1 has no recorded sizes and sha256")

    from safetensors.torch import load_file, save_file

    save_file(load_file(str(one / WEIGHTS)), str(one / WEIGHTS))  # weights as older versions wrote them: no step
    found, notices = resumable_checkpoint(tmp_path)
    assert found == one and notices[1].endswith(
        "only their structure and the step in state.pt; its weights record none, so weights copied from another "
        "step go unnoticed; resuming from it")


def test_state_that_does_not_fit_the_optimiser_is_one_line(tmp_path):
    """A well-formed state.pt of another optimiser (two parameter groups for this run's one): one
    line naming the file, not a ValueError from torch."""
    from types import SimpleNamespace

    from rlhfkit.runtime.checkpointer import Checkpointer

    model = _model()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    groups = [{**opt.state_dict()["param_groups"][0], "params": [i]} for i in (0, 1)]
    state = {**_state(1), "optimizer": {"state": {}, "param_groups": groups}, "scheduler": sched.state_dict()}
    path = write_checkpoint(tmp_path, 1, model=model, state=state, config_text="seed: 0\n")
    one_process = SimpleNamespace(distributed_type=None, process_index=0, num_processes=1, is_main_process=True)
    checkpointer = Checkpointer(SimpleNamespace(save_every=0, keep_checkpoints=2), tmp_path, "ppo", one_process,
                                SimpleNamespace(print=print), model=model, optimizer=opt, scheduler=sched)
    with pytest.raises(UserError, match=r"^resume: .*step-1/state.pt does not fit this run \(ValueError: .*\): was "
                                        "it saved with another model, optimiser or lora setting\\?$"):
        checkpointer.resume(path)
