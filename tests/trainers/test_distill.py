"""`rlhfkit distill` on tiny random Llamas (seconds on CPU): step 0 with teacher = student is exactly 0,
GKD's coins, the off-policy sequences (teacher samples, dataset completions), exact resume, and bad
input (teacher missing or of another vocabulary, options out of range) as one line, exit 2, nothing written."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_resume import assert_same_run, stop_after

from rlhfkit.cli import main as cli_main
from rlhfkit.core.config import build_config
from rlhfkit.runtime.faults import Interrupted
from rlhfkit.trainers.distill import on_policy, train
from rlhfkit.trainers.distill_config import DistillConfig

from tiny_lm import build_tiny_model, build_tokenizer

VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")


def write_inputs(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say thing {i}.", "answer": f"thing {i} is fine"}) + "\n"
                               for i in range(16)))
    rw = tmp_path / "vowels.py"
    rw.write_text(VOWELS)
    return prompts, rw


def tiny_cfg(tmp_path, model_dir, teacher_dir=None, **kw) -> DistillConfig:
    prompts, rw = write_inputs(tmp_path)
    base = dict(model=str(model_dir), teacher=str(teacher_dir or model_dir), prompts=str(prompts),
                reward=f"python:{rw}:reward", iterations=1, rollout_batch_size=8, mini_batch_size=8,
                micro_batch_size=4, max_new_tokens=6, num_eval_prompts=0, dtype="fp32",
                output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False)
    base.update(kw)
    return build_config(DistillConfig, base)


def rows_of(tmp_path, name="t"):
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def other_teacher_dir(tmp_path_factory):
    """A tiny Llama of the same tokenizer with other random weights."""
    path = tmp_path_factory.mktemp("tiny-teacher")
    tok = build_tokenizer()
    build_tiny_model(len(tok), seed=1).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("loss", [{"loss": "reverse-kl"}, {"loss": "jsd", "beta": 0.5},
                                  {"loss": "jsd", "beta": 0.0, "distill_topk": 5},
                                  # bf16: the teacher loads in the student's bf16 base dtype, so equal bits
                                  {"loss": "reverse-kl", "dtype": "bf16"}])
def test_step_zero_with_teacher_equal_to_student_is_exactly_zero(tmp_path, tiny_model_dir, loss):
    train(tiny_cfg(tmp_path, tiny_model_dir, **loss))
    row = rows_of(tmp_path)[0]
    assert row["loss/distill"] == 0.0
    # the sampled-token surrogate's gradient is d * grad log p = 0 exactly; a whole-distribution
    # gradient is p_s - p_t up to the rounding of a softmax's sum
    assert row["params/grad_norm"] == 0.0 if loss["loss"] == "reverse-kl" else row["params/grad_norm"] < 1e-6
    assert row["distill/reverse_kl" if loss["loss"] == "reverse-kl" else "distill/jsd"] == 0.0
    assert row["rollout/on_policy"] == 1.0 and row["params/ratio_first_microbatch_maxdev"] < 1e-5


@pytest.mark.slow
def test_another_teacher_gives_a_positive_divergence_that_training_lowers(tmp_path, tiny_model_dir,
                                                                        other_teacher_dir):
    # the whole-distribution JSD (exact per position, not a one-sample estimate) on the student's samples
    train(tiny_cfg(tmp_path, tiny_model_dir, other_teacher_dir, iterations=6, lora=False, lr=3e-3,
                   warmup_steps=0, mini_batch_size=4, loss="jsd", beta=0.5))
    jsd = [r["distill/jsd"] for r in rows_of(tmp_path)]
    assert jsd[0] > 0
    assert sum(jsd[-2:]) / 2 < 0.8 * jsd[0], jsd


def test_gkd_coins_are_a_pure_function_of_seed_and_iteration():
    coins = [on_policy(3, it, 0.5) for it in range(400)]
    assert coins == [on_policy(3, it, 0.5) for it in range(400)]
    assert 0.4 < sum(coins) / 400 < 0.6
    assert all(on_policy(3, it, 1.0) for it in range(50)) and not any(on_policy(3, it, 0.0) for it in range(50))


@pytest.mark.parametrize("source", ["teacher", "dataset"])
def test_off_policy_sequences(tmp_path, tiny_model_dir, other_teacher_dir, source):
    train(tiny_cfg(tmp_path, tiny_model_dir, other_teacher_dir, loss="jsd", beta=0.0, lmbda=0.0,
                   off_policy_data=source, iterations=2))
    rows = rows_of(tmp_path)
    assert [r["rollout/on_policy"] for r in rows] == [0.0, 0.0]
    assert all(r["distill/jsd"] > 0 and "distill/reverse_kl" not in r for r in rows)
    samples = [json.loads(line) for line in (tmp_path / "runs" / "t" / "samples.jsonl").read_text().splitlines()]
    if source == "dataset":  # the records' answers, cut to max_new_tokens (6 byte tokens, the last one a stop)
        assert all(s["completion"].startswith("thing") for s in samples)


@pytest.mark.slow
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, tiny_model_dir, other_teacher_dir, monkeypatch):
    kw = dict(iterations=4, loss="jsd", lmbda=0.5, lr=1e-2, warmup_steps=2, save_every=0, rollout_batch_size=4,
              mini_batch_size=4, micro_batch_size=2)
    train(tiny_cfg(tmp_path, tiny_model_dir, other_teacher_dir, run_name="straight", **kw))
    cut = tiny_cfg(tmp_path, tiny_model_dir, other_teacher_dir, run_name="cut", **kw)
    with monkeypatch.context() as m:
        stop_after(m, 1)
        with pytest.raises(Interrupted):
            train(cut)
    train(dataclasses.replace(cut, resume=str(tmp_path / "runs" / "cut")))
    assert_same_run(tmp_path / "runs" / "straight", tmp_path / "runs" / "cut")


# ----------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-other-vocab")
    tok = build_tokenizer()
    tok.add_tokens(["<extra-token>"])
    build_tiny_model(len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("args, message", [
    (["teacher=OTHER"], "vocabulary (321 tokens) differs from the student's (320 tokens)"),
    (["teacher=MISSING"], "teacher: model '"),
    (["lmbda=nan"], "lmbda='nan': expected float (a finite number)"),
    (["beta=inf"], "beta='inf': expected float (a finite number)"),
    (["loss=jsd", "lmbda=1.5"], "lmbda (1.5) must be in [0, 1]"),
    (["loss=jsd", "beta=-0.1"], "beta (-0.1) must be in [0, 1]"),
    (["loss=jsd", "distill_topk=0"], "distill_topk (0) must be >= 1 or None"),
    (["lmbda=0.5"], "lmbda (0.5) must be 1 with loss=reverse-kl"),
    (["teacher="], "teacher is required"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, tiny_model_dir, other_vocab_dir, capsys,
                                                          args, message):
    prompts, rw = write_inputs(tmp_path)
    out = tmp_path / "runs"
    where = {"OTHER": str(other_vocab_dir), "MISSING": str(tmp_path / "no-such-model")}
    args = [a.split("=")[0] + "=" + where.get(a.split("=", 1)[1], a.split("=", 1)[1]) for a in args]
    argv = ["distill", f"model={tiny_model_dir}", f"teacher={tiny_model_dir}", f"prompts={prompts}",
            f"reward=python:{rw}:reward", "iterations=1", "rollout_batch_size=4", "mini_batch_size=4",
            "micro_batch_size=2", "max_new_tokens=4", "num_eval_prompts=0", "dtype=fp32", "quiet=true",
            "tensorboard=false", f"output_dir={out}", *args]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlhfkit:")]  # (progress bars of loading aside)
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("rlhfkit: error: ") and message in lines[0], err
    assert not out.exists() or not any(out.iterdir())


# ----------------------------------------------------------------------------- GRPO's distillation term


def grpo_rows(tmp_path, name):
    return rows_of(tmp_path, name)


def test_grpo_with_a_teacher_equal_to_the_policy_adds_exactly_nothing(tmp_path, tiny_model_dir):
    """The term's value and gradient are exactly 0: the same samples, losses and gradient norms as
    without it, with loss/distill and distill/reverse_kl logged apart at 0."""
    from test_grpo import tiny_cfg as grpo_cfg

    from rlhfkit.trainers.grpo import train as grpo_train

    grpo_train(grpo_cfg(tmp_path, tiny_model_dir, run_name="plain", drop_zero_std_groups=False))
    grpo_train(grpo_cfg(tmp_path, tiny_model_dir, run_name="term", drop_zero_std_groups=False,
                        teacher=str(tiny_model_dir), distill_coef=0.5))
    plain, term = grpo_rows(tmp_path, "plain")[0], grpo_rows(tmp_path, "term")[0]
    assert term["loss/distill"] == 0.0 and term["distill/reverse_kl"] == 0.0
    for key in ("rollout/score_mean", "loss/policy", "loss/total", "params/grad_norm"):
        assert term[key] == plain[key], key


def test_grpo_distill_term_is_logged_apart_and_added_with_its_coefficient(tmp_path, tiny_model_dir,
                                                                          other_teacher_dir):
    from test_grpo import tiny_cfg as grpo_cfg

    from rlhfkit.trainers.grpo import train as grpo_train

    grpo_train(grpo_cfg(tmp_path, tiny_model_dir, drop_zero_std_groups=False, teacher=str(other_teacher_dir),
                        distill_coef=0.5, update_epochs=1, mini_batch_size=8))
    row = grpo_rows(tmp_path, "t")[0]
    assert row["loss/distill"] != 0.0
    # one epoch of one optimiser step, on-policy: the term's value is the k1 mean of the scoring pass
    # over the same tokens (token-mean aggregation)
    assert row["loss/distill"] == pytest.approx(row["distill/reverse_kl"], rel=1e-4, abs=1e-6)
    assert row["loss/total"] == pytest.approx(row["loss/policy"] + 0.5 * row["loss/distill"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("args, message", [
    (["distill_coef=0.1"], "distill_coef (0.1) needs a teacher: teacher=MODEL"),
    (["teacher=SELF"], "is used only with distill_coef > 0"),
    (["teacher=OTHER", "distill_coef=0.1"], "vocabulary (321 tokens) differs from the student's (320 tokens)"),
    (["distill_coef=-1"], "distill_coef (-1.0) must be >= 0"),
])
def test_grpo_distill_bad_input(tmp_path, tiny_model_dir, other_vocab_dir, capsys, args, message):
    out = tmp_path / "runs"
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"Say {i}." for i in range(8)))
    where = {"OTHER": str(other_vocab_dir), "SELF": str(tiny_model_dir)}
    args = [a.split("=")[0] + "=" + where.get(a.split("=", 1)[1], a.split("=", 1)[1]) for a in args]
    argv = ["grpo", f"model={tiny_model_dir}", f"prompts={prompts}", "reward=length:3", "iterations=1",
            "rollout_batch_size=4", "group_size=2", "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=4",
            "num_eval_prompts=0", "dtype=fp32", "quiet=true", "tensorboard=false", f"output_dir={out}",
            "warmup_steps=1", *args]  # a warm-up longer than the run's 2 steps would warn before the error
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlhfkit:")]
    assert "Traceback" not in err and len(lines) == 1 and message in lines[0], err
    assert not out.exists() or not any(out.iterdir())
