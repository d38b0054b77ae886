"""`rlhfkit selfcheck`: the worked examples pass on this code, print their numbers, and each check
fails (exit status 1) when the maths it shows is broken."""

from __future__ import annotations

import pytest

from rlhfkit import algos
from rlhfkit.cli import main as cli_main
from rlhfkit.commands import selfcheck
from rlhfkit.models import policy


def test_every_check_passes_and_prints_the_hand_worked_numbers(capsys):
    assert selfcheck.main([]) == 0
    out = capsys.readouterr().out
    # GAE: delta = (1.25, 0.2, -1.0), A_1 = 0.2 + 0.9*0.95*(-1.0), A_0 = 1.25 + 0.855*(-0.655)
    for number in ("1.250000", "0.689975", "-0.655000", "2.689975", "1.845000"):
        assert number in out
    assert "0.620000" in out and "2.620000" in out  # lambda 1: G_0 = 1 + 0.81*2, A_0 = 2.62 - 2.0
    assert "1.676859" in out  # bootstrap: 1.25 + 0.855*(0.2 + 0.855*(2 + 0.9*1.5 - 3))
    assert "0.277259" in out and "0.240227" in out  # KL = 0.6 ln 2 - 0.1 ln 4; E[k2] = 0.3 ln^2 2 + 0.2 ln^2 2
    assert "-0.183333" in out and "0.216667" in out  # clip: -1.1/6 and 1.3/6
    assert "6 of 6 checks passed" in out and "FAIL" not in out and "MISMATCH" not in out


def _gae_ignoring(arg: str):
    real = algos.gae

    def broken(rewards, values, mask, gamma, lam, bootstrap_value=None, chunk_size=32):
        if arg == "lam":
            lam = 1.0
        if arg == "bootstrap":
            bootstrap_value = None
        return real(rewards, values, mask, gamma, lam, bootstrap_value, chunk_size)

    return broken


def _unclipped_policy_loss(*args, **kwargs):
    return _REAL_POLICY_LOSS(*args, **{**kwargs, "clip_eps": 10.0})


_REAL_POLICY_LOSS = algos.ppo_policy_loss


def _hidden_off_by_one(decoder, input_ids, attention_mask, num_response, *args, **kwargs):
    """The classic bug: keep the last R positions, each of which has already seen its own token."""
    pos = policy.position_ids_from_mask(attention_mask)
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False)
    return out.last_hidden_state[:, -num_response:]


BROKEN = {
    "gae": ("gae", _gae_ignoring("lam")),
    "gae-limits": ("gae_reference", lambda r, v, m, g, lam, bootstrap_value=None: algos.gae(r, v, m, g, 0.5)),
    "bootstrap": ("gae", _gae_ignoring("bootstrap")),
    "clip": ("ppo_policy_loss", _unclipped_policy_loss),
    "kl": ("kl_k3", algos.kl_k2),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_check_fails_when_its_maths_is_broken(name, monkeypatch, capsys):
    attr, broken = BROKEN[name]
    assert selfcheck.main([name]) == 0
    monkeypatch.setattr(algos, attr, broken)
    assert selfcheck.main([name]) == 1
    out = capsys.readouterr().out
    assert f"{name}: " in out and "FAIL" in out and "MISMATCH" in out and f"failed: {name}" in out


def test_the_offset_check_catches_an_off_by_one_logits_slice(monkeypatch, capsys):
    monkeypatch.setattr(policy, "response_hidden_states", _hidden_off_by_one)
    assert selfcheck.main(["offset"]) == 1
    out = capsys.readouterr().out
    assert "with the slice [P-1 : P+R-1]" in out and "MISMATCH" in out


def test_a_check_that_raises_counts_as_failed(monkeypatch, capsys):
    def boom(*a, **k):
        raise RuntimeError("broken install")

    monkeypatch.setattr(algos, "kl_k1", boom)
    assert selfcheck.main(["kl"]) == 1
    assert "raised RuntimeError: broken install" in capsys.readouterr().out


def test_the_command_line(capsys):
    assert cli_main(["selfcheck", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{name}:" in listed for name in selfcheck.CHECKS)
    assert cli_main(["selfcheck", "clip", "kl"]) == 0
    assert "2 of 2 checks passed" in capsys.readouterr().out
    assert cli_main(["selfcheck", "gea"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlhfkit: error: selfcheck: unknown check 'gea'") and "\n" not in err



# ----------------------------------------------------------------------------- --break


def test_every_break_shows_its_symptom_and_the_doctors_finding(capsys):
    from rlhfkit.learn.breaks import BREAKS

    argv = [a for name in BREAKS for a in ("--break", name)]
    assert cli_main(["selfcheck", *argv]) == 0
    out = capsys.readouterr().out
    assert f"{len(BREAKS)} of {len(BREAKS)} breaks showed their symptom" in out and "FAIL" not in out
    # off-by-one: every token scored by the position that has seen it; the doctor's finding on the logged value
    assert "broken: 1.000   (slice [P : P+R])" in out
    assert out.count("doctor: CRITICAL ratio_first_microbatch @ it 0") == 3  # off-by-one, temperature, dropout
    assert "doctor: CRITICAL approx_kl_high @ it 0: approx KL of one update is 44.5" in out  # no whitening
    # unmasked GAE, by hand: A_0 = 0.2 + 0.95 * (5.4 - 0.95 * 4.75) = 1.043125 instead of 0.58
    assert "1.043125" in out and "0.580000" in out
    # k1 as a loss: the policy runs to the rewarded token, KL 1.17 against the optimum's 0.4495
    assert "1.170305" in out and "0.449550" in out


def test_a_break_fails_when_its_symptom_does_not_show(monkeypatch, capsys):
    """With k1 swapped for k2 the 'k1 as a loss' break reaches the optimum: no symptom, exit status 1."""
    monkeypatch.setattr(algos, "kl_k1", algos.kl_k2)
    assert selfcheck.main(["--break", "k1-loss"]) == 1
    assert "failed: k1-loss" in capsys.readouterr().out


def test_the_break_command_line(capsys):
    assert cli_main(["selfcheck", "--list"]) == 0
    assert "breaks (--break NAME):\noff-by-one:" in capsys.readouterr().out
    assert cli_main(["selfcheck", "--break", "off-by-two"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlhfkit: error: selfcheck: unknown break 'off-by-two' (expected one of: off-by-one") and "\n" not in err
    assert cli_main(["selfcheck", "gae", "--break", "k1-loss"]) == 2
    assert "not both" in capsys.readouterr().err


def test_exercise_passes_a_right_gae_and_fails_a_wrong_one_with_the_hint(tmp_path, capsys):
    right = tmp_path / "gae_right.py"
    right.write_text("from rlhfkit import algos\n\ndef gae(r, v, m, gamma, lam):\n"
                     "    return algos.gae_reference(r, v, m, gamma, lam)\n")
    assert selfcheck.main(["--exercise", "gae", str(right)]) == 0
    assert "PASS: 12 random cases" in capsys.readouterr().out
    wrong = tmp_path / "gae_wrong.py"  # the value after the end taken from the padding
    wrong.write_text("import torch\n\ndef gae(r, v, m, gamma, lam):\n    B, T = r.shape\n"
                     "    adv = torch.zeros(B, T)\n    a = torch.zeros(B)\n    for t in reversed(range(T)):\n"
                     "        nv = v[:, t + 1] if t + 1 < T else torch.zeros(B)\n"
                     "        a = torch.where(m[:, t], r[:, t] + gamma * nv - v[:, t] + gamma * lam * a, a)\n"
                     "        adv[:, t] = torch.where(m[:, t], a, torch.zeros(()))\n"
                     "    return adv, torch.where(m, adv + v, torch.zeros(()))\n")
    assert selfcheck.main(["--exercise", "gae", str(wrong)]) == 1
    out = capsys.readouterr().out
    assert "FAIL at case 2" in out and "advantages at row 1" in out
    assert "hint: bootstrapping past the last token" in out and "must be 0" in out


def test_exercise_with_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli_main(["selfcheck", "--exercise", "gae", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.py: no such file" in err
    assert cli_main(["selfcheck", "--exercise", "nope", str(tmp_path / "missing.py")]) == 2
    assert "unknown exercise 'nope'" in capsys.readouterr().err
    assert cli_main(["selfcheck", "gae", "--exercise", "gae", str(tmp_path / "x.py")]) == 2


def test_list_names_the_exercises_and_their_stubs(capsys):
    assert selfcheck.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("gae", "policy-loss", "kl-reward", "group-advantages", "dpo-loss"):
        assert f"\n{name}: " in out
    assert "exercises/gae.py" in out
