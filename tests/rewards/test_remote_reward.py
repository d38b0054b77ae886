"""reward=http://HOST:PORT/PATH against real servers on loopback: OpenRLHF's protocol, batching, sharding,
retries, timeouts, bad answers (one line naming the server and the first bad item), and `rlhfkit
serve-reward` hosting rlhfkit's own rewards."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from rlhfkit.errors import UserError
from rlhfkit.rewards import get_reward, get_rewards, score_parts
from rlhfkit.rewards.remote import parse_urls
from rlhfkit.rewards.scoring import RewardError, reward_metrics

from reward_servers import rlhfkit_process, scripted_server

FAST = {"reward_retries": 0, "reward_timeout": 10.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def sentiment_server():
    with rlhfkit_process(["serve-reward", "sentiment", "--port", "0"]) as url:
        yield url


# ----------------------------------------------------------------------------- the protocol


def test_request_layout_batches_and_columns(tmp_path):
    """5 samples, reward_batch_size=2: three requests of 2, 2 and 1 samples, in order, each holding
    OpenRLHF's query/prompts/labels, the completions and every per-sample column."""
    with scripted_server("echo", tmp_path) as server:
        fn = get_reward(server.url(), {"reward_batch_size": 2, "reward_concurrency": 1})
        completions = ["a", "bb", "ccc", "dddd", "eeeee"]
        prompts = [f"P{i}: " for i in range(5)]
        scores = fn(prompts, completions, answer=[10, 11, 12, 13, 14], topic=list("vwxyz"))
        assert scores == [1.0, 2.0, 3.0, 4.0, 5.0]  # the echo server's reward: len(completion)
        bodies = [r["body"] for r in server.requests()]
    assert [len(b["query"]) for b in bodies] == [2, 2, 1]
    first = bodies[0]
    assert first["query"] == ["P0: a", "P1: bb"]  # OpenRLHF's query: the prompt followed by the response
    assert first["prompts"] == ["P0: ", "P1: "] and first["completions"] == ["a", "bb"]
    assert first["labels"] == [10, 11]  # no reward_label_key: the answer column
    assert first["topic"] == ["v", "w"] and first["answer"] == [10, 11]


def test_label_key_chooses_the_labels_column(tmp_path):
    with scripted_server("echo", tmp_path) as server:
        fn = get_reward(server.url(), {"reward_label_key": "topic"})
        fn(["p"], ["c"], answer=[1], topic=["t"])
        assert server.requests()[0]["body"]["labels"] == ["t"]
        with pytest.raises(UserError, match=r"reward_label_key \(nope\) is not a column of the prompts; they have: "
                                            r"answer"):
            get_reward(server.url(), {"reward_label_key": "nope"})(["p"], ["c"], answer=[1])


def test_several_servers_take_the_requests_in_turn(tmp_path):
    with scripted_server("echo", tmp_path) as a, scripted_server("echo", tmp_path) as b:
        fn = get_reward(f"{a.url()}+{b.url()}", {"reward_batch_size": 1, "reward_concurrency": 3})
        assert fn(["p"] * 5, ["x", "yy", "zzz", "wwww", "vvvvv"]) == [1.0, 2.0, 3.0, 4.0, 5.0]
        got_a = sorted(r["body"]["completions"][0] for r in a.requests())
        got_b = sorted(r["body"]["completions"][0] for r in b.requests())
    assert got_a == ["vvvvv", "x", "zzz"] and got_b == ["wwww", "yy"]  # requests 0, 2, 4 and 1, 3


def test_rlhfkit_reward_served_equals_the_same_reward_in_process(sentiment_server):
    texts = ["I love this film, it is wonderful", "awful, boring and far too long", "it exists"]
    remote = get_reward(sentiment_server, {"reward_batch_size": 2})
    assert remote(["q"] * 3, texts) == get_reward("sentiment")(["q"] * 3, texts)


@pytest.fixture(scope="module")
def arithmetic_server():
    with rlhfkit_process(["serve-reward", "arithmetic", "--port", "0"]) as url:
        yield url


def test_openrlhf_client_request_is_scored_on_the_response(arithmetic_server):
    """What OpenRLHF's remote_rm_fn posts: query = prompt + response, prompts, labels; no completions.
    The labels reach the arithmetic reward as its `answer`."""
    body = {"query": ["Q: 2+2? A: 4", "Q: 3+3? A: 5"], "prompts": ["Q: 2+2? A: ", "Q: 3+3? A: "], "labels": ["4", "6"]}
    assert _post(arithmetic_server, body) == {"rewards": [1.0, 0.0]}


def _post(url: str, body: object, headers: dict | None = None, data: bytes | None = None) -> dict:
    request = urllib.request.Request(url, data=data if data is not None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize("mode, fragment", [
    ("count", "answered 3 rewards for 2 samples"),
    ("nan", "gave 'NaN' for sample 1 (completion='yy'); expected a finite number"),
    ("string", "gave 'abc' for sample 1 (completion='yy')"),
    ("bool", "gave 'true' for sample 1"),
    ("html", "answered HTML, not JSON: '<!doctype html><html><body>Bad gateway</body></html>'"),
    ("notjson", "answered something that is not JSON: 'rewards: 1, 2'"),
    ("nokey", "expected {\"rewards\": [one number per sample]}"),
    ("refuse", "refused the request: HTTP 400: no such reward"),
])
def test_a_bad_answer_is_one_line_naming_the_server_and_the_item(mode, fragment, tmp_path):
    with scripted_server(mode, tmp_path) as server:
        fn = get_rewards(server.url(), options=FAST)
        with pytest.raises(RewardError) as err:
            score_parts(fn, ["p", "p"], ["x", "yy"])
    message = str(err.value)
    assert "\n" not in message and f"reward server {server.url()}" in message and fragment in message, message


def test_the_item_numbers_count_from_the_batch_start(tmp_path):
    with scripted_server("nan:d", tmp_path) as server:  # NaN for completion 'd', in the second request
        fn = get_reward(server.url(), {**FAST, "reward_batch_size": 2, "reward_concurrency": 1})
        with pytest.raises(RewardError, match=r"for sample 3 \(completion='d'\)"):
            fn(["p"] * 4, ["a", "b", "c", "d"])


def test_transient_failures_are_retried_with_backoff(tmp_path):
    with scripted_server("flaky:2", tmp_path) as server:  # answers 503 twice, then right
        fn = get_reward(server.url(), {"reward_retries": 2})
        assert fn(["p"], ["abc"]) == [3.0]
        assert len(server.requests()) == 3
    with scripted_server("flaky:2", tmp_path) as server:
        fn = get_reward(server.url(), {"reward_retries": 1})
        with pytest.raises(RewardError, match=r"no answer after 2 tries: HTTP 503: warming up"):
            fn(["p"], ["abc"])
        assert len(server.requests()) == 2


def test_a_slow_server_times_out(tmp_path):
    with scripted_server("slow:5", tmp_path) as server:
        fn = get_reward(server.url(), {"reward_timeout": 0.5, "reward_retries": 0})
        with pytest.raises(RewardError, match=r"reward server .* no answer after 1 try: .*timed out"):
            fn(["p"], ["abc"])


def test_an_unreachable_server_is_refused_before_anything_runs():
    port = free_port()
    with pytest.raises(UserError, match=rf"cannot reach the reward server at 127.0.0.1:{port} \(Connection refused\)"):
        get_rewards(f"http://127.0.0.1:{port}/get_reward")


@pytest.mark.parametrize("spec, fragment", [
    ("http://:80/x", "is not an http(s) URL"),
    ("http://h:port/x", "has a port that is not a number"),
])
def test_malformed_urls(spec, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_urls(spec)


def test_the_spec_list_splits_on_commas_only():
    """URLs hold colons: `code,judge:http://127.0.0.1:8000/v1` is two rewards, the second a URL."""
    from rlhfkit.rewards.registry import _as_specs

    assert _as_specs("code,judge:http://127.0.0.1:8000/v1") == ["code", "judge:http://127.0.0.1:8000/v1"]
    assert _as_specs("http://a:1/r+http://b:2/r,sentiment") == ["http://a:1/r+http://b:2/r", "sentiment"]


def test_latency_is_reported_once_per_scoring(tmp_path):
    with scripted_server("echo", tmp_path) as server:
        fn = get_rewards(f"{server.url()},length:2", [1.0, 0.5], options=FAST)
        reward_metrics(fn)
        total, parts = score_parts(fn, ["p"], ["abcd"])
        first = reward_metrics(fn)
    assert parts == {server.url(): [4.0], "length:2": [-0.5]} and total == [4.0 + 0.5 * -0.5]
    assert set(first) == {"timing/reward_remote_s"} and 0 < first["timing/reward_remote_s"] < 60
    assert reward_metrics(fn) == {"timing/reward_remote_s": 0.0}  # read once


# ----------------------------------------------------------------------------- serve-reward's door


def test_a_token_guards_the_server_and_the_client_sends_it(tmp_path, monkeypatch):
    token = "s3cret-token-for-tests"
    with rlhfkit_process(["serve-reward", "length:2", "--port", "0"], env={"RLHFKIT_REWARD_TOKEN": token}) as url:
        with pytest.raises(RewardError, match=r"refused the request: HTTP 401: missing or wrong access token"):
            get_reward(url, FAST)(["p"], ["a b"])
        monkeypatch.setenv("MY_REWARD_TOKEN", token)
        assert get_reward(url, {**FAST, "reward_api_key_env": "MY_REWARD_TOKEN"})(["p"], ["a b"]) == [0.0]
        monkeypatch.delenv("MY_REWARD_TOKEN")
        with pytest.raises(UserError, match=r"reward_api_key_env=MY_REWARD_TOKEN but the environment variable "
                                            r"MY_REWARD_TOKEN is unset"):
            get_reward(url, {"reward_api_key_env": "MY_REWARD_TOKEN"})


def test_serve_reward_refuses_a_large_body_before_reading_it(sentiment_server):
    host, port = sentiment_server.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 20000000\r\n\r\n")  # 20 MB announced (> 16 MiB), none sent
        head = ""
        for _ in range(10):  # the status line and the JSON body may come in separate packets
            head += conn.recv(4096).decode()
            if head.endswith("}"):
                break
    assert head.startswith("HTTP/1.1 413") and "request body larger than 16777216 bytes" in head, head


def test_serve_reward_bounds_requests(sentiment_server):
    for body, data, headers, status, detail in [
        ({"query": ["x"] * 5000}, None, {}, 422, "5000 samples in one request; this server takes at most 4096"),
        (None, b"{not json", {}, 400, "not valid JSON"),
        ({"query": ["x"]}, None, {"Content-Type": "text/plain"}, 415, "must be JSON"),
        ({"query": "x"}, None, {}, 422, "'query' (or 'completions') must be a list of texts"),
        ({"query": ["x"], "prompts": ["a", "b"]}, None, {}, 422, "'prompts' must be a list of 1 texts"),
    ]:
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(sentiment_server, body, headers, data)
        assert err.value.code == status and detail in err.value.read().decode()


def test_serve_reward_reward_errors_are_422_with_one_line(arithmetic_server):
    with pytest.raises(RewardError, match=r"refused the request: HTTP 422: .*answer"):
        get_reward(arithmetic_server, FAST)(["q"], ["4"])  # no label, no answer column: nothing to compare with


@pytest.mark.parametrize("argv, fragment", [
    (["sentiment", "--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other machines: set an access token"),
    (["sentiment", "--token", "short"], "the access token must have at least 8 characters"),
    (["nosuchreward"], "unknown reward 'nosuchreward'"),
    (["sentiment", "--path", "x"], "--path (x) must start with /"),
])
def test_serve_reward_bad_options_are_one_line_exit_2(argv, fragment, tmp_path):
    result = subprocess.run([sys.executable, "-m", "rlhfkit.cli", "serve-reward", *argv], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, env={**_env(), "RLHFKIT_REWARD_TOKEN": ""})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
    assert not list(tmp_path.iterdir())


def test_serve_reward_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "rlhfkit.cli", "serve-reward", "sentiment", "--port",
                                 str(port)], capture_output=True, text=True, timeout=120, env=_env())
    assert result.returncode == 2 and f"--port {port}: already in use" in result.stderr, result.stderr


def _env() -> dict:
    import os
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_scores_are_finite_numbers(sentiment_server):
    out = get_reward(sentiment_server)(["q"], ["good"])
    assert len(out) == 1 and math.isfinite(out[0])


def test_a_reward_model_served_scores_as_it_does_in_process(tmp_path, tiny_tokenizer):
    """serve-reward model:PATH: a reward model on another process gives the scores it gives in this one."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0)
    folder = tmp_path / "rm"
    LlamaForSequenceClassification(config).eval().save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    prompts, completions = ["Write a review.", "What is 3 + 4?", "Hi"], ["It was great.", "7", "Hello there, friend"]
    want = get_reward(f"model:{folder}")(prompts, completions)
    with rlhfkit_process(["serve-reward", f"model:{folder}", "--port", "0"]) as url:
        got = get_reward(url, {"reward_batch_size": 3})(prompts, completions)
    scale = max(abs(w) for w in want) + 1e-6
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6 * scale) and len(set(got)) == 3
