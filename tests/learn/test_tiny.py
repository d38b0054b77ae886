"""The tiny-model run of docs/learn/00-watch-it-learn.md: PPO on a random 2-layer Llama raises the
share of vowels in its answers within seconds."""

from __future__ import annotations

import json

import pytest

from rlhfkit.learn import tiny


def test_vowel_share_counts_a_e_i_o_u_among_all_characters():
    # "aloe": a, o, e of 4 characters = 0.75; "xyz!": none; "": 0 (no division by zero); "Ae": 'A' is not 'a'
    assert tiny.vowel_share(["p"] * 4, ["aloe", "xyz!", "", "Ae"]) == [0.75, 0.0, 0.0, 0.5]


def test_the_tiny_model_learns_vowels_within_ten_iterations(tmp_path, capsys):
    """The command of the page: ten iterations print one line each and the before/after line, and
    the mean reward of the last three iterations is at least 0.15 above the first three's (seen on a
    2-core CPU: 0.107 -> 0.375 for iterations 0 and 9; the random model's answers score about 0.12)."""
    assert tiny.main(["--iterations", "10", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out  # the trainer's one line per iteration, then the table
    lines = out[out.index("iteration  vowel share"):].strip().splitlines()
    scores = [json.loads(row)["rollout/score_mean"]
              for row in (tmp_path / "runs" / "vowels" / "metrics.jsonl").read_text().splitlines()]
    assert len(scores) == 10 and len(lines) == 12
    assert "from 0, as in metrics.jsonl" in lines[0] and "'it 1/10' is iteration 0" in lines[0]
    assert [line.split() for line in lines[1:11]] == [[str(i), f"{s:.3f}"] for i, s in enumerate(scores)]
    assert lines[-1] == f"before {scores[0]:.3f}, after {scores[-1]:.3f}"
    assert 0.05 < sum(scores[:3]) / 3 < 0.2
    assert sum(scores[-3:]) / 3 > sum(scores[:3]) / 3 + 0.15, scores


def test_a_bad_iteration_count_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        tiny.main(["--iterations", "0", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "--iterations: expected an integer >= 1, got 0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_out_naming_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    file = tmp_path / "f.txt"
    file.write_text("keep")
    with pytest.raises(SystemExit) as stop:
        tiny.main(["--out", str(file)])
    assert stop.value.code == 2 and f"--out: expected a folder, got the file {file}" in capsys.readouterr().err
    assert file.read_text() == "keep"
