"""GRPO / RLOO trainer tests on a tiny random Llama (seconds on CPU)."""

from __future__ import annotations

import dataclasses
import json
import math
import threading

import pytest
import torch

from rlhfkit.commands import command_main
from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.models.policy import ActorCritic
from rlhfkit.rollout import Rollout, SamplingParams, forward_logprobs, generate, logprob_pass
from rlhfkit.trainers.grpo import (
    compute_advantages,
    informative_rows,
    micro_batch_loss,
    train,
)
from rlhfkit.trainers.grpo_config import GRPOConfig, RLOOConfig
from rlhfkit.trainers.grpo_variants import ADVANTAGES

from tiny_lm import build_tiny_model, build_tokenizer

PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]
VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")


def tiny_cfg(tmp_path, tiny_model_dir, cls=GRPOConfig, **kw):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS))
    rw = tmp_path / "vowels.py"
    rw.write_text(VOWELS)
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), reward=f"python:{rw}:reward", iterations=1,
                rollout_batch_size=8, group_size=4, mini_batch_size=4, micro_batch_size=2, max_new_tokens=8,
                num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
                tensorboard=False)
    base.update(kw)
    return build_config(cls, base)


def metrics_rows(tmp_path, name="t"):
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- advantages


def _rollout(scores, lengths, R=4):
    B = len(scores)
    mask = torch.tensor([[1.0] * n + [0.0] * (R - n) for n in lengths])
    return Rollout(query_ids=torch.ones(B, 2, dtype=torch.long), query_mask=torch.ones(B, 2, dtype=torch.long),
                   response_ids=torch.ones(B, R, dtype=torch.long), response_mask=mask,
                   stopped=torch.ones(B, dtype=torch.bool), logprobs=torch.zeros(B, R),
                   scores=torch.tensor(scores))


def test_group_advantages_golden_through_the_trainer():
    # group 0: scores 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = sqrt(1/3)
    # group 1: all 2 -> advantage 0 (no signal), std 0
    ro = _rollout([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], [4, 3, 2, 1, 4, 4, 4, 4])
    cfg = build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                    "micro_batch_size": 8, "solved_threshold": 1.0})
    ro, m = compute_advantages(ro, cfg)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    per_seq = [a, -a, -a, a, 0, 0, 0, 0]
    expected = torch.tensor(per_seq)[:, None] * ro.response_mask  # same value on every valid token, 0 on padding
    torch.testing.assert_close(ro.advantages, expected)
    assert m["rollout/group_reward_std"] == pytest.approx(math.sqrt(1 / 3) / 2)  # mean of (sqrt(1/3), 0)
    assert m["rollout/solved_fraction"] == pytest.approx(6 / 8)  # scores >= 1.0
    assert m["rollout/zero_std_group_fraction"] == 0.5
    # Dr. GRPO: centred only
    ro2 = _rollout([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], [4] * 8)
    ro2, _ = compute_advantages(ro2, build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                                      "micro_batch_size": 8, "scale_rewards": False}))
    assert ro2.advantages[:, 0].tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]


def test_leave_one_out_advantages_golden_through_the_trainer():
    # A_i = s_i - mean of the other three: 3 - (1+0+2)/3 = 2, 1 - 5/3 = -2/3, 0 - 2 = -2, 2 - 4/3 = 2/3
    ro = _rollout([3.0, 1.0, 0.0, 2.0], [4, 4, 2, 1])
    cfg = build_config(RLOOConfig, {"rollout_batch_size": 4, "group_size": 4, "micro_batch_size": 4})
    ro, _ = compute_advantages(ro, cfg)
    torch.testing.assert_close(ro.advantages[:, 0], torch.tensor([2.0, -2 / 3, -2.0, 2 / 3]))
    assert ro.advantages.sum() != 0 and (ro.advantages[2, 2:] == 0).all()


def test_score_clip_and_no_stop_penalty_apply_before_the_baseline():
    ro = _rollout([5.0, 0.0, 0.0, 0.0], [4] * 4)
    ro = dataclasses.replace(ro, stopped=torch.tensor([True, True, True, False]))
    cfg = build_config(RLOOConfig, {"rollout_batch_size": 4, "group_size": 4, "micro_batch_size": 4,
                                    "score_clip": 1.0, "no_stop_penalty": -1.0})
    ro, _ = compute_advantages(ro, cfg)  # rewards 1, 0, 0, -1
    torch.testing.assert_close(ro.advantages[:, 0], torch.tensor([1 + 1 / 3, -0.0, -0.0, -1 - 1 / 3]))


# ----------------------------------------------------------------------------- loss aggregation


@pytest.fixture()
def scored_rollout():
    """A tiny policy-only model and a scored rollout of 8 responses of different lengths."""
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = ActorCritic(build_tiny_model(len(tok), seed=2), value_head=None)
    torch.manual_seed(0)
    prompts = ["Hi", "Write a review", "What is 3 + 4?", "Go"] * 2
    ro = generate(model.policy, tok, prompts, SamplingParams(max_new_tokens=8, stop_ids=(2,)))
    ro.response_mask[0, 3:] = 0  # make sure lengths differ
    ro.response_mask[5, 5:] = 0
    ro = logprob_pass(model, None, ro, 1.0, micro_batch_size=8)
    ro = dataclasses.replace(ro, ref_logprobs=ro.logprobs + 0.3 * torch.randn(ro.logprobs.shape) * ro.response_mask)
    ro = dataclasses.replace(ro, advantages=torch.randn(8)[:, None] * ro.response_mask)
    with torch.no_grad():  # move the policy away from pi_old so the ratio and the clip are exercised
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, ro


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean", "constant"])
def test_aggregated_loss_and_gradient_do_not_depend_on_the_micro_batch_split(scored_rollout, agg):
    model, ro = scored_rollout
    cfg = build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                    "micro_batch_size": 1, "loss_agg": agg, "beta": 0.1, "dtype": "fp32",
                                    "clip_eps": 0.05})
    n_tok, n_seq = ro.response_mask.sum().item(), 8.0

    def run(splits, normalise_globally=True):
        model.zero_grad()
        total, clip = 0.0, 0.0
        from rlhfkit.rollout.core import trim_rows

        start = 0
        for size in splits:
            mb = trim_rows(ro, torch.arange(start, start + size))
            nt, ns = (n_tok, n_seq) if normalise_globally else (mb.response_mask.sum().item(), float(size))
            loss, st = micro_batch_loss(model, mb, cfg, nt, ns, torch.device("cpu"))
            loss.backward()
            total += loss.item()
            clip += st["policy_clip_frac"]
            start += size
        return total, [p.grad.clone() for p in model.parameters()], clip

    full_loss, full_grad, clip = run([8])
    assert clip > 0, "the test should exercise the clipped branch"
    for splits in ([4, 4], [2, 2, 2, 2], [1, 3, 4], [1] * 8):
        loss, grad, _ = run(splits)
        assert loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7), splits
        for g, f in zip(grad, full_grad):
            torch.testing.assert_close(g, f, rtol=1e-4, atol=1e-6)
    if agg != "constant":  # per-micro-batch normalisers would break it (the test can fail)
        loss, _, _ = run([1, 3, 4], normalise_globally=False)
        assert abs(loss / 3 - full_loss) > 1e-4


@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_the_beta_term_is_beta_times_the_token_mean_of_the_chosen_estimator(scored_rollout, estimator):
    """loss(beta = 0.1) - loss(beta = 0) = 0.1 * sum(k * mask) / N with d = ref_logp - logp:
    k3 = exp(d) - 1 - d (the default), k2 = d^2 / 2 (kl_loss_estimator=k2)."""
    model, ro = scored_rollout
    n_tok = ro.response_mask.sum().item()

    def loss_with(beta):
        cfg = build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                        "micro_batch_size": 8, "beta": beta, "kl_loss_estimator": estimator,
                                        "dtype": "fp32"})
        with torch.no_grad():
            return micro_batch_loss(model, ro, cfg, n_tok, 8.0, torch.device("cpu"))[0].item()

    with torch.no_grad():
        logp, _, _ = forward_logprobs(model, ro, 1.0, with_values=False)
    d = (ro.ref_logprobs - logp)[ro.response_mask.bool()].double()
    k = d.exp() - 1 - d if estimator == "k3" else 0.5 * d * d
    want = 0.1 * k.sum().item() / n_tok
    assert want > 1e-4
    assert loss_with(0.1) - loss_with(0.0) == pytest.approx(want, rel=1e-4)


# ----------------------------------------------------------------------------- training


def test_run_folder_metrics_no_reference_when_beta_is_zero(tmp_path, tiny_model_dir, patch_everywhere):
    import rlhfkit.models.policy as policy_mod

    def no_reference(*a, **k):
        raise AssertionError("beta=0 must not load a reference")

    patch_everywhere(policy_mod, "Reference", no_reference)  # also where trainers/build.py imported it
    train(tiny_cfg(tmp_path, tiny_model_dir, iterations=2, update_epochs=2))
    rows = metrics_rows(tmp_path)
    assert [r["iteration"] for r in rows] == [0, 1]
    for key in ("rollout/reward_mean", "rollout/reward_std", "rollout/score_mean", "rollout/response_length",
                "rollout/stop_fraction", "rollout/entropy", "rollout/group_reward_std", "rollout/solved_fraction",
                "loss/policy", "loss/total", "params/policy_clip_frac", "params/approx_kl", "params/grad_norm",
                "params/ratio_first_microbatch_maxdev", "params/lr", "timing/rollout_s", "timing/update_s",
                "timing/generate_s", "timing/logprobs_s", "throughput/tokens_per_s"):
        assert key in rows[0], key
    assert "rollout/kl" not in rows[0] and "loss/kl" not in rows[0]
    assert all(r["params/ratio_first_microbatch_maxdev"] == 0.0 for r in rows)
    run = tmp_path / "runs" / "t"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {"prompt", "completion", "score", "reward", "advantage"} <= set(samples[0])
    assert (run / "final" / "adapter_config.json").is_file() and not (run / "final" / "value_head.safetensors").exists()


def test_kl_term_with_reference_and_groups_share_a_prompt(tmp_path, tiny_model_dir, monkeypatch):
    import rlhfkit.trainers.grpo as grpo_mod

    seen = {}
    real = grpo_mod.compute_advantages

    def spy(rollout, cfg, *args):
        seen["prompts"] = list(rollout.prompts)
        return real(rollout, cfg, *args)

    monkeypatch.setattr(grpo_mod, "compute_advantages", spy)
    train(tiny_cfg(tmp_path, tiny_model_dir, iterations=2, beta=0.1, lr=1e-2))
    rows = metrics_rows(tmp_path)
    assert rows[0]["rollout/kl"] == 0.0  # LoRA starts at zero: pi == pi_ref
    assert rows[1]["rollout/kl"] != 0.0  # the first update moved pi away from pi_ref
    assert rows[0]["loss/kl"] > 0.0 and rows[0]["loss/total"] == pytest.approx(
        rows[0]["loss/policy"] + 0.1 * rows[0]["loss/kl"], rel=1e-5, abs=1e-8)
    p = seen["prompts"]
    assert p[0] == p[1] == p[2] == p[3] and p[4] == p[5] == p[6] == p[7] and p[0] != p[4]


def test_groups_with_equal_rewards_are_left_out_of_the_update(tmp_path, tiny_model_dir, monkeypatch):
    """Every completion gets the same reward: no group carries a signal, nothing is evaluated or updated."""
    import rlhfkit.trainers.grpo as grpo_mod

    calls = []
    monkeypatch.setattr(grpo_mod, "micro_batch_loss", lambda *a, **k: calls.append(1))
    const = tmp_path / "const.py"
    const.write_text("def reward(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    train(tiny_cfg(tmp_path, tiny_model_dir, reward=f"python:{const}:reward", iterations=2))
    rows = metrics_rows(tmp_path)
    assert calls == [] and all(r["rollout/update_fraction"] == 0.0 for r in rows)
    assert all(r["rollout/group_reward_std"] == 0.0 and "loss/policy" not in r for r in rows)


def test_only_groups_with_a_reward_spread_are_updated():
    ro = _rollout([1.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0], [4] * 8)
    cfg = build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                    "micro_batch_size": 8})
    ro, _ = compute_advantages(ro, cfg)
    assert informative_rows(ro, cfg, ADVANTAGES["group"]).tolist() == [0, 1, 2, 3]
    # an estimator that gives a flat group a gradient (REINFORCE++'s KL reward) keeps every row
    assert informative_rows(ro, cfg, ADVANTAGES["reinforce++"]).tolist() == list(range(8))
    keep_all = build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                         "micro_batch_size": 8, "drop_zero_std_groups": False})
    assert informative_rows(ro, keep_all, ADVANTAGES["group"]).tolist() == list(range(8))


def _learns(tmp_path, tiny_model_dir, cls, iterations, **kw):
    cfg = tiny_cfg(tmp_path, tiny_model_dir, cls, iterations=iterations, lora=False,
                   lr=1e-2, rollout_batch_size=16, group_size=4, micro_batch_size=8, max_new_tokens=6,
                   warmup_steps=1, **kw)
    train(cfg)
    rows = metrics_rows(tmp_path)
    first = sum(r["rollout/score_mean"] for r in rows[:3]) / 3
    last = sum(r["rollout/score_mean"] for r in rows[-3:]) / 3
    return first, last, rows


def test_tiny_model_learns_toy_verifiable_reward_with_grpo(tmp_path, tiny_model_dir):
    """Reward = share of vowels in the completion (about 0.13 for the random model); ten GRPO
    iterations of full fine-tuning must raise it clearly (seen: 0.12 -> 0.44)."""
    first, last, _ = _learns(tmp_path, tiny_model_dir, GRPOConfig, 10, mini_batch_size=8)
    assert last > first + 0.15, (first, last)


def test_tiny_model_learns_toy_verifiable_reward_with_rloo(tmp_path, tiny_model_dir):
    """Same task with RLOO's defaults: one on-policy REINFORCE step per rollout (ratio exactly 1)."""
    first, last, rows = _learns(tmp_path, tiny_model_dir, RLOOConfig, 20, mini_batch_size=None)
    assert all(r["params/policy_clip_frac"] == 0.0 and r["params/ratio_mean"] == pytest.approx(1.0) for r in rows)
    assert last > first + 0.15, (first, last)


# ----------------------------------------------------------------------------- config and CLI


def test_config_errors():
    with pytest.raises(ConfigError, match=r"rollout_batch_size \(10\) must be divisible by group_size \(4\)"):
        build_config(GRPOConfig, {"rollout_batch_size": 10, "group_size": 4, "mini_batch_size": 10, "micro_batch_size": 2})
    with pytest.raises(ConfigError, match=r"group_size \(1\) must be >= 2"):
        build_config(GRPOConfig, {"group_size": 1})
    with pytest.raises(ConfigError, match=r"rollout_batch_size \(64\) must be divisible by mini_batch_size \(24\)"):
        build_config(GRPOConfig, {"mini_batch_size": 24})
    with pytest.raises(ConfigError, match=r"mini_batch_size \(32\) must be divisible by micro_batch_size \(5\)"):
        build_config(GRPOConfig, {"micro_batch_size": 5})
    with pytest.raises(ConfigError, match="loss_agg='sum': expected one of token-mean, seq-mean, constant"):
        parse_args(GRPOConfig, ["loss_agg=sum"], "rlhfkit grpo")
    with pytest.raises(ConfigError, match="did you mean 'group_size'"):
        parse_args(GRPOConfig, ["group_sise=4"], "rlhfkit grpo")
    with pytest.raises(ConfigError, match=r"beta \(-0.1\) must be >= 0"):
        parse_args(RLOOConfig, ["beta=-0.1"], "rlhfkit rloo")


def test_defaults():
    g, r = GRPOConfig(), RLOOConfig()
    assert (g.beta, g.group_size, g.loss_agg, g.temperature, g.top_k, g.top_p) == (0.0, 8, "token-mean", 1.0, 0, 1.0)
    assert (g.prompts, g.reward, g.advantage, g.scale_rewards) == ("builtin:arithmetic", "arithmetic", "group", "group")
    assert (r.advantage, r.update_epochs, r.optimiser_batch) == ("rloo", 1, r.rollout_batch_size)


def test_help_lists_every_field(capsys):
    import dataclasses

    for name, cls in (("grpo", GRPOConfig), ("rloo", RLOOConfig)):
        assert command_main(name)(["--help"]) == 0
        out = capsys.readouterr().out
        for f in dataclasses.fields(cls):
            assert f"  {f.name} (" in out, f.name


def test_arithmetic_demo_prints_accuracy_before_and_after(tmp_path, tiny_model_dir, capsys):
    """The default task on a tiny model: builtin:arithmetic, exact match, held-out accuracy printed."""
    train(tiny_cfg(tmp_path, tiny_model_dir, prompts="builtin:arithmetic", reward="arithmetic", num_eval_prompts=4,
                   max_new_tokens=4, quiet=False))
    out = capsys.readouterr().out
    assert "[eval] held-out accuracy (T=1.0): 0.0% before -> 0.0% after (n=4)" in out
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["eval_before"]["n"] == 4


# ----------------------------------------------------------------------------- shared prompts


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_sharing_prompts_changes_no_result_of_a_run(tmp_path, tiny_model_dir, monkeypatch, beta):
    """share_prompts (default on) against off: the same samples, rewards and update to float rounding,
    and the shared path really ran (the prompt pass saw one row per distinct prompt)."""
    import rlhfkit.models.shared_prompts as sp

    prompt_rows = []
    original = sp.prompt_cache
    monkeypatch.setattr(sp, "prompt_cache", lambda m, ids, *a: prompt_rows.append(len(a[2])) or original(m, ids, *a))
    runs = {}
    for share in (False, True):
        out = tmp_path / str(share)
        out.mkdir()
        train(tiny_cfg(out, tiny_model_dir, iterations=2, share_prompts=share, beta=beta, lora=False, lr=1e-2,
                       update_epochs=2, drop_zero_std_groups=False))
        runs[share] = metrics_rows(out)
    assert prompt_rows and all(n in (1, 2) for n in prompt_rows)  # 2 groups of 4 rows: at most 2 prompts at once
    for plain, shared in zip(runs[False], runs[True]):
        assert shared["rollout/score_mean"] == plain["rollout/score_mean"]
        assert shared["rollout/response_length"] == plain["rollout/response_length"]
        for key in ("loss/policy", "params/approx_kl", "params/grad_norm", "rollout/entropy"):
            assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
        assert shared["params/ratio_first_microbatch_maxdev"] < 1e-5


def test_evaluation_prompts_say_whether_they_are_held_out(tmp_path):
    """A local file without a split: the before/after check runs on a fixed sample of its training
    prompts and the change line says so; a split field or eval_prompts (TRL's eval_dataset) is held out."""
    import json

    from rlhfkit.core.config import build_config
    from rlhfkit.data.splits import eval_phrase
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.rl import prepare_data

    plain = tmp_path / "p.jsonl"
    plain.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(8)))
    cfg = build_config(GRPOConfig, {"prompts": str(plain), "num_eval_prompts": 100})
    _, train, held, source = prepare_data(cfg)
    assert (len(train), len(held), source) == (8, 8, "training")
    assert eval_phrase(len(held), "prompts", source) == (
        "8 training prompts (the data has no held-out split; eval_dataset= or eval_split= to give one)")
    tagged = tmp_path / "t.jsonl"
    tagged.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "split": ["train", "test"][i % 2]})
                                for i in range(8)))
    _, train, held, source = prepare_data(build_config(GRPOConfig, {"prompts": str(tagged)}))
    assert (len(train), len(held), source) == (4, 4, "held-out")
    cfg = build_config(GRPOConfig, {"prompts": str(plain), "eval_dataset": str(tagged)})
    assert prepare_data(cfg)[3] == "held-out"
    _, _, held, source = prepare_data(build_config(GRPOConfig, {"prompts": "builtin:arithmetic", "num_eval_prompts": 5}))
    assert (len(held), source) == (5, "held-out")


# ----------------------------------------------------------------------------- an exactly on-policy update


def test_needs_logprob_pass_only_when_something_reads_it():
    """Step 4 is skipped only for one optimiser step on rows the policy as it is now sampled, with no
    reference, no importance weights and an advantage of the SCORES phase; every other setting keeps it."""
    from types import SimpleNamespace

    from rlhfkit.trainers.grpo import needs_logprob_pass

    rl = SimpleNamespace(accelerator=SimpleNamespace(num_processes=1))
    base = {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8, "micro_batch_size": 4, "update_epochs": 1}

    def needs(n_rows=8, sampler=False, **kw):
        cfg = build_config(GRPOConfig, {**base, **kw})
        rows = _rollout([0.0] * n_rows, [4] * n_rows)
        if sampler:  # vLLM's, or the weights before the last update (one-step off-policy)
            rows = dataclasses.replace(rows, sampler_logprobs=torch.zeros(n_rows, 4))
        return needs_logprob_pass(rl, cfg, ADVANTAGES[cfg.advantage], rows)

    assert not needs() and not needs(n_rows=4) and not needs(advantage="rloo")
    assert needs(n_rows=9)  # more rows than one mini-batch: a second optimiser step would be off-policy
    assert needs(update_epochs=2) and needs(mini_batch_size=4)  # several optimiser steps per rollout
    assert needs(beta=0.04) and needs(tis_cap=2.0)  # the reference's log-probs; importance weights
    assert needs(sampler=True)  # tokens another sampler drew
    assert needs(advantage="reinforce++")  # an estimator of the LOGPROBS phase (it reads the old log-probs)

    # Two processes decide together (a sharded pass is collective): each runs the function in its own
    # thread with a reduce that meets the other's; a process that answered without joining the reduce
    # would leave the other waiting (the barrier breaks after 10 s instead of hanging).
    def on_two_processes(rows_a, rows_b):
        barrier, values = threading.Barrier(2, timeout=10), {}

        def process(rank, rows):
            def reduce(t, op):
                values[rank] = float(t)
                barrier.wait()
                return torch.tensor([max(values.values())], dtype=t.dtype)
            acc = SimpleNamespace(num_processes=2, device="cpu", reduce=reduce)
            try:
                answers[rank] = needs_logprob_pass(SimpleNamespace(accelerator=acc), cfg, ADVANTAGES[cfg.advantage],
                                                   rows)
            except threading.BrokenBarrierError:
                answers[rank] = "left waiting"
            except Exception as e:  # noqa: BLE001 - shown in the assertion, not lost in the thread
                answers[rank] = repr(e)

        answers, cfg = {}, build_config(GRPOConfig, base)
        threads = [threading.Thread(target=process, args=(r, rows)) for r, rows in enumerate((rows_a, rows_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers[0], answers[1]

    own, sampled = _rollout([0.0] * 8, [4] * 8), _rollout([0.0] * 8, [4] * 8)
    sampled = dataclasses.replace(sampled, sampler_logprobs=torch.zeros(8, 4))  # drawn by another sampler
    assert on_two_processes(own, own) == (False, False)
    assert on_two_processes(own, sampled) == (True, True)
    assert on_two_processes(own, _rollout([0.0] * 9, [4] * 9)) == (True, True)


def test_an_exactly_on_policy_update_skips_the_logprob_pass_and_steps_alike(tmp_path, tiny_model_dir, monkeypatch):
    """update_epochs=1, every row in one mini-batch, no reference: the log-prob pass is skipped (the old
    log-probs are the update's own, detached: TRL's num_iterations=1), and the step is the one the pass
    gives, to float32 round-off: losses, gradient norm, entropy and the trained weights."""
    from safetensors.torch import load_file

    import rlhfkit.trainers.grpo as grpo_mod
    from rlhfkit.trainers.rl import RLRun

    passes = []
    real = RLRun.logprob_pass
    monkeypatch.setattr(RLRun, "logprob_pass", lambda self, *a, **k: passes.append(1) or real(self, *a, **k))
    on_policy = dict(update_epochs=1, mini_batch_size=8, drop_zero_std_groups=False, lora=False, lr=1e-3,
                     warmup_steps=0)
    train(tiny_cfg(tmp_path, tiny_model_dir, run_name="skip", **on_policy))
    assert passes == []
    monkeypatch.setattr(grpo_mod, "needs_logprob_pass", lambda *a: True)
    train(tiny_cfg(tmp_path, tiny_model_dir, run_name="pass", **on_policy))
    assert passes == [1]
    skip, kept = metrics_rows(tmp_path, "skip")[0], metrics_rows(tmp_path, "pass")[0]
    assert skip["timing/logprobs_s"] == 0.0 and kept["timing/logprobs_s"] > 0
    assert skip["params/ratio_first_microbatch_maxdev"] == 0.0  # exactly: old = new, detached
    assert skip["rollout/reward_mean"] == kept["rollout/reward_mean"]  # the same samples
    adv = kept["rollout/advantage_abs_mean"]
    assert adv > 0 and abs(skip["loss/policy"] - kept["loss/policy"]) <= 1e-5 * adv
    for key in ("params/grad_norm", "rollout/entropy"):  # > 0 by construction
        assert skip[key] == pytest.approx(kept[key], rel=1e-5), key
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = {n: load_file(str(tmp_path / "runs" / n / "final" / "model.safetensors")) for n in ("skip", "pass")}
    step = max((after["pass"][k] - before[k]).abs().max().item() for k in before)  # Adam: about lr per weight
    apart = max((after["skip"][k] - after["pass"][k]).abs().max().item() for k in before)
    assert step > 0 and apart <= 1e-3 * step
