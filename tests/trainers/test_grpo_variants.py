"""The GRPO family's variants through the trainer (tiny random Llama, seconds on CPU): GSPO's
sequence ratio, DAPO's dynamic sampling and overlong shaping/filtering, REINFORCE++, ReMax, the
truncated importance-sampling correction, and the presets' defaults and errors."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
import torch

import rlhfkit.trainers.grpo as grpo_mod
from rlhfkit.commands import command_main
from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.models.policy import ActorCritic
from rlhfkit.rollout import Rollout, SamplingParams, generate, logprob_pass
from rlhfkit.rollout.core import trim_rows
from rlhfkit.trainers.grpo import compute_advantages, micro_batch_loss, train
from rlhfkit.trainers.grpo_config import DAPOConfig, GRPOConfig, GSPOConfig, ReinforcePPConfig
from rlhfkit.trainers.grpo_rollout import fill_groups, filter_overlong, keep_rows
from rlhfkit.trainers.grpo_variants import ADVANTAGES, LOGPROBS, AdvantageInputs, advantages_at

from tiny_lm import build_tiny_model, build_tokenizer

PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]
# Prompts numbered 1 mod 4 get a varied score; all others score 1 whatever the completion (no spread).
PARITY = ("def reward(prompts, completions, **kw):\n"
          "    return [float(sum(map(ord, c)) % 7) if int(p.split()[-1].rstrip('.')) % 4 == 1 else 1.0\n"
          "            for p, c in zip(prompts, completions)]\n")


def tiny_cfg(tmp_path, tiny_model_dir, cls=GRPOConfig, reward=PARITY, **kw):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS))
    rw = tmp_path / "rw.py"
    rw.write_text(reward)
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), reward=f"python:{rw}:reward", iterations=1,
                rollout_batch_size=8, group_size=4, mini_batch_size=4, micro_batch_size=2, max_new_tokens=6,
                num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
                tensorboard=False)
    base.update(kw)
    return build_config(cls, base)


def metrics_rows(tmp_path, name="t"):
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def _rollout(scores, lengths, R=4, stopped=None):
    B = len(scores)
    mask = torch.tensor([[1.0] * n + [0.0] * (R - n) for n in lengths])
    return Rollout(query_ids=torch.ones(B, 2, dtype=torch.long), query_mask=torch.ones(B, 2, dtype=torch.long),
                   response_ids=torch.ones(B, R, dtype=torch.long), response_mask=mask,
                   stopped=torch.ones(B, dtype=torch.bool) if stopped is None else torch.tensor(stopped),
                   logprobs=torch.zeros(B, R), scores=torch.tensor(scores))


# ----------------------------------------------------------------------------- advantages, golden


def test_remax_and_overlong_shaping_through_compute_advantages():
    # ReMax: A = score - the greedy completion's score of the same prompt (prompts 0 and 1, G = 2)
    ro = _rollout([1.0, 0.0, 0.5, 0.5], [4, 4, 2, 1])
    cfg = build_config(GRPOConfig, {"advantage": "remax", "rollout_batch_size": 4, "group_size": 2,
                                    "mini_batch_size": 4, "micro_batch_size": 4})
    ro, m = compute_advantages(ro, cfg, torch.tensor([0.25, 1.0]))
    torch.testing.assert_close(ro.advantages[:, 0], torch.tensor([0.75, -0.25, -0.5, -0.5]))
    assert m["rollout/greedy_reward_mean"] == pytest.approx(0.625)
    # DAPO's punishment, L_max = 4, L_cache = 2: 4 tokens -> (2 - 4) / 2 = -1, 3 -> -0.5, <= 2 -> 0
    ro = _rollout([1.0, 1.0, 1.0, 1.0], [4, 2, 3, 1])
    cfg = build_config(GRPOConfig, {"rollout_batch_size": 4, "group_size": 2, "mini_batch_size": 4,
                                    "micro_batch_size": 4, "max_new_tokens": 4, "overlong_buffer": 2,
                                    "scale_rewards": False})
    ro, _ = compute_advantages(ro, cfg)
    assert ro.rewards.sum(1).tolist() == [0.0, 1.0, 0.5, 1.0]
    torch.testing.assert_close(ro.advantages[:, 0], torch.tensor([-0.5, 0.5, -0.25, 0.25]))  # Dr. GRPO: centred


def test_reinforce_pp_advantages_golden():
    """Token rewards -0.1 * k1 with the score on the last token, returns, whitened over all valid tokens."""
    ro = _rollout([1.0, 0.0], [2, 3], R=3)
    cfg = build_config(ReinforcePPConfig, {"rollout_batch_size": 2, "mini_batch_size": 2, "micro_batch_size": 2,
                                           "reward_kl_coef": 0.1})
    ro, _ = compute_advantages(ro, cfg)  # the shaped score on the last token; REINFORCE++'s advantages come later
    assert torch.equal(ro.advantages, torch.zeros(2, 3))  # none yet: the estimator runs after the log-prob pass
    ro = dataclasses.replace(ro, ref_logprobs=torch.zeros(2, 3))
    ro = dataclasses.replace(ro, logprobs=torch.tensor([[0.5, -0.5, 9.0], [0.2, 0.0, 0.1]]))  # k1 = logp - ref_logp; 9.0 is padding
    advantages, _ = advantages_at(LOGPROBS, ADVANTAGES[cfg.advantage],
                                  AdvantageInputs(ro, cfg, lambda: None, SimpleNamespace(num_processes=1)))
    # rewards: row 0 [-0.05, 0.05 + 1], row 1 [-0.02, 0, -0.01 + 0] -> returns [1.0, 1.05], [-0.03, -0.01, -0.01]
    g = [1.0, 1.05, -0.03, -0.01, -0.01]
    mean = sum(g) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in g) / 5 + 1e-8)
    expected = torch.tensor([[(1.0 - mean) / std, (1.05 - mean) / std, 0.0],
                             [(-0.03 - mean) / std, (-0.01 - mean) / std, (-0.01 - mean) / std]])
    torch.testing.assert_close(advantages, expected, rtol=1e-5, atol=1e-6)
    # the baseline variant subtracts the group's mean score first: [1, 0] -> [0.5, -0.5]
    ro2 = _rollout([1.0, 0.0], [2, 3], R=3)
    cfg2 = build_config(ReinforcePPConfig, {"advantage": "reinforce++-baseline", "group_size": 2,
                                            "rollout_batch_size": 2, "mini_batch_size": 2, "micro_batch_size": 2,
                                            "reward_kl_coef": 0.0})
    ro2, _ = compute_advantages(ro2, cfg2)
    ro2 = dataclasses.replace(ro2, ref_logprobs=None)
    advantages2, _ = advantages_at(LOGPROBS, ADVANTAGES[cfg2.advantage],
                                   AdvantageInputs(ro2, cfg2, lambda: None, SimpleNamespace(num_processes=1)))
    g2 = [0.5, 0.5, -0.5, -0.5, -0.5]
    mean2 = sum(g2) / 5
    std2 = math.sqrt(sum((x - mean2) ** 2 for x in g2) / 5 + 1e-8)
    torch.testing.assert_close(advantages2[0, :2], torch.tensor([(0.5 - mean2) / std2] * 2), rtol=1e-5, atol=1e-6)


def test_overlong_filter_takes_cut_completions_out_of_the_loss():
    ro = _rollout([1.0, 0.0, 1.0], [4, 4, 2], stopped=[True, False, True])
    out, share = filter_overlong(ro)
    assert share == pytest.approx(1 / 3)
    assert out.response_mask.sum(1).tolist() == [4.0, 0.0, 2.0]
    assert ro.response_mask.sum(1).tolist() == [4.0, 4.0, 2.0]  # a new value: the input is left as it was


# ----------------------------------------------------------------------------- dynamic sampling


def _draw_factory(groups_per_round):
    """Rounds whose groups (G = 2) have a spread (True) or not (False), as listed."""
    def draw(r):
        spread = groups_per_round[r]
        scores = [x for s in spread for x in ((1.0, 0.0) if s else (1.0, 1.0))]
        ro = _rollout(scores, [2] * len(scores))
        rewards = torch.zeros(len(scores), 4)
        rewards[:, 1] = torch.tensor(scores)
        ro = dataclasses.replace(ro, prompts=[f"r{r}g{i // 2}" for i in range(len(scores))],
                                 completions=["c"] * len(scores), rewards=rewards)
        return ro, {"rollout/x": float(r)}
    return draw


def test_dynamic_sampling_fills_the_batch_with_varied_groups_and_stops_at_its_cap():
    draw = _draw_factory([[True, False, False], [False, False, False], [False, True, True], [True, True, True]])
    kept, sampled, metrics, n = fill_groups(draw, 2, target=3, max_rounds=10, fewest=lambda c: c)
    assert len(sampled) == 3 and n == 3  # 1 + 0 + 2 groups: full after the third round
    assert [p for k in kept for p in k.prompts[::2]] == ["r0g0", "r2g1", "r2g2"]  # the first found, in order
    assert [m["rollout/x"] for m in metrics] == [0.0, 1.0, 2.0]
    kept, sampled, _, n = fill_groups(draw, 2, target=3, max_rounds=2, fewest=lambda c: c)
    assert len(sampled) == 2 and n == 1  # the cap: 2 rounds, 1 group found


def test_dynamic_sampling_with_several_processes_keeps_the_fewest_count():
    """Another process finds 1 group per round: every process continues until it, too, has 3, then all
    keep 3; at the cap all keep what that process found."""
    draw = _draw_factory([[True, True, True]] * 4)
    other = iter([1, 2, 3, 3])
    kept, sampled, _, n = fill_groups(draw, 2, target=3, max_rounds=4, fewest=lambda c: min(c, next(other)))
    assert len(sampled) == 3 and n == 3  # the other process reached 3 in round 3
    other = iter([0, 1, 1])
    _, sampled, _, n = fill_groups(draw, 2, target=3, max_rounds=2, fewest=lambda c: min(c, next(other)))
    assert len(sampled) == 2 and n == 1


def test_dynamic_sampling_through_the_trainer(tmp_path, tiny_model_dir, monkeypatch):
    """Only the groups of prompts numbered 1 mod 4 have a spread: the update sees only those, as many
    as asked (2 groups of 4), drawn in further rounds; the rounds and extra samples are logged."""
    seen = []
    real = grpo_mod.update_on
    monkeypatch.setattr(grpo_mod, "update_on", lambda rl, cfg, batch, rows, *a: seen.append(
        [batch.prompts[i] for i in rows.tolist()]) or real(rl, cfg, batch, rows, *a))
    train(tiny_cfg(tmp_path, tiny_model_dir, DAPOConfig, max_sampling_rounds=10, overlong_buffer=0,
                   max_new_tokens=4))
    row, = metrics_rows(tmp_path)
    prompts, = seen
    assert len(prompts) == 8 and all(int(p.split()[-1].rstrip(".")) % 4 == 1 for p in prompts)
    assert row["rollout/kept_groups"] == 2.0 and row["rollout/sampling_rounds"] > 1
    assert row["rollout/extra_samples"] == (row["rollout/sampling_rounds"] - 1) * 8
    assert row["rollout/update_fraction"] == pytest.approx(8 / (8 * row["rollout/sampling_rounds"]))


def test_dynamic_sampling_stops_at_the_cap_without_an_update(tmp_path, tiny_model_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(grpo_mod, "update_on", lambda *a: calls.append(1))
    const = "def reward(prompts, completions, **kw):\n    return [0.5] * len(completions)\n"
    train(tiny_cfg(tmp_path, tiny_model_dir, DAPOConfig, reward=const, max_sampling_rounds=3, overlong_buffer=0))
    row = metrics_rows(tmp_path)[0]
    assert calls == [] and row["rollout/sampling_rounds"] == 3.0 and row["rollout/kept_groups"] == 0.0
    assert row["rollout/extra_samples"] == 16.0 and row["rollout/update_fraction"] == 0.0


# ----------------------------------------------------------------------------- the loss


@pytest.fixture()
def scored_rollout():
    """A tiny policy-only model and a scored rollout of 8 responses of different lengths, the policy
    moved away from pi_old so that the ratio and the clip are exercised."""
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = ActorCritic(build_tiny_model(len(tok), seed=2), value_head=None)
    torch.manual_seed(0)
    ro = generate(model.policy, tok, ["Hi", "Write a review", "What is 3 + 4?", "Go"] * 2,
                  SamplingParams(max_new_tokens=8, stop_ids=(2,)))
    ro.response_mask[0, 3:] = 0
    ro.response_mask[5, 5:] = 0
    ro = logprob_pass(model, None, ro, 1.0, micro_batch_size=8)
    ro = dataclasses.replace(ro, advantages=torch.randn(8)[:, None] * ro.response_mask)
    ro = dataclasses.replace(ro, sampler_logprobs=ro.logprobs + 0.5 * torch.randn(ro.logprobs.shape))  # a sampler that differs
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, ro


@pytest.mark.parametrize("level,tis", [("sequence", None), ("sequence-token", None), ("token", 1.5),
                                       ("sequence", 1.5)])
def test_variant_losses_do_not_depend_on_the_micro_batch_split(scored_rollout, level, tis):
    model, ro = scored_rollout
    cfg = build_config(GRPOConfig, {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8,
                                    "micro_batch_size": 1, "dtype": "fp32", "importance_level": level,
                                    "tis_cap": tis, "loss_agg": "seq-mean", "clip_eps": 0.02})
    n_tok = ro.response_mask.sum().item()

    def run(splits):
        model.zero_grad()
        total, clip, start = 0.0, 0.0, 0
        for size in splits:
            loss, st = micro_batch_loss(model, trim_rows(ro, torch.arange(start, start + size)), cfg, n_tok, 8.0,
                                        torch.device("cpu"))
            loss.backward()
            total += loss.item()
            clip += st["policy_clip_frac"]
            start += size
        return total, [p.grad.clone() for p in model.parameters()], clip

    full_loss, full_grad, clip = run([8])
    assert clip > 0, "the test should exercise the clipped branch"
    for splits in ([4, 4], [1, 3, 4], [1] * 8):
        loss, grad, _ = run(splits)
        assert loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7), splits
        for g, f in zip(grad, full_grad):
            torch.testing.assert_close(g, f, rtol=1e-4, atol=1e-6)


def test_truncated_is_weight_scales_the_loss_and_clips_at_the_cap(scored_rollout):
    model, ro = scored_rollout
    base = {"rollout_batch_size": 8, "group_size": 4, "mini_batch_size": 8, "micro_batch_size": 8, "dtype": "fp32"}
    n_tok, dev = ro.response_mask.sum().item(), torch.device("cpu")
    plain, _ = micro_batch_loss(model, ro, build_config(GRPOConfig, base), n_tok, 8.0, dev)
    capped = build_config(GRPOConfig, {**base, "tis_cap": 2.0})
    ro = dataclasses.replace(ro, sampler_logprobs=ro.logprobs - 1.0)  # pi_train / pi_sampler = e on every token: weight min(e, 2) = 2
    loss, st = micro_batch_loss(model, ro, capped, n_tok, 8.0, dev)
    assert loss.item() == pytest.approx(2 * plain.item(), rel=1e-6)
    assert st["is_weight_mean"] == pytest.approx(2.0) and st["is_clip_frac"] == 1.0
    assert st["mismatch_kl"] == pytest.approx(math.e - 2, rel=1e-5)  # k3 at d = 1
    ro = dataclasses.replace(ro, sampler_logprobs=ro.logprobs + 0.1)  # weight e^-0.1 below the cap
    loss, st = micro_batch_loss(model, ro, capped, n_tok, 8.0, dev)
    assert loss.item() == pytest.approx(math.exp(-0.1) * plain.item(), rel=1e-5)
    ro = dataclasses.replace(ro, sampler_logprobs=None)  # HF sampling: the trainer sampled, the weight is exactly 1
    loss, st = micro_batch_loss(model, ro, capped, n_tok, 8.0, dev)
    assert loss.item() == plain.item() and st["is_weight_mean"] == 1.0 and st["mismatch_kl"] == 0.0


def test_tis_with_hf_sampling_changes_nothing_in_a_run(tmp_path, tiny_model_dir):
    rows = {}
    for cap in (None, 2.0):
        out = tmp_path / str(cap)
        out.mkdir()
        train(tiny_cfg(out, tiny_model_dir, tis_cap=cap, lora=False, lr=1e-2, update_epochs=2, max_new_tokens=4,
                       drop_zero_std_groups=False))
        rows[cap] = metrics_rows(out)[0]
    assert rows[2.0]["rollout/is_weight_mean"] == 1.0 and rows[2.0]["rollout/mismatch_kl"] == 0.0
    for key in ("loss/policy", "params/grad_norm", "params/approx_kl", "params/policy_clip_frac"):
        assert rows[2.0][key] == rows[None][key], key


class _FakeVLLM:
    """A vLLM engine stand-in that samples random tokens and reports `logprob(token)` for each."""

    def __init__(self, logprob=lambda token: -3.0):
        self.logprob = logprob
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=SimpleNamespace(load_weights=lambda weights: list(weights))))))

    def generate(self, prompts, sampling_params, use_tqdm=False):
        outs = []
        for sp in sampling_params:
            assert sp.logprobs == 0  # the sampled token's own log-prob is asked for
            ids = torch.randint(3, 300, (sp.max_tokens,), generator=torch.Generator().manual_seed(sp.seed)).tolist()
            lps = [{t: SimpleNamespace(logprob=self.logprob(t))} for t in ids]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason="length",
                                                                 stop_reason=None)]))
        return outs


def test_sampler_logprobs_from_a_vllm_backend_reach_the_correction(tmp_path, tiny_model_dir, monkeypatch):
    import rlhfkit.rollout.backends as backends
    import rlhfkit.trainers.rl as rl

    monkeypatch.setattr(rl, "make_backend",
                        lambda *a, **k: backends.VLLMBackend(_FakeVLLM(lambda t: -5.0 if t % 2 else -7.0),
                                                             lambda **kw: SimpleNamespace(**kw)))
    train(tiny_cfg(tmp_path, tiny_model_dir, tis_cap=1.5, drop_zero_std_groups=False))
    row = metrics_rows(tmp_path)[0]
    assert row["params/ratio_first_microbatch_maxdev"] == 0.0  # the trainer's own pass still sets pi_old
    assert 0.0 < row["rollout/is_clip_frac"] < 1.0 and row["rollout/mismatch_kl"] > 0.0
    assert 0.0 < row["rollout/is_weight_mean"] <= 1.5


def test_vllm_log_probs_table_and_its_temperature():
    from rlhfkit.rollout.backends import VLLMBackend, sampled_logprobs

    outs = [SimpleNamespace(token_ids=[5, 6], logprobs=[{5: SimpleNamespace(logprob=-0.5)},
                                                       {6: SimpleNamespace(logprob=-1.25), 9: SimpleNamespace(logprob=-2)}]),
            SimpleNamespace(token_ids=[7], logprobs=[{7: SimpleNamespace(logprob=-0.1)}])]
    table = sampled_logprobs(outs, 3)
    assert table[0, :2].tolist() == [-0.5, -1.25] and table[1, 0].item() == pytest.approx(-0.1)
    assert torch.isnan(table[0, 2]) and torch.isnan(table[1, 1:]).all()  # none reported: weight 1 there
    assert sampled_logprobs([SimpleNamespace(token_ids=[1], logprobs=None)], 1) is None
    tok = build_tokenizer()
    raw = VLLMBackend(_FakeVLLM(), lambda **kw: SimpleNamespace(**kw), processed_logprobs=False)
    hot = SamplingParams(max_new_tokens=3, temperature=0.7, stop_ids=(2,))
    assert raw.generate(None, tok, ["Hi"], hot, seed=1).sampler_logprobs is None  # raw log-probs are at T = 1
    one = SamplingParams(max_new_tokens=3, temperature=1.0, stop_ids=(2,))
    assert raw.generate(None, tok, ["Hi"], one, seed=1).sampler_logprobs.tolist() == [[-3.0] * 3]


# ----------------------------------------------------------------------------- short runs


@pytest.fixture()
def references_built(patch_everywhere):
    import rlhfkit.models.policy as policy_mod
    import rlhfkit.trainers.grpo  # noqa: F401  (its modules loaded, so the patch reaches their imports)

    built = []
    real = policy_mod.Reference
    patch_everywhere(policy_mod, "Reference", lambda *a, **k: built.append(1) or real(*a, **k))
    return built


def test_gspo_run(tmp_path, tiny_model_dir, references_built):
    train(tiny_cfg(tmp_path, tiny_model_dir, GSPOConfig, max_new_tokens=4, drop_zero_std_groups=False))
    row = metrics_rows(tmp_path)[0]
    assert row["params/ratio_first_microbatch_maxdev"] == 0.0 and "params/seq_ratio_mean" in row
    assert references_built == []  # no KL term: no reference


def test_reinforce_pp_run_with_one_sample_per_prompt(tmp_path, tiny_model_dir, references_built):
    train(tiny_cfg(tmp_path, tiny_model_dir, ReinforcePPConfig, group_size=1, rollout_batch_size=4,
                   mini_batch_size=4, max_new_tokens=4))
    row = metrics_rows(tmp_path)[0]
    assert references_built == [1] and row["rollout/kl"] == 0.0  # the KL penalty needs pi_ref; LoRA starts at it
    assert row["rollout/update_fraction"] == 1.0 and "rollout/group_reward_std" not in row  # G = 1
    assert row["rollout/advantage_abs_mean"] > 0 and "rollout/kl_penalty" in row


def test_remax_run_samples_a_greedy_baseline(tmp_path, tiny_model_dir):
    train(tiny_cfg(tmp_path, tiny_model_dir, advantage="remax", group_size=2, rollout_batch_size=4,
                   mini_batch_size=4, update_epochs=1, max_new_tokens=4))
    assert "rollout/greedy_reward_mean" in metrics_rows(tmp_path)[0]


def test_overlong_filter_in_a_run(tmp_path, tiny_model_dir):
    train(tiny_cfg(tmp_path, tiny_model_dir, overlong_filter=True, drop_zero_std_groups=False, max_new_tokens=4))
    row = metrics_rows(tmp_path)[0]
    assert row["rollout/overlong_filtered"] == pytest.approx(1.0 - row["rollout/stop_fraction"])


# ----------------------------------------------------------------------------- config and CLI


def test_presets_and_their_command_names():
    from rlhfkit.trainers.grpo import command_name

    g, s, d, r = GRPOConfig(), GSPOConfig(), DAPOConfig(), ReinforcePPConfig()
    assert (s.importance_level, s.clip_eps, s.clip_eps_high, s.loss_agg) == ("sequence", 3e-4, 4e-4, "seq-mean")
    assert (d.clip_eps, d.clip_eps_high, d.dynamic_sampling, d.loss_agg, d.overlong_buffer) == (0.2, 0.28, True,
                                                                                                "token-mean", 4)
    assert (r.advantage, r.group_size, r.reward_kl_coef, r.uses_reference) == ("reinforce++", 1, 0.01, True)
    assert (g.importance_level, g.dynamic_sampling, g.tis_cap, g.overlong_buffer, g.uses_reference) == (
        "token", False, None, 0, False)
    assert [command_name(c) for c in (g, s, d, r)] == ["grpo", "gspo", "dapo", "reinforce_pp"]


def test_config_errors():
    with pytest.raises(ConfigError, match=r"reward_kl_coef \(0.1\) applies to advantage=reinforce\+\+"):
        build_config(GRPOConfig, {"reward_kl_coef": 0.1})
    with pytest.raises(ConfigError, match=r"dynamic_sampling keeps groups .* group_size \(1\) must be >= 2"):
        build_config(ReinforcePPConfig, {"dynamic_sampling": True})
    with pytest.raises(ConfigError, match=r"overlong_buffer \(20\) must be in \[0, max_new_tokens=16\]"):
        build_config(DAPOConfig, {"overlong_buffer": 20})
    with pytest.raises(ConfigError, match=r"tis_cap \(0.5\) must be >= 1"):
        build_config(GRPOConfig, {"tis_cap": 0.5})
    with pytest.raises(ConfigError, match=r"group_size \(1\) must be >= 2: a group of one has no baseline"):
        build_config(ReinforcePPConfig, {"advantage": "reinforce++-baseline"})
    with pytest.raises(ConfigError, match="importance_level='seq': expected one of token, sequence, sequence-token"):
        parse_args(GSPOConfig, ["importance_level=seq"], "rlhfkit gspo")


def test_help_of_each_preset_lists_every_field(capsys):
    import dataclasses

    for name, cls in (("gspo", GSPOConfig), ("dapo", DAPOConfig), ("reinforce_pp", ReinforcePPConfig)):
        assert command_main(name)(["--help"]) == 0
        out = capsys.readouterr().out
        for f in dataclasses.fields(cls):
            assert f"  {f.name} (" in out, f.name


def test_keep_rows_keeps_texts_and_sampler_logprobs():
    ro = _rollout([1.0, 2.0, 3.0], [1, 2, 3])
    ro = dataclasses.replace(ro, prompts=["a", "b", "c"], completions=["x", "y", "z"], info={"answer": [1, 2, 3]},
                             sampler_logprobs=torch.arange(12.0).view(3, 4))
    out = keep_rows(ro, torch.tensor([2, 0]))
    assert (out.prompts, out.completions, out.info) == (["c", "a"], ["z", "x"], {"answer": [3, 1]})
    assert out.sampler_logprobs[:, 0].tolist() == [8.0, 0.0]


# ----------------------------------------------------------------------------- the loop is variant-free

VARIANT_OPTIONS = {"advantage", "importance_level", "kl_loss_estimator", "one_step_off_policy"}  # options naming a variant


def variant_branches(source: str, skip: tuple[str, ...] = ("command_name", "rollout_source")) -> list[str]:
    """`if`/conditional-expression tests (and `in` membership tests) in `source`, outside the functions
    `skip`, that read an option naming a variant, a name built from the variants' names (REINFORCE_PP),
    or compare with a variant's name (rlhfkit.core.choices)."""
    import ast

    from rlhfkit.core import choices

    names = set(choices.ADVANTAGES) | set(choices.IMPORTANCE_LEVELS) | set(choices.KL_LOSS_ESTIMATORS)
    tree = ast.parse(source)
    skipped = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in skip for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert, ast.Compare)):
            continue
        test = node if isinstance(node, ast.Compare) else node.test
        for sub in ast.walk(test):
            if ((isinstance(sub, ast.Attribute) and sub.attr in VARIANT_OPTIONS)
                    or (isinstance(sub, ast.Name) and sub.id in ("REINFORCE_PP", "GROUPLESS"))
                    or (isinstance(sub, ast.Constant) and sub.value in names)):
                found.append(f"line {test.lineno}: {ast.unparse(test)}")
                break
    return sorted(set(found))  # a comparison inside an `if` test is seen twice


def test_the_grpo_loop_never_branches_on_a_variant_name():
    """The loop (trainers/grpo.py, grpo_rollout.py, grpo_sources.py) looks each variant up by name once
    and calls it at its phase: no test of the loop reads `advantage`, `importance_level`, ... or a
    variant's name (the functions that turn the config into names may: `command_name`, the run's name,
    and `rollout_source`, the rollout source's)."""
    import inspect

    import rlhfkit.trainers.grpo as grpo
    import rlhfkit.trainers.grpo_rollout as grpo_rollout
    import rlhfkit.trainers.grpo_sources as grpo_sources

    assert {m.__name__: variant_branches(inspect.getsource(m)) for m in (grpo, grpo_rollout, grpo_sources)} == {
        m.__name__: [] for m in (grpo, grpo_rollout, grpo_sources)}
    # the check sees the branches the loop had before the variants were registered
    old = ('def collect(cfg):\n    if cfg.advantage == "remax":\n        pass\n'
           '    if cfg.advantage in REINFORCE_PP:\n        pass\n'
           '    x = ppo if cfg.importance_level == "token" else clipped\n')
    assert len(variant_branches(old)) == 3
