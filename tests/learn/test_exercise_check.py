"""rlhfkit.learn.exercise_check: a right answer passes every exercise, the stub itself fails, and each
exercise's classic bugs fail with their own hint (checked on hand-written learner files, not only on
the checker's built-in variants)."""

from __future__ import annotations

import textwrap

import pytest

from rlhfkit.learn import exercise_check as ec

RIGHT = {
    "gae": """
        import torch
        def gae(rewards, values, mask, gamma, lam):
            B, T = rewards.shape
            adv = torch.zeros(B, T)
            next_v, next_a = torch.zeros(B), torch.zeros(B)
            for t in reversed(range(T)):
                m = mask[:, t]
                a = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * next_a
                adv[:, t] = torch.where(m, a, torch.zeros(()))
                next_v = torch.where(m, values[:, t], torch.zeros(()))
                next_a = torch.where(m, a, torch.zeros(()))
            return adv, torch.where(mask, adv + values, torch.zeros(()))
        """,
    "policy-loss": """
        import torch
        def policy_loss(logp, old_logp, advantages, mask, clip_eps):
            ratio = torch.exp(torch.where(mask, logp - old_logp, torch.zeros(())))
            a = torch.where(mask, advantages, torch.zeros(()))
            l = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip_eps, 1 + clip_eps))
            return (l * mask).sum() / mask.sum()
        """,
    "kl-reward": """
        import torch
        def kl_reward(scores, logp, ref_logp, mask, kl_coef):
            r = torch.where(mask, -kl_coef * (logp - ref_logp), torch.zeros(()))
            last = mask.sum(1) - 1
            r[torch.arange(len(scores)), last] += scores
            return r
        """,
    "group-advantages": """
        def group_advantages(scores, group_size):
            g = scores.view(-1, group_size)
            return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).flatten()
        """,
    "dpo-loss": """
        import torch.nn.functional as F
        def dpo_loss(pc, pr, rc, rr, beta):
            return -F.logsigmoid(beta * ((pc - rc) - (pr - rr)))
        """,
}

# (exercise, replace this in RIGHT, by this, a word of the hint)
BUGS = [
    ("gae", "next_v = torch.where(m, values[:, t], torch.zeros(()))", "next_v = values[:, t]",
     "value after the end must be 0"),
    ("gae", "gamma * lam * next_a", "gamma * next_a", "lambda missing"),
    ("gae", "adv + values, torch", "adv + 0 * values, torch", "R_t = A_t + V(s_t)"),
    ("policy-loss", "torch.maximum(", "torch.minimum(", "min instead of max"),
    ("policy-loss", "ratio.clamp(1 - clip_eps, 1 + clip_eps)", "ratio", "clip is missing"),
    ("policy-loss", "(l * mask).sum() / mask.sum()", "(l * mask).mean()", "number of VALID tokens"),
    ("policy-loss", "torch.exp(torch.where(mask, logp - old_logp, torch.zeros(())))",
     "torch.exp(logp - old_logp)", "mask the log-ratio with torch.where BEFORE exp"),
    ("policy-loss", "ratio = torch.exp(", "ratio = torch.exp(-", "upside down"),
    ("policy-loss", "return (l * mask)", "return (l.detach() * mask)", "no gradient flows"),
    ("kl-reward", "-kl_coef * (logp - ref_logp)", "-kl_coef * (ref_logp - logp)", "wrong sign"),
    ("kl-reward", "last = mask.sum(1) - 1", "last = torch.full_like(mask.sum(1), mask.shape[1] - 1)",
     "last VALID token"),
    ("kl-reward", "torch.where(mask, -kl_coef * (logp - ref_logp), torch.zeros(()))",
     "-kl_coef * (logp - ref_logp)", "0 where mask is False"),
    ("group-advantages", "g.std(1, keepdim=True)", "g.std(1, keepdim=True, unbiased=False)", "G - 1"),
    ("group-advantages", "(g.std(1, keepdim=True) + 1e-6)", "g.std(1, keepdim=True)", "std 0"),
    ("group-advantages", "g = scores.view(-1, group_size)", "g = scores.view(1, -1)", "whole batch"),
    ("dpo-loss", "(pc - rc) - (pr - rr)", "pc - pr", "reference is missing"),
    ("dpo-loss", "(pc - rc) - (pr - rr)", "(pr - rr) - (pc - rc)", "swapped"),
    ("dpo-loss", "-F.logsigmoid(beta * ((pc - rc) - (pr - rr)))",
     "-(beta * ((pc - rc) - (pr - rr))).sigmoid().log()", "logsigmoid"),
    ("dpo-loss", "-F.logsigmoid(beta * ((pc - rc) - (pr - rr)))",
     "-F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()", "one loss per pair"),
]


def _write(tmp_path, name: str, source: str):
    path = tmp_path / f"{name.replace('-', '_')}.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.mark.parametrize("name", sorted(ec.EXERCISES))
def test_a_right_answer_and_rlhfkits_own_function_pass(name, tmp_path):
    ex = ec.EXERCISES[name]
    out, _ = ec.run(name, _write(tmp_path, name, RIGHT[name]))
    assert out.ok and out.cases >= 9, out
    assert ec.check(ex, ex.reference).ok


@pytest.mark.parametrize("name", sorted(ec.EXERCISES))
def test_the_stub_as_shipped_fails_and_says_it_is_not_written(name):
    out, ex = ec.run(name, ec.EXERCISES[name].stub_path)
    assert not out.ok and "NotImplementedError" in out.mismatch and "not written yet" in out.hint


@pytest.mark.parametrize(("name", "old", "new", "hint"), BUGS, ids=[f"{b[0]}:{b[3][:20]}" for b in BUGS])
def test_each_classic_bug_fails_with_its_hint(name, old, new, hint, tmp_path):
    assert old in RIGHT[name]
    out, _ = ec.run(name, _write(tmp_path, name, RIGHT[name].replace(old, new)))
    assert not out.ok
    assert hint in out.hint, (out.mismatch, out.hint)


@pytest.mark.parametrize("name", sorted(ec.EXERCISES))
def test_every_builtin_bug_variant_fails(name):
    ex = ec.EXERCISES[name]
    for bug in ex.bugs:
        out = ec.check(ex, bug.fn)
        assert not out.ok and out.hint == bug.hint, (name, bug.hint, out.hint)


def test_a_wrong_gae_at_the_last_token_names_the_bootstrap(tmp_path):
    # the value after each row's end read as V_0 (torch.roll): already wrong on one token, at t = T-1
    src = RIGHT["gae"].replace("next_v, next_a = torch.zeros(B), torch.zeros(B)",
                               "next_v, next_a = values[:, 0].clone(), torch.zeros(B)")
    out, _ = ec.run("gae", _write(tmp_path, "gae", src))
    assert not out.ok and out.cases == 1 and "t=0" in out.mismatch
    assert "bootstrapping past the last token" in out.hint and "must be 0" in out.hint


def test_the_first_mismatch_is_reported_with_numbers_that_a_learner_can_redo():
    # B=1, T=1, lambda missing cannot show on one token: the first case passes, the second fails
    ex = ec.EXERCISES["gae"]
    out = ec.check(ex, ex.bugs[2].fn)
    assert out.cases == 2 and "B=2, T=6" in out.mismatch and "got" in out.mismatch and "expected" in out.mismatch


def test_tolerance_is_relative_to_the_scale():
    import torch

    want = torch.tensor([1000.0, 0.0])
    assert ec._first_mismatch(want + 0.05, want) is None  # 5e-5 of the scale 1000
    assert ec._first_mismatch(want + torch.tensor([0.0, 0.5]), want)[0] == (1,)
    assert ec._first_mismatch(torch.tensor([1e-3]), torch.tensor([0.0])) is not None  # scale floors at 1: 1e-3 > 1e-4


@pytest.mark.parametrize(("source", "words"), [
    (None, "no such file"),
    ("def gae(:\n", ":1: syntax error"),
    ("import not_a_module_anywhere\n", "importing it raised ModuleNotFoundError"),
    ("def other(): pass\n", "defines no function 'gae'"),
])
def test_a_bad_file_is_one_line(source, words, tmp_path):
    path = tmp_path / "mine.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(ec.BadExerciseFile) as e:
        ec.load_function(path, "gae")
    assert words in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)
