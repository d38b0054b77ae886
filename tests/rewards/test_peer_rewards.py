"""Reward code written for verl and OpenRLHF runs unchanged: verl's per-sample compute_score on verl's parquet
layout, OpenRLHF's batched reward_func, each known by its signature (python:) or named (verl:, openrlhf:)."""

from __future__ import annotations

import textwrap

import pytest

from rlhfkit.data.prompts import info_columns, info_lists, load_prompts, reward_inputs
from rlhfkit.errors import UserError
from rlhfkit.rewards import check_reward_call, get_reward, get_rewards, score_parts

# verl's documented custom reward function shape (docs: "custom_reward_function"): per sample, keywords.
VERL_FILE = textwrap.dedent('''
    import re


    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        """1 when the last number of the solution is the ground truth; 0.1 for a '####' line that is wrong."""
        numbers = re.findall(r"-?\\d+", solution_str)
        if numbers and numbers[-1] == str(ground_truth):
            return 1.0
        return 0.1 if "####" in solution_str else 0.0


    def length_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": len(solution_str) / 100, "acc": False, "source": data_source,
                "index": (extra_info or {}).get("index")}


    def gsm8k_style(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
        match = re.search(r"#### (\\-?[0-9\\.\\,]+)", solution_str)
        if match is None:
            return 0.0
        return score if match.group(1) == ground_truth else format_score
''')

# OpenRLHF's documented reward_func shape (README, "custom reward function"): batched, queries = prompt + response.
OPENRLHF_FILE = textwrap.dedent('''
    import torch


    def reward_func(queries, prompts, labels):
        rewards = []
        for query, prompt, label in zip(queries, prompts, labels):
            response = query[len(prompt):]
            rewards.append(1.0 if str(label) in response else 0.0)
        reward = torch.tensor(rewards)
        return {"rewards": reward, "scores": reward, "extra_logs": {"accuracy": reward.mean().item()}}


    def plain_tensor(queries, prompts, labels):
        return torch.tensor([-len(q) / 100.0 for q in queries])
''')


@pytest.fixture()
def peer_files(tmp_path):
    (tmp_path / "verl_reward.py").write_text(VERL_FILE)
    (tmp_path / "openrlhf_reward.py").write_text(OPENRLHF_FILE)
    return tmp_path


@pytest.fixture()
def verl_parquet(tmp_path):
    """A file in verl's layout (examples/data_preprocess/gsm8k.py): data_source, prompt as messages, ability,
    reward_model {style, ground_truth}, extra_info {split, index, ...}."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"What is {i} + {i}? Let's think step by step and output the "
                                                    "final answer after \"####\"."}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"split": "train", "index": i, "answer": f"#### {2 * i}", "question": f"{i} + {i}"}}
            for i in range(6)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _score(fn, records, completions):
    """Score as the trainers do (rollout/score.py): TRL's prompt/completion shapes, the records' columns."""
    return score_parts(fn, *reward_inputs(records, completions), info_lists(records))


# ----------------------------------------------------------------------------- verl


def test_verl_parquet_is_read_as_it_is(verl_parquet):
    records = load_prompts(str(verl_parquet))
    assert len(records) == 6
    first = next(r for r in records if r["extra_info"]["index"] == 3)
    assert first["prompt"].startswith("What is 3 + 3?") and first["messages"][0]["role"] == "user"
    assert first["reward_model"] == {"style": "rule", "ground_truth": "6"} and first["data_source"] == "openai/gsm8k"
    assert {"reward_model", "extra_info", "data_source", "ability"} <= set(info_columns(records))


@pytest.mark.parametrize("spec", ["verl:{d}/verl_reward.py", "verl:{d}/verl_reward.py:compute_score",
                                  "python:{d}/verl_reward.py:compute_score"])
def test_verl_compute_score_runs_unchanged(spec, peer_files, verl_parquet):
    records = sorted(load_prompts(str(verl_parquet)), key=lambda r: r["extra_info"]["index"])[:3]  # 0+0, 1+1, 2+2
    fn = get_rewards(spec.format(d=peer_files))
    check_reward_call(fn, info_columns(records))
    scores, _ = _score(fn, records, ["so #### 0", "it is 3\n#### 3", "four"])
    assert scores == [1.0, 0.1, 0.0]  # right; wrong with '####'; no number


def test_verl_dict_results_extra_info_and_data_source(peer_files, verl_parquet):
    records = sorted(load_prompts(str(verl_parquet)), key=lambda r: r["extra_info"]["index"])[:2]
    fn = get_reward(f"verl:{peer_files}/verl_reward.py:length_score")
    assert _score(fn, records, ["x" * 25, "y" * 50])[0] == [0.25, 0.5]


def test_verl_function_without_data_source_gets_only_what_it_takes(peer_files):
    """verl's built-in gsm8k scorer has no data_source/extra_info: it is called with what it names."""
    fn = get_reward(f"verl:{peer_files}/verl_reward.py:gsm8k_style")
    assert fn(["q", "q"], ["#### 12", "#### 13"], answer=["12", "12"]) == [1.0, 0.0]  # ground truth from `answer`
    assert fn(["q"], ["#### 7"], ground_truth=["7"]) == [1.0]


def test_verl_without_a_ground_truth_is_refused_before_a_model_loads(peer_files):
    fn = get_rewards(f"verl:{peer_files}/verl_reward.py")
    with pytest.raises(UserError, match=r"verl's compute_score needs a ground truth: a reward_model.ground_truth, "
                                        r"ground_truth or answer column"):
        check_reward_call(fn, ["topic"])


def test_verl_function_that_cannot_take_the_call(tmp_path):
    (tmp_path / "f.py").write_text("def compute_score(text, truth):\n    return 0.0\n")
    with pytest.raises(UserError, match=r"verl's compute_score takes solution_str and ground_truth as keywords; "
                                        r"this function's signature is \(text, truth\)"):
        get_reward(f"verl:{tmp_path}/f.py")


# ----------------------------------------------------------------------------- OpenRLHF


@pytest.mark.parametrize("spec", ["openrlhf:{d}/openrlhf_reward.py", "python:{d}/openrlhf_reward.py:reward_func"])
def test_openrlhf_reward_func_runs_unchanged(spec, peer_files):
    records = [{"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]
    fn = get_rewards(spec.format(d=peer_files))
    assert _score(fn, records, ["4", "7"])[0] == [1.0, 0.0]


def test_openrlhf_queries_are_prompt_then_response_and_a_tensor_is_taken(peer_files):
    records = [{"prompt": "abc", "label": "x"}, {"prompt": "abcdefgh", "label": "y"}]
    fn = get_reward(f"openrlhf:{peer_files}/openrlhf_reward.py:plain_tensor")
    assert _score(fn, records, ["12345", "1234567890"])[0] == pytest.approx([-0.08, -0.18])


def test_openrlhf_label_key_and_a_conversational_prompt(peer_files):
    records = [{"messages": [{"role": "user", "content": "name a colour"}], "prompt": "name a colour",
                "target": "red"}]
    fn = get_rewards(f"openrlhf:{peer_files}/openrlhf_reward.py", options={"reward_label_key": "target"})
    check_reward_call(fn, info_columns(records))
    assert _score(fn, records, ["red, surely"])[0] == [1.0]
    bad = get_rewards(f"openrlhf:{peer_files}/openrlhf_reward.py", options={"reward_label_key": "colour"})
    with pytest.raises(UserError, match=r"reward_label_key \(colour\) is not a column of the prompts; they have: "
                                        r"target"):
        check_reward_call(bad, info_columns(records))


def test_openrlhf_dict_without_rewards_is_one_line(tmp_path):
    (tmp_path / "f.py").write_text("def reward_func(queries, prompts, labels):\n    return {'scores': [1.0]}\n")
    with pytest.raises(UserError, match=r"returned a dict without 'rewards' \(keys: scores\)"):
        get_reward(f"openrlhf:{tmp_path}/f.py")(["p"], ["c"])


@pytest.mark.parametrize("spec, fragment", [
    ("verl:", "expected 'verl:FILE.py' or 'verl:FILE.py:FUNCTION'"),
    ("openrlhf:/nope/f.py", "no such file '/nope/f.py'"),
    ("verl:{d}/verl_reward.py:nope", "has no attribute 'nope'"),
])
def test_bad_peer_specs_are_one_line(spec, fragment, peer_files):
    with pytest.raises(UserError) as err:
        get_reward(spec.format(d=peer_files))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_plain_python_reward_is_not_taken_for_a_peer(tmp_path):
    (tmp_path / "f.py").write_text("def reward(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    assert get_reward(f"python:{tmp_path}/f.py:reward")(["p"], ["c"]) == [1.0]
