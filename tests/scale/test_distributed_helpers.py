"""rlhfkit.runtime.distributed with fake accelerators: the DDP / DeepSpeed bookkeeping that a CPU
run cannot reach (DeepSpeed's accumulation boundary, its 'auto' config values) and the reductions."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rlhfkit.algos import masked_mean, masked_var
from rlhfkit.errors import ConfigError
from rlhfkit.runtime.distributed import (
    DEEPSPEED_REFUSED,
    accumulate_backward,
    configure_deepspeed,
    global_mean_var,
    mean_over_processes,
    refuse_deepspeed,
    sum_over_processes,
)


class FakeAccelerator:
    """Records backward calls: (scaled loss, inside no_sync?, DeepSpeed boundary flag)."""

    def __init__(self, processes: int = 2, accumulation: int = 1, ds_config: dict | None = None, other=None):
        self.num_processes, self.gradient_accumulation_steps = processes, accumulation
        self.device = torch.device("cpu")
        plugin = None if ds_config is None else SimpleNamespace(deepspeed_config=ds_config, zero_stage=2)
        self.state = SimpleNamespace(deepspeed_plugin=plugin)
        self.gradient_state = SimpleNamespace(sync=True)
        self.gradient_state._set_sync_gradients = lambda v: setattr(self.gradient_state, "sync", v)
        self.in_no_sync, self.calls, self.other = False, [], other

    @contextlib.contextmanager
    def no_sync(self, model):
        self.in_no_sync = True
        yield
        self.in_no_sync = False

    def backward(self, loss):
        self.calls.append((float(loss), self.in_no_sync, self.gradient_state.sync))

    def reduce(self, t, op):  # "the other process" contributes `other(t)`
        return t + self.other(t) if op == "sum" else t


def test_accumulate_backward_under_ddp_syncs_only_on_the_last_micro_batch():
    acc = FakeAccelerator(processes=4)
    for i in range(3):
        accumulate_backward(acc, None, torch.tensor(0.5), sync=i == 2)
    assert acc.calls == [(2.0, True, True), (2.0, True, True), (2.0, False, True)]  # x4 undoes DDP's mean


def test_accumulate_backward_under_deepspeed_marks_the_boundary_and_undoes_its_division():
    acc = FakeAccelerator(processes=2, accumulation=3, ds_config={})
    accumulate_backward(acc, None, torch.tensor(1.0), sync=False)
    accumulate_backward(acc, None, torch.tensor(1.0), sync=True)
    assert [c[0] for c in acc.calls] == [6.0, 6.0]  # x processes x DeepSpeed's accumulation steps
    assert [c[2] for c in acc.calls] == [False, True]  # DeepSpeed steps only at the boundary
    assert acc.gradient_state.sync is True  # restored for the optimiser step


def test_configure_deepspeed_fills_only_auto_values():
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "train_batch_size": "auto"}
    configure_deepspeed(FakeAccelerator(processes=8, ds_config=ds), micro_batch_size=4, max_grad_norm=0.5)
    assert ds == {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5, "gradient_accumulation_steps": 1,
                  "train_batch_size": 32}
    mine = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "gradient_accumulation_steps": 1}
    configure_deepspeed(FakeAccelerator(processes=2, ds_config=mine), micro_batch_size=4, max_grad_norm=0.5)
    assert mine["train_micro_batch_size_per_gpu"] == 2 and mine["gradient_clipping"] == 1.0
    configure_deepspeed(FakeAccelerator(), 4, 0.5)  # no DeepSpeed: nothing to do


def test_sums_and_means_over_processes():
    one = FakeAccelerator(processes=1)
    assert sum_over_processes(one, {"a": 1.0}) == {"a": 1.0}
    two = FakeAccelerator(processes=2, other=lambda t: t * 3)  # the other process holds 3x these values
    assert sum_over_processes(two, {"loss": 1.0, "grad_norm": 5.0}, keep=("grad_norm",)) == {"loss": 4.0, "grad_norm": 5.0}
    assert mean_over_processes(two, {"x": 2.0, "note": "kept"}) == {"x": 4.0, "note": "kept"}


def test_global_whitening_statistics_equal_those_of_the_concatenated_rollout():
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(3, 5, generator=g), torch.randn(2, 5, generator=g) * 3 + 1
    m0, m1 = (torch.rand(3, 5, generator=g) > 0.3).float(), (torch.rand(2, 5, generator=g) > 0.3).float()

    def stats(x, m):  # what process 1 contributes: its masked sums
        return torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()]).double()

    acc = FakeAccelerator(processes=2, other=lambda t: stats(x1, m1))
    mean, var = global_mean_var(acc, x0, m0)
    x, m = torch.cat([x0, x1]), torch.cat([m0, m1])
    assert mean == pytest.approx(float(masked_mean(x, m)), rel=1e-6)
    assert var == pytest.approx(float(masked_var(x, m)), rel=1e-5)
    assert global_mean_var(FakeAccelerator(processes=1), x0, m0) == (None, None)


def test_grpo_constant_normaliser_counts_every_process():
    """Dr. GRPO's constant is mini_batch_size x max_new_tokens of the whole optimiser step: with N
    processes each holding a mini-batch, N times the single-process constant."""
    from rlhfkit.core.config import build_config
    from rlhfkit.models.policy import ActorCritic
    from rlhfkit.rollout import Rollout, logprob_pass
    from rlhfkit.trainers.grpo import micro_batch_loss
    from rlhfkit.trainers.grpo_config import GRPOConfig

    from tiny_lm import build_tiny_model

    actor = ActorCritic(build_tiny_model(320), value_head=None)
    g = torch.Generator().manual_seed(0)
    mb = Rollout(query_ids=torch.randint(3, 300, (4, 5), generator=g), query_mask=torch.ones(4, 5).long(),
                 response_ids=torch.randint(3, 300, (4, 6), generator=g), response_mask=torch.ones(4, 6),
                 stopped=torch.zeros(4, dtype=torch.bool))
    mb = logprob_pass(actor, None, mb, 1.0, 4)
    mb = dataclasses.replace(mb, advantages=torch.randn(4, 6, generator=g))
    cfg = build_config(GRPOConfig, {"model": "unused", "loss_agg": "constant", "rollout_batch_size": 4, "group_size": 2,
                                    "mini_batch_size": 4, "micro_batch_size": 4, "max_new_tokens": 6})
    one, _ = micro_batch_loss(actor, mb, cfg, 24.0, 4.0, torch.device("cpu"))
    two, _ = micro_batch_loss(actor, mb, cfg, 48.0, 8.0, torch.device("cpu"), num_processes=2)
    assert float(one) != 0 and float(two) == pytest.approx(float(one) / 2, rel=1e-6)


def test_a_deepspeed_launch_is_refused_in_one_line():
    refuse_deepspeed({})  # DDP, FSDP2, torchrun: nothing to refuse
    refuse_deepspeed({"ACCELERATE_USE_DEEPSPEED": "false"})
    for flag in ("true", "True", "1"):
        with pytest.raises(ConfigError) as err:
            refuse_deepspeed({"ACCELERATE_USE_DEEPSPEED": flag, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"})
        assert str(err.value) == DEEPSPEED_REFUSED and "\n" not in DEEPSPEED_REFUSED


@pytest.mark.parametrize("command", ["ppo", "sft"])
def test_every_trainer_under_a_deepspeed_launch_stops_with_the_line_and_writes_nothing(
        command, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """What `accelerate launch --config_file configs/accelerate/deepspeed-zero3.yaml` puts in the
    environment (one process: the check comes before any process group or model)."""
    from rlhfkit.cli import main

    for key, value in {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
                       "ACCELERATE_MIXED_PRECISION": "bf16"}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "runs"
    assert main([command, f"model={tiny_model_dir}", f"output_dir={out}", "quiet=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and DEEPSPEED_REFUSED in err[0], err
    assert not out.exists()


# ----------------------------------------------------------------------------- processes and sharding


@pytest.mark.parametrize("processes, fsdp2, engine, stage, name", [
    (1, False, "NO", None, "none"), (2, False, "MULTI_CPU", None, "ddp"), (8, False, "MULTI_GPU", None, "ddp"),
    (2, True, "MULTI_CPU", None, "fsdp2"), (1, True, "NO", None, "fsdp2"), (8, False, "DEEPSPEED", 3, "deepspeed-zero3"),
    (8, False, "FSDP", None, "fsdp"),
])
def test_sharding_names_what_the_launch_shards(processes, fsdp2, engine, stage, name):
    from rlhfkit.runtime.distributed import sharding_name

    assert sharding_name(processes, fsdp2, engine, stage) == name


def test_the_processes_line_shows_the_one_process_trap():
    from rlhfkit.runtime.distributed import processes_line

    assert processes_line(1, 1, "none", launched=False) is None  # a plain `rlhfkit ppo`: nothing to say
    assert processes_line(16, 2, "fsdp2", launched=True) == "[processes] 16 (2 machines), sharding: fsdp2"
    assert processes_line(2, 1, "ddp", launched=True) == "[processes] 2, sharding: ddp"
    trap = processes_line(1, 1, "none", launched=True)
    assert trap.startswith("[processes] 1, sharding: none (the launcher started one process;") and "--cpu" in trap


def test_the_report_shows_processes_from_the_summary():
    from rlhfkit.diagnostics.report import processes_text

    assert processes_text({"processes": 16, "machines": 2, "sharding": "fsdp2"}) == "16 on 2 machines, fsdp2"
    assert processes_text({"processes": 1, "machines": 1, "sharding": "none"}) == "1, none"
    assert processes_text(None) == processes_text({"run_dir": "x"}) == "?"  # running, or an older summary
