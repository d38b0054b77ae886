"""``reward=code``: the completion's program run against the record's tests in a sandbox
(rewards/sandbox.py), scored by the fraction of tests passed (``code_reward=all``: 1 only when every
test passes).

The tests come from the record's columns, in the common code-RL formats:
- MBPP: ``test_list`` (assert statements) and optional ``test_setup_code``;
- HumanEval: ``test`` (defines ``check(candidate)``) and ``entry_point``: one test,
  ``check(ENTRY_POINT)``; when the program does not define ENTRY_POINT the prompt (which holds its
  signature) is put before it, as HumanEval completes the prompt;
- APPS: ``input_output`` ({"inputs": [...], "outputs": [...]}, a dict or its JSON text): each input
  fed on stdin, the printed output compared with the expected one line by line, trailing whitespace
  ignored; with ``fn_name`` each input is the argument list of that function instead;
- ``tests_field=NAME``: another column holding any of these shapes (a list of asserts, test code,
  or an inputs/outputs mapping).

The program is the first fenced code block of the completion (```python preferred, an unclosed
block runs to the end), else the whole completion.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlhfkit.core.choices import CODE_REWARDS
from rlhfkit.core.code_settings import CodeSettings
from rlhfkit.errors import UserError
from rlhfkit.rewards.builtins import text_of
from rlhfkit.rewards.sandbox import Execution, Limits, Sandbox

REASONS = ("pass", "fail", "timeout", "error", "memory")  # what a completion's first failed test says
TEST_COLUMNS = ("test_list", "test", "input_output")
# Per-sample 0/1 indicators of a completion's reason, logged as reward/NAME (the iteration's rates)
RATE_OF_REASON = {"pass": "code_pass_rate", "timeout": "code_timeout_rate", "error": "code_error_rate",
                  "memory": "code_memory_rate"}
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def sandbox_limits(settings: CodeSettings) -> Limits:
    """The sandbox's limits for one program under `settings`."""
    cpu = max(1, math.ceil(settings.code_timeout))
    # wall-clock: room for a loaded machine, where a program gets a fraction of a core
    return Limits(cpu_s=cpu, wall_s=2 * settings.code_timeout + 5.0, memory_mb=settings.code_memory_mb)


def extract_code(completion: Any) -> str:
    """The program of a completion: its first ```python (or ```py) block, else its first fenced block
    of any language, else the whole text. An unclosed block runs to the end of the text."""
    text = text_of(completion)
    blocks = FENCE.findall(text)
    for lang, body in blocks:
        if lang.lower() in ("python", "py", "python3"):
            return body
    return blocks[0][1] if blocks else text


def job_of(program: str, prompt: Any, columns: Mapping[str, Any], tests_field: str | None) -> dict:
    """The sandbox job of one record's tests (see the module docstring for the formats)."""
    if tests_field is not None:
        return _job_of_value(program, columns.get(tests_field), tests_field, columns)
    if columns.get("test_list") is not None:
        return {"kind": "asserts", "solution": program, "setup": columns.get("test_setup_code") or "",
                "tests": [str(t) for t in columns["test_list"]]}
    if columns.get("test") is not None and columns.get("entry_point"):
        entry = str(columns["entry_point"])
        if not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", program, re.MULTILINE):
            program = text_of(prompt) + program
        return {"kind": "asserts", "solution": program, "setup": "", "tests": [f"{columns['test']}\ncheck({entry})\n"]}
    if columns.get("input_output") is not None:
        return _io_job(program, columns["input_output"], columns.get("fn_name"), "input_output")
    raise UserError(f"reward 'code': a record has none of the test columns {', '.join(TEST_COLUMNS)} "
                    "(MBPP, HumanEval, APPS formats); name yours with tests_field=COLUMN")


def _job_of_value(program: str, value: Any, field: str, columns: Mapping[str, Any]) -> dict:
    if isinstance(value, (list, tuple)):
        return {"kind": "asserts", "solution": program, "setup": "", "tests": [str(t) for t in value]}
    if isinstance(value, Mapping) or (isinstance(value, str) and value.lstrip().startswith("{")):
        return _io_job(program, value, columns.get("fn_name"), field)
    if isinstance(value, str) and value.strip():
        return {"kind": "asserts", "solution": program, "setup": "", "tests": [value]}
    raise UserError(f"reward 'code': tests_field={field!r}: a record's value is {type(value).__name__} "
                    f"{str(value)[:40]!r}; expected a list of asserts, test code, or {{'inputs', 'outputs'}}")


def _io_job(program: str, value: Any, fn_name: Any, field: str) -> dict:
    try:
        spec = json.loads(value) if isinstance(value, str) else dict(value)
        inputs, outputs = list(spec["inputs"]), list(spec["outputs"])
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"reward 'code': {field} must hold {{'inputs': [...], 'outputs': [...]}} "
                        f"({type(e).__name__}: {str(e)[:60]})") from None
    if len(inputs) != len(outputs):
        raise UserError(f"reward 'code': {field} has {len(inputs)} inputs for {len(outputs)} outputs")
    fn = spec.get("fn_name") or fn_name
    if fn:  # APPS call-based: each input is the argument list
        tests = [f"assert {fn}(*{a!r}) == {b!r}" for a, b in zip(inputs, outputs)]
        return {"kind": "asserts", "solution": program, "setup": "", "tests": tests}
    return {"kind": "stdio", "solution": program, "inputs": [str(x) for x in inputs],
            "expected": [str(x) for x in outputs]}


def same_output(got: str, expected: str) -> bool:
    """Printed output equals the expected one, line by line, trailing whitespace and blank lines ignored."""
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in str(text).splitlines()]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(got) == lines(expected)


def verdicts(job: dict, ex: Execution) -> list[str]:
    """Each test's status, the stdin/stdout answers compared here (outside the sandbox)."""
    expected = job.get("expected")
    return [("pass" if same_output(ex.outputs.get(i, ""), expected[i]) else "fail") if s == "out" else s
            for i, s in enumerate(ex.statuses)]


def note(statuses: list[str], ex: Execution, limit: int = 300) -> str:
    """'pass 3/3', or the first failed test with its detail and the end of the program's output."""
    passed = sum(s == "pass" for s in statuses)
    bad = next((i for i, s in enumerate(statuses) if s != "pass"), None)
    if bad is None:
        return f"pass {passed}/{len(statuses)}"
    detail = ex.details[bad] if bad < len(ex.details) else ""
    text = f"{statuses[bad]} {passed}/{len(statuses)}: test {bad}: {detail}".strip()
    output = " ".join((ex.stdout + " " + ex.stderr).split())
    return (text + (f" | output: {output[-limit:]}" if output else ""))[: 2 * limit]


def first_reason(statuses: list[str]) -> str:
    """A completion's reason: pass when every test passed, else its first failed test's status
    (fail = a wrong answer; timeout, memory, error)."""
    bad = [s for s in statuses if s != "pass"]
    if not statuses:
        return "error"
    return "pass" if not bad else (bad[0] if bad[0] in REASONS else "error")


class CodeReward:
    """``reward=code`` as a reward function: ``(prompts, completions, **columns) -> scores``, the
    executions spread over `code_workers` threads (each waits on its own sandboxed process).
    `score_with_metrics` also returns per-sample 0/1 indicators of each reason, logged by the
    trainer as reward/code_pass_rate, reward/code_timeout_rate, reward/code_error_rate and
    reward/code_memory_rate (means over the iteration's completions), and `code_result`, a one-line
    note per sample (how it failed, the end of its output) that samples.jsonl shows."""

    reward_name = "code"

    def __init__(self, settings: CodeSettings, sandbox: Sandbox | None = None):
        self.settings = settings
        self.sandbox = sandbox or Sandbox(sandbox_limits(settings), settings.code_isolation)
        self.workers = settings.code_workers or os.cpu_count() or 1
        print(self.sandbox.note, flush=True)

    def check_columns(self, columns: list[str]) -> None:
        """Before any model loads: the data must carry a tests column."""
        wanted = [self.settings.tests_field] if self.settings.tests_field else list(TEST_COLUMNS)
        if not set(wanted) & set(columns):
            what = f"tests_field={wanted[0]!r}" if self.settings.tests_field else "a tests column"
            raise UserError(f"reward 'code' needs {what} ({' or '.join(wanted)}) in the prompts; the data has "
                            f"{', '.join(columns) or 'no columns besides prompt'}; name yours with tests_field=")

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        return self.score_with_metrics(prompts, completions, **columns)[0]

    def score_with_metrics(self, prompts: list, completions: list,
                           **columns: Any) -> tuple[list[float], dict[str, list[float]]]:
        """(scores, {"code_pass_rate": [0/1 per sample], "code_timeout_rate": ..., ..., "code_result": [note]})."""
        jobs = [job_of(extract_code(c), p, {k: v[i] for k, v in columns.items()}, self.settings.tests_field)
                for i, (p, c) in enumerate(zip(prompts, completions))]
        results = self.run(jobs)
        scores = [self.score(statuses) for statuses, _ in results]
        reasons = [first_reason(statuses) for statuses, _ in results]
        metrics: dict[str, list] = {name: [float(x == r) for x in reasons] for r, name in RATE_OF_REASON.items()}
        metrics["code_result"] = [note for _, note in results]  # text: samples.jsonl, not a metric
        return scores, metrics

    def run(self, jobs: list[dict]) -> list[tuple[list[str], str]]:
        """Each job's (per-test statuses, a one-line note of how it failed: samples.jsonl's code_result).
        A job without tests runs nothing and has none."""
        def one(job: dict) -> tuple[list[str], str]:
            if not (job.get("tests") or job.get("inputs")):
                return [], "error: the record has no tests"
            ex = self.sandbox.run({k: v for k, v in job.items() if k != "expected"})
            statuses = verdicts(job, ex)
            return statuses, note(statuses, ex)

        if self.workers == 1 or len(jobs) <= 1:
            return [one(j) for j in jobs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs))) as pool:
            return list(pool.map(one, jobs))

    def score(self, statuses: list[str]) -> float:
        passed = sum(s == "pass" for s in statuses)
        if not statuses:
            return 0.0
        if self.settings.code_reward == "all":
            return float(passed == len(statuses))
        return passed / len(statuses)


def code_kind(target: str, spec: str, options: Mapping[str, Any]) -> CodeReward:
    """The registry's builder: ``code`` or ``code:fraction`` / ``code:all`` (overrides code_reward)."""
    settings = CodeSettings.of(options)
    if target:
        if target not in CODE_REWARDS:
            raise UserError(f"reward {spec!r}: expected 'code', 'code:fraction' or 'code:all'")
        settings = dataclasses.replace(settings, code_reward=target)
    return CodeReward(settings)
