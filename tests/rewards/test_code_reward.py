"""reward=code: test formats, code extraction, scores and metrics, options (real sandboxed processes,
resource limits only: the isolation levels are exercised in test_code_sandbox.py)."""

from __future__ import annotations

import json

import pytest

from rlhfkit.errors import UserError
from rlhfkit.rewards import check_reward_call, get_rewards, score_parts
from rlhfkit.rewards.code import CodeReward, CodeSettings, extract_code, first_reason, job_of, same_output

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
MBPP = {"test_list": [["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 5"]]}


@pytest.fixture(scope="module")
def fraction():
    return CodeReward(CodeSettings(code_isolation="rlimits", code_workers=2, code_timeout=5))


def test_extract_code_prefers_a_python_block_then_any_block_then_the_text():
    assert extract_code("Sure:\n```js\nx\n```\n```python\ny = 1\n```") == "y = 1\n"
    assert extract_code("```\nz = 2\n```") == "z = 2\n"
    assert extract_code("```python\nunclosed = 3") == "unclosed = 3"
    assert extract_code("w = 4") == "w = 4"
    assert extract_code([{"role": "assistant", "content": "```py\nv = 5\n```"}]) == "v = 5\n"


def test_jobs_of_each_format():
    mbpp = job_of("P", "q", {"test_list": ["assert 1"], "test_setup_code": "import math"}, None)
    assert mbpp == {"kind": "asserts", "solution": "P", "setup": "import math", "tests": ["assert 1"]}
    human = job_of("x = 1\n", "def g(a):\n", {"test": "def check(c):\n    assert c(1)", "entry_point": "g"}, None)
    assert human["solution"] == "def g(a):\nx = 1\n"  # no def g in the program: the prompt goes first
    assert human["tests"] == ["def check(c):\n    assert c(1)\ncheck(g)\n"]
    assert job_of("def g(a): pass", "P", {"test": "t", "entry_point": "g"}, None)["solution"] == "def g(a): pass"
    apps = job_of("P", "q", {"input_output": json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})}, None)
    assert apps == {"kind": "stdio", "solution": "P", "inputs": ["1\n"], "expected": ["2\n"]}
    call = job_of("P", "q", {"input_output": {"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"}}, None)
    assert call["tests"] == ["assert add(*[1, 2]) == 3"]
    assert job_of("P", "q", {"checks": ["assert 2"]}, "checks")["tests"] == ["assert 2"]
    assert job_of("P", "q", {"checks": "assert 3"}, "checks")["tests"] == ["assert 3"]
    assert job_of("P", "q", {"checks": {"inputs": ["a"], "outputs": ["b"]}}, "checks")["kind"] == "stdio"


def test_a_record_without_tests_is_one_clear_error():
    with pytest.raises(UserError, match="none of the test columns test_list, test, input_output"):
        job_of("P", "q", {"answer": 3}, None)
    with pytest.raises(UserError, match="has 2 inputs for 1 outputs"):
        job_of("P", "q", {"input_output": {"inputs": ["1", "2"], "outputs": ["3"]}}, None)


def test_same_output_ignores_trailing_whitespace_only():
    assert same_output("1 2  \n3\n\n", "1 2\n3")
    assert not same_output("1  2\n3", "1 2\n3")
    assert not same_output("3\n1 2", "1 2\n3")


def test_first_reason():
    assert first_reason(["pass", "pass"]) == "pass"
    assert first_reason(["pass", "timeout", "fail"]) == "timeout"
    assert first_reason([]) == "error"


def test_fraction_and_all_scores_golden(fraction):
    # add passes 2 of the 3 asserts (the third expects 5): fraction 2/3, all 0.
    assert fraction([""], [GOOD], **MBPP) == [pytest.approx(2 / 3)]
    strict = CodeReward(CodeSettings(code_reward="all", code_isolation="rlimits"), fraction.sandbox)
    assert strict([""], [GOOD], **MBPP) == [0.0]
    assert strict([""], [GOOD], test_list=[["assert add(1, 2) == 3"]]) == [1.0]


def test_stdin_stdout_and_humaneval_formats_run(fraction):
    io = {"input_output": [json.dumps({"inputs": ["2 3\n", "5 5\n"], "outputs": ["5\n", "11\n"]})]}
    program = "a, b = map(int, input().split())\nprint(a + b)"
    assert fraction(["q"], [program], **io) == [0.5]
    test = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
    prompt = "def square(x):\n    \"\"\"x squared\"\"\"\n"
    assert fraction([prompt], ["    return x * x\n"], test=[test], entry_point=["square"]) == [1.0]


def test_metrics_are_per_sample_reason_indicators_through_score_parts(fraction):
    completions = [GOOD, "def add(a, b):\n    while True:\n        pass", "def add(a, b):\n    return a + b",
                   "def add(a b):"]
    tests = ["assert add(1, 2) == 3"]
    reward = CodeReward(CodeSettings(code_isolation="rlimits", code_timeout=1), fraction.sandbox)
    scores, parts = score_parts(reward, ["p"] * 4, completions, {"test_list": [tests] * 4})
    assert scores == [1.0, 0.0, 1.0, 0.0]
    notes = parts.pop("code_result")
    assert notes[0] == "pass 1/1" and notes[1].startswith("timeout 0/1: test 0: ")
    assert notes[3].startswith("error 0/1: test 0: solution: SyntaxError")
    assert parts == {"code_pass_rate": [1.0, 0.0, 1.0, 0.0], "code_timeout_rate": [0.0, 1.0, 0.0, 0.0],
                     "code_error_rate": [0.0, 0.0, 0.0, 1.0], "code_memory_rate": [0.0, 0.0, 0.0, 0.0]}


def test_weighted_with_another_reward_keeps_the_code_metrics(fraction):
    both = get_rewards("code,length:2", [1.0, 0.5], options={"code_isolation": "rlimits"})
    scores, parts = score_parts(both, ["p"], [GOOD], MBPP)
    assert set(parts) == {"code", "length:2", "code_pass_rate", "code_timeout_rate", "code_error_rate",
                          "code_memory_rate", "code_result"}
    assert scores == [pytest.approx(parts["code"][0] + 0.5 * parts["length:2"][0])]


def test_get_rewards_reads_the_options_and_the_spec_overrides_code_reward():
    rew = get_rewards("code:all", options={"code_reward": "fraction", "code_isolation": "rlimits",
                                           "code_workers": 3, "code_timeout": 2.5})
    inner = rew.__wrapped__
    assert (inner.settings.code_reward, inner.workers, inner.sandbox.limits.cpu_s) == ("all", 3, 3)
    assert inner.sandbox.limits.wall_s == pytest.approx(2 * 2.5 + 5)


@pytest.mark.parametrize(("options", "message"), [
    ({"code_reward": "most"}, "code_reward ('most') must be one of: fraction, all"),
    ({"code_workers": 0}, "code_workers (0) must be >= 1 (or None: the cores)"),
    ({"code_timeout": -1.0}, "code_timeout (-1.0) must be a number of seconds > 0"),
    ({"code_timeout": float("nan")}, "code_timeout (nan) must be a number of seconds > 0"),
    ({"code_memory_mb": 10}, "code_memory_mb (10) must be >= 64 (the interpreter needs ~30 MB)"),
    ({"code_isolation": "docker"}, "code_isolation ('docker') must be one of: auto, bwrap, rlimits"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(UserError) as err:
        get_rewards("code", options=options)
    assert str(err.value) == message


def test_missing_tests_column_stops_before_any_model(capsys):
    rew = get_rewards("code", options={"code_isolation": "rlimits"})
    check_reward_call(rew, ["test_list", "entry_point"])  # fine
    with pytest.raises(UserError, match=r"reward 'code' needs a tests column \(test_list or test or input_output\)"):
        check_reward_call(rew, ["answer"])
    named = get_rewards("code", options={"code_isolation": "rlimits", "tests_field": "checks"})
    with pytest.raises(UserError, match="needs tests_field='checks'"):
        check_reward_call(named, ["test_list"])
    assert capsys.readouterr().out.count("[code] sandbox: resource limits only") == 2  # one line per reward built


def test_builtin_python_tasks_pass_with_their_reference_solutions(fraction):
    """Every built-in task's tests are right: a program that answers from the asserts' own table passes."""
    from rlhfkit.data import load_prompts

    rows = load_prompts("builtin:python-tasks", "test")
    assert len(rows) >= 20 and all(len(r["test_list"]) >= 2 for r in rows)
    programs = [_table_program(r) for r in rows]
    scores = fraction([r["prompt"] for r in rows], programs, test_list=[r["test_list"] for r in rows])
    assert scores == [1.0] * len(rows)


def test_builtin_python_tasks_file_is_what_its_generator_writes():
    """The asserts' expected values come from the generator's reference implementations."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_python_tasks.py"
    assert subprocess.run([sys.executable, str(script), "--check"], timeout=120).returncode == 0


def _table_program(row: dict) -> str:
    """A function that returns each assert's expected value for its arguments."""
    import ast

    table = {}
    for test in row["test_list"]:
        compare = ast.parse(test).body[0].test
        args = tuple(ast.literal_eval(a) for a in compare.left.args)
        table[repr(args)] = ast.literal_eval(compare.comparators[0])
    return f"def {row['entry_point']}(*args):\n    return {table!r}[repr(args)]\n"


def test_grpo_run_logs_the_code_rates_and_notes(tmp_path, tiny_model_dir):
    """One GRPO iteration on the tiny model: reward/code_*_rate in metrics.jsonl (rates of the 4
    completions, at most 1 together), each sample's code_result in samples.jsonl."""
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.grpo import train as grpo_train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    rows = [{"prompt": f"Write add{i}(a, b).", "test_list": [f"assert add{i}(1, 2) == 3"]} for i in range(2)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp_path / "tasks.jsonl"), reward="code", code_isolation="rlimits",
        code_timeout=2.0, iterations=1, rollout_batch_size=4, group_size=2, mini_batch_size=4, micro_batch_size=2,
        max_new_tokens=4, num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t",
        quiet=True, tensorboard=False, log_samples=4))
    grpo_train(cfg)
    run = tmp_path / "runs" / "t"
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    rates = [row[f"reward/code_{r}_rate"] for r in ("pass", "timeout", "error", "memory")]
    assert all(0.0 <= x <= 1.0 for x in rates) and sum(rates) <= 1.0 + 1e-9
    assert "reward/code_result" not in row
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(isinstance(s["code_result"], str) and s["code_result"] for s in samples)
