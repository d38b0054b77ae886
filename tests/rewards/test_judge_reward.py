"""reward=judge:URL through the real openai client: against `rlhfkit serve` hosting the tiny model, and, for the
score parser's golden cases, against a parrot server (reply = the filled template) on loopback."""

from __future__ import annotations

import json
import sys

import pytest

from rlhfkit.core.config import build_config
from rlhfkit.errors import UserError
from rlhfkit.rewards import check_reward_call, get_reward, get_rewards, score_parts
from rlhfkit.rewards.judge import DEFAULT_TEMPLATE, parse_score
from rlhfkit.rewards.scoring import RewardError, reward_metrics
from rlhfkit.trainers.grpo import train
from rlhfkit.trainers.grpo_config import GRPOConfig

from reward_servers import rlhfkit_process, scripted_server

pytest.importorskip("openai")
PARROT = {"judge_template": "{completion}", "reward_retries": 0, "reward_timeout": 20.0}


@pytest.fixture(scope="module")
def parrot(tmp_path_factory):
    with scripted_server("echo", tmp_path_factory.mktemp("parrot")) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_judge(tiny_model_dir):
    """`rlhfkit serve` on the tiny model: (base URL ending in /v1, model name)."""
    with rlhfkit_process(["serve", str(tiny_model_dir), "--port", "0", "--name", "tiny", "--max-tokens", "8"]) as url:
        yield url


# ----------------------------------------------------------------------------- the parser


@pytest.mark.parametrize("reply, score", [
    ("Rating: 7/10.", 0.7),
    ("8 / 10, no: 2/10", 0.2),  # the last one
    ('{"score": 3, "why": "clear"}', 3.0),  # a JSON field as given
    ('Sure! {"reason": "x", "score": 9.5}', 9.5),
    ('{"score": "high"} but 6/10', 0.6),  # a field that is not a number: the ratio
    ("10/10", 1.0),
    ("no score here", None),
    ("7/100", None),  # not out of 10
    ("", None),
])
def test_parse_score_golden(reply, score):
    assert parse_score(reply) == score


def test_parse_score_reads_the_named_field():
    assert parse_score('{"score": 1, "rating": 4}', "rating") == 4.0


# ----------------------------------------------------------------------------- through the client


def test_replies_become_scores_through_the_openai_client(parrot):
    fn = get_reward(f"judge:{parrot.url('/v1')}", PARROT)
    reward_metrics(fn)
    scores = fn(["p"] * 4, ["Rating: 7/10.", '{"score": 3, "why": "ok"}', "no idea", "8 / 10"])
    assert scores == [0.7, 3.0, 0.0, 0.8]
    metrics = reward_metrics(fn)
    assert metrics["rollout/judge_unparsed_rate"] == 0.25 and metrics["timing/reward_remote_s"] > 0
    sent = [r["body"] for r in parrot.requests() if r["path"].endswith("/chat/completions")][-4:]
    assert {b["model"] for b in sent} == {"parrot"}  # no judge_model: the first model the server lists
    assert all(b["temperature"] == 0 and b["max_tokens"] == 64 for b in sent)


def test_the_template_fills_prompt_completion_and_columns(parrot, tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("Q={prompt} A={completion} gold={answer} {{literal}}")
    fn = get_reward(f"judge:{parrot.url('/v1')}", {**PARROT, "judge_template": str(template),
                                                   "judge_model": "mine", "judge_max_tokens": 5})
    assert fn([[{"role": "user", "content": "2+2?"}]], [[{"role": "assistant", "content": "4"}]], answer=[4]) == [0.0]
    last = [r["body"] for r in parrot.requests() if r["path"].endswith("/chat/completions")][-1]
    assert last["messages"] == [{"role": "user", "content": "Q=2+2? A=4 gold=4 {literal}"}]
    assert last["model"] == "mine" and last["max_tokens"] == 5


def test_the_default_template_asks_for_n_of_10(parrot):
    fn = get_reward(f"judge:{parrot.url('/v1')}", {"reward_retries": 0})
    fn(["Say hi"], ["hi"])
    last = [r["body"] for r in parrot.requests() if r["path"].endswith("/chat/completions")][-1]
    assert last["messages"][0]["content"] == DEFAULT_TEMPLATE.format(prompt="Say hi", completion="hi")


def test_an_unparsed_reply_can_stop_the_run(parrot):
    fn = get_reward(f"judge:{parrot.url('/v1')}", {**PARROT, "judge_unparsed": "error"})
    with pytest.raises(RewardError, match=r"the judge's reply to sample 1 \(completion='meh'\) has no score: 'meh'"):
        fn(["p", "p"], ["9/10", "meh"])


def test_template_columns_are_checked_before_a_model_loads(parrot):
    fn = get_rewards(f"judge:{parrot.url('/v1')}", options={**PARROT, "judge_template": "{completion} vs {gold}"})
    with pytest.raises(UserError, match=r"judge_template uses \{gold\}, which is not a column of the prompts "
                                        r"\(they have: answer"):
        check_reward_call(fn, ["answer"])
    check_reward_call(fn, ["gold"])


@pytest.mark.parametrize("template, fragment", [
    ("{completion", "judge_template is not a valid template"),
    ("{0} {completion}", "judge_template has the field {0}"),
    ("nope.txt", "judge_template names 'nope.txt', which is not a file"),
])
def test_bad_templates_are_one_line(parrot, template, fragment):
    with pytest.raises(UserError) as err:
        get_reward(f"judge:{parrot.url('/v1')}", {"judge_template": template})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_api_key_comes_from_the_named_variable(parrot, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "judge-key-123")
    get_reward(f"judge:{parrot.url('/v1')}", {**PARROT, "judge_api_key_env": "MY_JUDGE_KEY"})(["p"], ["1/10"])
    assert parrot.requests()[-1]["auth"] == "Bearer judge-key-123"
    monkeypatch.delenv("MY_JUDGE_KEY")
    with pytest.raises(UserError, match="judge_api_key_env=MY_JUDGE_KEY but the environment variable MY_JUDGE_KEY"):
        get_reward(f"judge:{parrot.url('/v1')}", {"judge_api_key_env": "MY_JUDGE_KEY"})


def test_without_the_openai_package_it_is_one_line(parrot, monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` raises ImportError
    with pytest.raises(UserError, match=r"an LLM judge needs the openai package: pip install 'rlhfkit\[judge\]'"):
        get_reward(f"judge:{parrot.url('/v1')}")


def test_a_base_url_without_v1_is_one_line_with_a_hint(parrot):
    with pytest.raises(UserError, match=r"listing the judge server's models failed \(NotFoundError: .*\); check the "
                                        r"base URL \(it usually ends in /v1\) or set judge_model=NAME"):
        get_reward(f"judge:{parrot.url('')}", {"reward_retries": 0})


@pytest.mark.parametrize("spec, fragment", [
    ("judge:", "expected 'judge:URL'"),
    ("judge:localhost:8000/v1", "is not an http(s) URL"),
    ("judge:http://127.0.0.1:1/v1+http://127.0.0.1:2/v1", "a judge takes one server URL, got 2"),
])
def test_bad_judge_specs(spec, fragment):
    with pytest.raises(UserError) as err:
        get_reward(spec)
    assert fragment in str(err.value)


# ----------------------------------------------------------------------------- rlhfkit serve as the judge


def test_rlhfkit_serve_judges_through_the_openai_client(tiny_judge):
    """The tiny model answers bytes: no score in its replies (0 each, all counted unparsed), the same replies
    at temperature 0 on a second call; with judge_model unset the model is the one the server lists."""
    fn = get_rewards(f"length:2,judge:{tiny_judge}", [1.0, 0.2], options={"reward_retries": 0})
    reward_metrics(fn)
    total, parts = score_parts(fn, ["Rate this.", "And this."], ["a b", "c"], {})
    assert parts[f"judge:{tiny_judge}"] == [0.0, 0.0] and parts["length:2"] == [0.0, -0.5]
    assert total == [0.0, -0.5]
    assert reward_metrics(fn)["rollout/judge_unparsed_rate"] == 1.0


def test_a_wrong_judge_model_is_one_line(tiny_judge):
    fn = get_reward(f"judge:{tiny_judge}", {"judge_model": "nope", "reward_retries": 0})
    with pytest.raises(RewardError, match=r"the judge failed: NotFoundError: .*nope"):
        fn(["p"], ["c"])


@pytest.mark.slow
def test_a_grpo_run_with_a_weighted_judge(tiny_judge, tiny_model_dir, tmp_path):
    """reward=length:3,judge:URL reward_weights=1,0.2: a run through `rlhfkit serve`, each reward logged."""
    (tmp_path / "p.txt").write_text("\n".join(f"Write about thing {i}." for i in range(8)))
    spec = f"judge:{tiny_judge}"
    train(build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp_path / "p.txt"), reward=f"length:3,{spec}", reward_weights=[1, 0.2],
        iterations=1, rollout_batch_size=4, group_size=2, mini_batch_size=4, micro_batch_size=2, max_new_tokens=4,
        num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
        tensorboard=False)))
    (row,) = [json.loads(x) for x in (tmp_path / "runs/t/metrics.jsonl").read_text().splitlines()]
    assert f"reward/{spec}" in row and "reward/length:3" in row and row["timing/reward_remote_s"] > 0
    assert row["rollout/judge_unparsed_rate"] == 1.0
