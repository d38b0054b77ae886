"""A full disk (core/disk.py): one line naming the path, no torn line, no empty config, no
half-written checkpoint, and leftovers cleaned before a resume cuts the logs."""

from __future__ import annotations

import errno
import os
import pathlib
from collections import namedtuple

import pytest
import torch

from rlhfkit.core import disk
from rlhfkit.core.disk import DiskFull, append_text, write_atomic
from rlhfkit.core.run_files import CHECKPOINTS, latest_checkpoint
from rlhfkit.runtime.checkpoint import write_checkpoint

FULL = OSError(errno.ENOSPC, "No space left on device")


def test_an_append_on_a_full_disk_keeps_whole_lines(tmp_path, monkeypatch):
    log = tmp_path / "samples.jsonl"
    log.write_text('{"iteration": 0}\n')
    real = os.write

    def half_then_full(fd, data):
        real(fd, bytes(data[: len(data) // 2]))  # the disk fills in the middle of the line
        raise FULL

    monkeypatch.setattr(disk.os, "write", half_then_full)
    with pytest.raises(DiskFull, match=f"^no space left on device writing {log}; free space, then start the run "
                                       "again$"):
        append_text(log, '{"iteration": 1, "completion": "a long line"}\n', tmp_path)
    monkeypatch.undo()
    assert log.read_text() == '{"iteration": 0}\n'  # cut back: no torn last line


def test_a_config_written_on_a_full_disk_is_the_old_one_not_an_empty_one(tmp_path, monkeypatch):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("lr: 0.001\n")
    real = pathlib.Path.write_text

    def full(self, text, *a, **kw):
        real(self, "", *a, **kw)  # the file was created, nothing could be written
        raise FULL

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(DiskFull, match=f"writing {cfg};"):
        write_atomic(cfg, "lr: 0.002\n", tmp_path)
    monkeypatch.undo()
    assert cfg.read_text() == "lr: 0.001\n" and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def test_a_checkpoint_on_a_full_disk_is_one_line_and_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """torch.save on a full disk raises "unexpected pos ..." without an errno: with no space left it
    is still reported as the full disk, naming the folder, and the previous checkpoint stays."""
    write_checkpoint(tmp_path, 1, model=_model(), state={"step": 1}, config_text="")

    def short_write(*a, **kw):
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                           "data/0: unexpected pos 807232 vs 807124")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(torch, "save", short_write)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage(10 << 30, 10 << 30, 4096))
    tmp = tmp_path / CHECKPOINTS / ".tmp-step-2"
    with pytest.raises(DiskFull, match=f"^no space left on device writing {tmp}; free space, then --resume "
                                       f"{tmp_path}$"):
        write_checkpoint(tmp_path, 2, model=_model(), state={"step": 2}, config_text="")
    assert not tmp.exists() and latest_checkpoint(tmp_path).name == "step-1"


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="some other failure"):
        write_checkpoint(tmp_path, 1, model=_model(), state={"step": 1}, config_text="")
    assert not (tmp_path / CHECKPOINTS / ".tmp-step-1").exists()
