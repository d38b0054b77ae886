"""TRL's value-bearing options (core/trl_values.py) and the options a TRL user reaches for: one test each."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.kto_config import KTOConfig
from rlhfkit.trainers.sft_config import SFTConfig


def _cli(cls, *argv):
    return parse_args(cls, list(argv), "rlhfkit x")


def _problem(cls, *argv) -> str:
    with pytest.raises(ConfigError) as e:
        _cli(cls, *argv)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------- max_length (DPO, KTO; SFT/RM have it)


def test_max_length_caps_prompt_plus_response(tiny_tokenizer):
    from rlhfkit.trainers.pairs import encode_pairs, response_budget

    cfg = DPOConfig(max_length=10)
    assert response_budget(6, cfg) == 4  # 10 - 6
    assert response_budget(9, cfg) == 1  # at least one response token
    assert response_budget(2, DPOConfig(max_length=500)) == 128  # max_response_length still caps it
    assert response_budget(6, DPOConfig()) == 128  # None: no limit beyond the two
    assert KTOConfig(max_length=64).max_length == 64 and SFTConfig(max_length=64).max_length == 64
    pairs = [{"prompt": "Write a long review of the film.", "chosen": "It was great " * 20, "rejected": "Bad " * 30}]
    prompt = int(encode_pairs(tiny_tokenizer, pairs, DPOConfig()).query_mask.sum(1)[0])
    ro = encode_pairs(tiny_tokenizer, pairs, DPOConfig(max_length=prompt + 5))
    totals = (ro.query_mask.sum(1) + ro.response_mask.sum(1)).tolist()
    assert totals == [prompt + 5, prompt + 5]  # both long responses cut to the 5 tokens the prompt leaves
    with pytest.raises(ConfigError, match=r"max_length \(1\) must be >= 2"):
        DPOConfig(max_length=1)


# ---------------------------------------------------------------- logging_steps


def test_logging_steps_shows_every_nth_and_keeps_every_row(tmp_path):
    from rlhfkit.runtime.tracker import Tracker, logging_due

    assert [i for i in range(7) if logging_due(i, 3, 7)] == [0, 2, 5, 6]  # first, 3rd, 6th (1-based), last
    assert all(logging_due(i, 1, 7) for i in range(7))

    class Sink:
        seen: list[int] = []

        def log(self, step, metrics):
            self.seen.append(step)

        def close(self):
            pass

    tracker = Tracker(tmp_path, 5, quiet=True, tensorboard=False, logging_steps=2)
    tracker.sinks = [Sink()]
    for i in range(5):
        tracker.log(i, {"loss/x": float(i)})
    assert Sink.seen == [0, 1, 3, 4]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 5
    assert _cli(SFTConfig, "logging_steps=10").logging_steps == 10
    assert "logging_steps (0) must be >= 1" in _problem(SFTConfig, "logging_steps=0")


# ---------------------------------------------------------------- report_to


def test_report_to(tmp_path):
    cfg = _cli(GRPOConfig, "report_to=none")
    assert (cfg.tensorboard, cfg.wandb) == (False, False)
    cfg = _cli(GRPOConfig, "report_to=[tensorboard,wandb]")
    assert (cfg.tensorboard, cfg.wandb) == (True, True)
    cfg = _cli(SFTConfig, "--report_to", "tensorboard")
    assert (cfg.tensorboard, cfg.wandb) == (True, False)
    (tmp_path / "c.yaml").write_text("report_to: [wandb]\n")
    cfg = _cli(DPOConfig, str(tmp_path / "c.yaml"))
    assert (cfg.tensorboard, cfg.wandb) == (False, True)
    assert build_config(SFTConfig, {"report_to": ["tensorboard"]}).tensorboard is True
    assert _problem(SFTConfig, "report_to=mlflow") == (
        "command line: report_to='mlflow': rlhfkit writes to tensorboard and wandb (or none); mlflow is not "
        "offered (metrics.jsonl in the run folder has every metric)")


def test_report_to_wandb_without_wandb_is_one_line(monkeypatch, tmp_path):
    import builtins

    from rlhfkit.diagnostics.sinks import make_sinks
    from rlhfkit.errors import UserError

    real = builtins.__import__

    def no_wandb(name, *a, **k):
        if name == "wandb":
            raise ImportError("no wandb")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(UserError, match=r"^W&B logging was asked for but 'wandb' is not installed: pip install"):
        make_sinks(tmp_path, tensorboard=False, wandb=True)


# ---------------------------------------------------------------- eval_strategy / eval_steps, save_strategy


def test_eval_strategy_and_eval_steps():
    assert _cli(SFTConfig, "eval_strategy=steps", "eval_steps=5").eval_every == 5
    assert _cli(SFTConfig, "eval_strategy=no", "eval_every=3").eval_every == 0
    assert _cli(GRPOConfig, "eval_strategy=no").num_eval_prompts == 0
    assert _cli(DPOConfig, "eval_strategy=no").num_eval_prompts == 0
    assert "eval_strategy=steps needs eval_steps=N" in _problem(SFTConfig, "eval_strategy=steps")
    assert "evaluation by epoch is not offered" in _problem(SFTConfig, "eval_strategy=epoch")
    assert "evaluates before and after training only" in _problem(GRPOConfig, "eval_strategy=steps")


def test_save_strategy():
    assert _cli(SFTConfig, "save_strategy=no").save_every == 0
    assert _cli(GRPOConfig, "save_strategy=steps", "save_steps=4").save_every == 4
    assert "save_strategy='epoch'" in _problem(SFTConfig, "save_strategy=epoch")


# ---------------------------------------------------------------- optim


def test_optim_names():
    from transformers import Adafactor

    from rlhfkit.runtime.optim import make_optimizer

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, 0.25])
    opt, sched = make_optimizer([p], lr=0.1, warmup_steps=0, optim="sgd")
    opt.step()
    assert p.detach().tolist() == pytest.approx([1.0 - 0.1 * 0.5, -2.0 - 0.1 * 0.25], rel=1e-6)  # plain SGD
    assert isinstance(make_optimizer([p], 0.1, 0, optim="adafactor")[0], Adafactor)
    fused = make_optimizer([p], 0.1, 0, optim="adamw_torch_fused")[0]
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"] is True
    assert _cli(SFTConfig, "optim=adafactor").optim == "adafactor"
    assert "optim='lion': expected one of adamw_torch, adamw_torch_fused, sgd, adafactor" in _problem(
        SFTConfig, "optim=lion")


# ---------------------------------------------------------------- push_to_hub, trust_remote_code, attention


def test_push_to_hub_says_what_to_do():
    msg = _problem(SFTConfig, "push_to_hub=true", "hub_model_id=me/model")
    assert msg == ("command line: push_to_hub: rlhfkit does not upload while training; afterwards run `rlhfkit "
                   "export RUN_DIR OUT` and `hf upload HUB_MODEL_ID OUT` on a machine that reaches the Hub")
    assert _cli(SFTConfig, "push_to_hub=false", "hub_model_id=me/model").lr > 0  # TRL does nothing with it either


def test_trust_remote_code_and_attn_implementation():
    assert _cli(SFTConfig, "trust_remote_code=false", "attn_implementation=sdpa").lr > 0
    assert "never a model folder's own Python code" in _problem(SFTConfig, "trust_remote_code=true")
    assert "sdpa is the one value taken" in _problem(GRPOConfig, "attn_implementation=flash_attention_2")


def test_dtype_words():
    assert _cli(SFTConfig, "dtype=float32").dtype == "fp32"
    assert _cli(SFTConfig, "torch_dtype=float32").dtype == "fp32"
    assert build_config(SFTConfig, {"torch_dtype": "bfloat16"}).dtype == "bf16"
    assert "fp16 is not offered" in _problem(SFTConfig, "dtype=float16")


# ---------------------------------------------------------------- GRPO loss_type and scale_rewards


@pytest.mark.parametrize(("trl", "agg"), [("grpo", "seq-mean"), ("dapo", "token-mean"), ("bnpo", "token-mean"),
                                          ("dr_grpo", "constant")])
def test_grpo_loss_type_is_loss_agg(trl, agg):
    assert _cli(GRPOConfig, f"loss_type={trl}").loss_agg == agg


def test_grpo_loss_type_not_offered():
    assert "rlhfkit offers TRL's grpo, dapo, bnpo, dr_grpo" in _problem(GRPOConfig, "loss_type=cispo")


def test_scale_rewards_values():
    assert [_cli(GRPOConfig, f"scale_rewards={v}").scale_rewards for v in ("group", "batch", "none", "true", "false")] \
        == ["group", "batch", "none", "group", "none"]
    assert build_config(GRPOConfig, {"scale_rewards": False}).scale_rewards == "none"  # a config.yaml of before
    assert "scale_rewards='rank'" in _problem(GRPOConfig, "scale_rewards=rank")


def test_batch_scaled_advantages_golden():
    from rlhfkit.algos.advantages import group_advantages
    from rlhfkit.trainers.grpo_variants import batch_scaled

    scores = torch.tensor([1.0, 2.0, 3.0, 6.0])  # two groups of 2
    centred = group_advantages(scores, 2, scale_by_std=False)  # [-0.5, 0.5, -1.5, 1.5]
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 3)  # unbiased std of all 4 = sqrt(14/3)
    want = [c / (std + 1e-6) for c in (-0.5, 0.5, -1.5, 1.5)]
    assert batch_scaled(centred, scores).tolist() == pytest.approx(want, rel=1e-6)


# ---------------------------------------------------------------- lora_target_modules=all-linear


def test_all_linear_targets(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.lora import check_lora_targets

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    got = check_lora_targets(model, ["all-linear"])
    assert got == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert "lm_head" not in got
    assert _cli(SFTConfig, "lora_target_modules=all-linear").lora_target_modules == ["all-linear"]


# ---------------------------------------------------------------- DPO hinge, robust (rDPO), rpo_alpha


def test_hinge_and_robust_golden():
    from rlhfkit.algos import dpo_loss

    # beta h = 0.1 * 10 = 1: h = (pc - rc) - (pr - rr) = 10
    pc, pr, rc, rr = torch.tensor([-5.0]), torch.tensor([-15.0]), torch.tensor([0.0]), torch.tensor([0.0])
    assert dpo_loss(pc, pr, rc, rr, 0.1, "hinge")[0].item() == pytest.approx(0.0, abs=1e-7)
    assert dpo_loss(pc, pr, rc, rr, 0.05, "hinge")[0].item() == pytest.approx(0.5, rel=1e-6)  # relu(1 - 0.5)
    sp_neg, sp_pos = math.log1p(math.exp(-1.0)), math.log1p(math.exp(1.0))  # -log sigma(1), -log sigma(-1)
    robust = (0.9 * sp_neg - 0.1 * sp_pos) / 0.8
    cdpo = 0.9 * sp_neg + 0.1 * sp_pos  # the original cDPO adds the flipped term
    assert dpo_loss(pc, pr, rc, rr, 0.1, "robust", 0.1)[0].item() == pytest.approx(robust, rel=1e-6)
    assert dpo_loss(pc, pr, rc, rr, 0.1, "sigmoid", 0.1)[0].item() == pytest.approx(cdpo, rel=1e-6)
    cfg = _cli(DPOConfig, "loss_type=robust")
    assert cfg.smoothing == 0.1 and _cli(DPOConfig, "loss_type=hinge").smoothing == 0.0
    assert "applies to sigmoid/cdpo/robust, not hinge" in _problem(DPOConfig, "loss_type=hinge", "label_smoothing=0.1")


def test_rpo_alpha_adds_the_chosen_nll_per_token():
    from rlhfkit.trainers.pair_losses import pair_batch_loss

    cfg = DPOConfig(rpo_alpha=0.5)
    logps = torch.tensor([-4.0, -9.0, -6.0, -3.0])  # chosen x 2, rejected x 2
    ref = torch.tensor([-5.0, -8.0, -6.0, -4.0])
    lengths = torch.tensor([2.0, 3.0, 4.0, 1.0])
    base, _ = pair_batch_loss(logps, ref, lengths, cfg, 2.0)
    with_rpo, m = pair_batch_loss(logps, ref, lengths, cfg, 2.0, cfg.rpo_alpha)
    nll = [4.0 / 2.0, 9.0 / 3.0]  # the chosen responses' NLL per token
    assert (with_rpo - base).item() == pytest.approx(0.5 * sum(nll) / 2.0, rel=1e-6)
    assert m["loss/chosen_nll"] == pytest.approx(sum(nll) / 2, rel=1e-6)
    assert "rpo_alpha (-1.0) must be >= 0" in _problem(DPOConfig, "rpo_alpha=-1")


def test_help_lists_the_new_options(capsys):
    assert _cli(DPOConfig, "--help") is None
    out = capsys.readouterr().out
    for name in ("max_length", "rpo_alpha", "optim", "logging_steps", "robust", "hinge"):
        assert name in out
    json.dumps(out)
