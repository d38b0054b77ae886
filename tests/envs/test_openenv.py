"""env=openenv:URL (envs/openenv.py) against a minimal OpenEnv environment server written here from
the protocol (WebSocket /ws, GET /health and /schema) on 127.0.0.1: episodes, the mapping of turns
to actions and observations to messages, every failure as one line, and a GRPO step through it."""

from __future__ import annotations

import json
import random
import re
import socket
import threading
from collections import Counter

import pytest

from rlhfkit.core.config import build_config
from rlhfkit.envs import make_env_factory
from rlhfkit.envs.openenv import (
    OpenEnvEpisode,
    Server,
    action_data,
    base_url,
    connect,
    observation_text,
    parse_reply,
    reset_data,
    text_field,
)
from rlhfkit.errors import UserError

pytest.importorskip("websockets")

ANSWER_SCHEMA = {"action": {"type": "object", "title": "AnswerAction", "required": ["answer"], "properties": {
    "metadata": {"type": "object", "title": "Metadata"}, "answer": {"type": "string", "title": "Answer"}}},
    "observation": {"type": "object", "properties": {"text": {"type": "string"}}}, "state": {"type": "object"}}


class AdditionEnv:
    """reset(seed): "What is A + B?" from random.Random(seed); two tries; 1.0 for the right sum."""

    def reset(self, data: dict) -> dict:
        rng = random.Random(data.get("seed"))
        self.a, self.b, self.tries = rng.randint(1, 20), rng.randint(1, 20), 0
        return {"observation": {"text": f"What is {self.a} + {self.b}?"}, "reward": None, "done": False}

    def step(self, data: dict) -> dict:
        if not isinstance(data.get("answer"), str):
            return {"error": "VALIDATION_ERROR", "message": "answer: Field required"}
        self.tries += 1
        numbers = re.findall(r"-?\d+", data["answer"])
        if numbers and int(numbers[-1]) == self.a + self.b:
            return {"observation": {"text": "Right."}, "reward": 1.0, "done": True}
        if self.tries >= 2:
            return {"observation": {"text": "Wrong."}, "reward": 0.0, "done": True}
        return {"observation": {"text": "Not quite. Try again."}, "reward": None, "done": False}


class ProtocolServer:
    """One OpenEnv environment server on 127.0.0.1 (a free port): one AdditionEnv per WebSocket
    session. `mode`: "ok", "silent" (never answers a step), "garbage" (answers a step with text
    that is not JSON). `received`: (session, message) in arrival order."""

    def __init__(self, mode: str = "ok", max_sessions: int = 64, schema: dict | None = None):
        from websockets.sync.server import serve

        self.mode, self.max_sessions, self.schema = mode, max_sessions, schema or ANSWER_SCHEMA
        self.received: list[tuple[int, dict]] = []
        self.active = self.opened = 0
        self.lock = threading.Lock()
        self.server = serve(self.session, "127.0.0.1", 0, process_request=self.http)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def http(self, connection, request):
        if request.path == "/health":
            return connection.respond(200, json.dumps({"status": "healthy"}))
        if request.path == "/schema":
            return connection.respond(200, json.dumps(self.schema))
        return None if request.path == "/ws" else connection.respond(404, "not found")

    def session(self, connection) -> None:
        from websockets.exceptions import ConnectionClosed

        with self.lock:
            full = self.active >= self.max_sessions
            if not full:
                self.active, self.opened, sid = self.active + 1, self.opened + 1, self.opened
        if full:
            connection.send(json.dumps({"type": "error", "data": {
                "message": "capacity", "code": "CAPACITY_REACHED", "active_sessions": self.active,
                "max_sessions": self.max_sessions}}))
            return
        env = AdditionEnv()
        try:
            for _ in range(50):  # bounded: no episode here sends more
                try:
                    message = json.loads(connection.recv(timeout=10))
                except (TimeoutError, ConnectionClosed):
                    return
                with self.lock:
                    self.received.append((sid, message))
                if message["type"] == "close":
                    return
                if message["type"] == "step" and self.mode == "silent":
                    continue
                if message["type"] == "step" and self.mode == "garbage":
                    connection.send("<html>oops</html>")
                    continue
                result = env.reset(message["data"]) if message["type"] == "reset" else env.step(message["data"])
                if "error" in result:
                    reply = {"type": "error", "data": {"message": result["message"], "code": result["error"]}}
                else:
                    reply = {"type": "observation", "data": result}
                connection.send(json.dumps(reply))
        finally:
            with self.lock:
                self.active -= 1

    def settled(self) -> list[tuple[int, dict]]:
        """`received` once every session has ended (a client's last message, its close, reaches the
        server's thread after the client has moved on); waits at most 10 s."""
        for _ in range(200):
            with self.lock:
                if self.active == 0:
                    return list(self.received)
            threading.Event().wait(0.05)
        raise AssertionError(f"{self.active} sessions still open after 10 s")

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture()
def env_server():
    servers: list[ProtocolServer] = []

    def start(**kw) -> ProtocolServer:
        servers.append(ProtocolServer(**kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def sum_for(seed: int) -> tuple[str, int]:
    rng = random.Random(seed)
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    return f"What is {a} + {b}?", a + b


# ----------------------------------------------------------------------------- mapping, no server


def test_the_action_text_field_is_the_only_string_property_besides_metadata():
    assert text_field(ANSWER_SCHEMA["action"]) == "answer"
    assert text_field({"properties": {"metadata": {}, "x": {"type": "integer"}}}) is None
    assert text_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}}) is None
    assert text_field({"properties": {}}) is None


def test_observation_text():
    assert observation_text({"text": "What is 2 + 3?"}) == "What is 2 + 3?"
    assert observation_text({"echoed": "hi", "length": 2}) == '{"echoed": "hi", "length": 2}'
    assert observation_text({"text": "x", "done": False, "reward": None, "metadata": {}}) == "x"
    assert observation_text({}) == ""


def test_a_turn_becomes_the_text_field_or_a_json_object():
    one = Server("openenv:http://h:1", "http://h:1", "answer", ("answer",))
    assert action_data("  7 ", one) == {"answer": "  7 "}  # the turn as the model wrote it
    two = Server("openenv:http://h:1", "http://h:1", None, ("row", "col"))
    assert action_data('{"row": 1, "col": 2}', two) == {"row": 1, "col": 2}
    assert action_data("row 1", two) == "error: reply with a JSON object with the fields row, col"
    assert action_data("[1, 2]", two) == "error: reply with a JSON object with the fields row, col"


def test_reset_data_is_the_record_with_one_seed_per_record():
    a = reset_data({"prompt": "p", "answer": "3"})
    assert a == reset_data({"prompt": "p", "answer": "3"})  # the episodes of one group reset alike
    assert a["seed"] != reset_data({"prompt": "q", "answer": "3"})["seed"]
    assert 0 <= a["seed"] < 2**31 and a["prompt"] == "p"
    assert reset_data({"prompt": "p", "seed": 5}) == {"prompt": "p", "seed": 5}  # the record's own seed
    assert "bad" not in reset_data({"prompt": "p", "bad": {1, 2}}) and "nan" not in reset_data({"nan": float("nan")})


def test_replies_are_checked():
    server = Server("openenv:http://h:1", "http://h:1", "answer", ("answer",))

    def reply(data, kind="observation"):
        return json.dumps({"type": kind, "data": data})

    ok = {"observation": {"text": "t"}, "reward": True, "done": False}  # OpenEnv allows a bool reward: 1 or 0
    assert parse_reply(reply(ok), server, "step") == ok
    for data, match in [({"observation": {}, "reward": float("inf")}, "reward after step is inf"),
                        ({"observation": {}, "reward": "1"}, "reward after step is '1'"),
                        ({"observation": {}, "done": "yes"}, "done after step is 'yes'"),
                        ({"reward": 1.0}, "is not an observation")]:
        with pytest.raises(UserError, match=match):
            parse_reply(reply(data), server, "step")
    with pytest.raises(UserError, match=r"refused reset: EXECUTION_ERROR: boom$"):
        parse_reply(reply({"message": "boom", "code": "EXECUTION_ERROR"}, "error"), server, "reset")


@pytest.mark.parametrize("spec", ["openenv:", "openenv:127.0.0.1:8000", "openenv:ftp://h:1", "openenv:http://"])
def test_bad_urls(spec):
    with pytest.raises(UserError, match=r"expected 'openenv:http://HOST:PORT'"):
        base_url(spec)
    assert base_url("openenv:http://127.0.0.1:8000/") == "http://127.0.0.1:8000"


# ----------------------------------------------------------------------------- against a server


def test_an_episode_on_the_server(env_server):
    srv = env_server()
    server = connect(f"openenv:{srv.url}")
    assert server.action_field == "answer" and server.ws_url == srv.url.replace("http", "ws") + "/ws"
    question, right = sum_for(7)
    episode = OpenEnvEpisode(server)
    assert episode.reset({"prompt": "p", "seed": 7}) == [{"role": "user", "content": question}]
    step = episode.step([], "It is 1000.")
    assert (step.observation, step.reward, step.done) == ([{"role": "user", "content": "Not quite. Try again."}],
                                                          None, False)
    step = episode.step([], f"The sum is {right}")
    assert (step.observation, step.reward, step.done) == (None, 1.0, True)
    assert episode.connection is None  # done closes the session
    assert [m for _, m in srv.settled()] == [
        {"type": "reset", "data": {"prompt": "p", "seed": 7}}, {"type": "step", "data": {"answer": "It is 1000."}},
        {"type": "step", "data": {"answer": f"The sum is {right}"}}, {"type": "close"}]


def test_a_refused_action_is_an_observation(env_server):
    srv = env_server(schema={**ANSWER_SCHEMA, "action": {"properties": {"answer": {"type": "string"},
                                                                          "note": {"type": "string"}}}})
    episode = OpenEnvEpisode(connect(f"openenv:{srv.url}"))
    episode.reset({"prompt": "p"})
    step = episode.step([], "12")  # two fields: the turn must be JSON
    assert step.observation[0]["content"].startswith("error: reply with a JSON object") and not step.done
    step = episode.step([], '{"note": "no answer"}')  # the server's validation error, for the model to read
    assert step.observation == [{"role": "user", "content": "error: answer: Field required"}]
    assert step.info == {"action_error": True} and step.reward is None and not step.done
    episode.close()
    episode.close()  # twice is fine
    assert [m["type"] for _, m in srv.settled()] == ["reset", "step", "close"]


@pytest.mark.parametrize(("kw", "match"), [
    ({"mode": "garbage"}, r"the server's reply to step is not JSON: '<html>oops</html>'"),
    ({"mode": "silent"}, r"no reply to step within 0.5 s"),
])
def test_bad_replies_are_one_line(env_server, kw, match):
    srv = env_server(**kw)
    server = connect(f"openenv:{srv.url}", timeout_s=0.5)
    episode = OpenEnvEpisode(server)
    episode.reset({"prompt": "p"})
    with pytest.raises(UserError, match=match) as e:
        episode.step([], "3")
    assert "\n" not in str(e.value)


def test_a_full_server_names_max_concurrent_envs(env_server):
    srv = env_server(max_sessions=1)
    server = connect(f"openenv:{srv.url}")
    first = OpenEnvEpisode(server)
    first.reset({"prompt": "p"})
    with pytest.raises(UserError, match=r"holds at most 1 sessions .* max_concurrent_envs"):
        OpenEnvEpisode(server).reset({"prompt": "q"})
    first.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_and_wrong_servers(env_server):
    with pytest.raises(UserError, match=r"^env 'openenv:http://127.0.0.1:\d+': cannot reach .*/health: .*"
                                        "start the environment server first$"):
        make_env_factory(f"openenv:http://127.0.0.1:{free_port()}")
    srv = env_server(schema={"tools": []})
    with pytest.raises(UserError, match=r"/schema has no action schema"):
        make_env_factory(f"openenv:{srv.url}")


def test_the_factory_makes_one_episode_per_call(env_server):
    srv = env_server()
    make_env = make_env_factory(f"openenv:{srv.url}")
    assert make_env.prompts is None and make_env.env_spec == f"openenv:{srv.url}"
    a, b = make_env(), make_env()
    assert isinstance(a, OpenEnvEpisode) and a is not b and srv.opened == 0  # sessions open at reset


def test_the_factory_waits_env_timeout_for_each_reply(env_server):
    srv = env_server(mode="silent")
    make_env = make_env_factory(f"openenv:{srv.url}", timeout_s=0.5)
    episode = make_env()
    episode.reset({"prompt": "p"})
    with pytest.raises(UserError, match=r"no reply to step within 0.5 s$"):
        episode.step([], "3")
    episode.close()


def test_env_timeout_is_an_option_with_help():
    from rlhfkit.core.command_line import help_text
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.ppo_config import PPOConfig

    for cls in (GRPOConfig, PPOConfig):
        assert build_config(cls, {"model": "m", "env": "openenv:http://127.0.0.1:1"}).env_timeout == 60.0
        assert build_config(cls, {"model": "m", "env_timeout": "2.5"}).env_timeout == 2.5
        for bad in ("0", "-1", "inf", "nan"):
            with pytest.raises(UserError, match=r"^env_timeout.*(must be > 0|finite number)"):
                build_config(cls, {"model": "m", "env_timeout": bad})
    text = " ".join(help_text(GRPOConfig, "rlhfkit grpo").split())
    assert "openenv:http://HOST:PORT (an OpenEnv environment server" in text
    assert "env_timeout" in text and "seconds to wait for the environment server" in text


# ----------------------------------------------------------------------------- training through it


def test_grpo_trains_through_the_adapter(env_server, tmp_path, tiny_model_dir):
    from rlhfkit.trainers.grpo import train as grpo_train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    srv = env_server()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"problem {i}", "seed": i}) + "\n" for i in range(8)))
    cfg = build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(prompts), env=f"openenv:{srv.url}", iterations=1,
        rollout_batch_size=8, group_size=4, micro_batch_size=4, mini_batch_size=4, max_new_tokens=4, max_turns=2,
        max_total_tokens=64, num_eval_prompts=0, dtype="fp32", update_epochs=1, output_dir=str(tmp_path / "runs"),
        run_name="t", quiet=True, tensorboard=False, drop_zero_std_groups=False, ratio_check_tol=1e-5))
    grpo_train(cfg)
    (row,) = [json.loads(x) for x in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]
    assert row["params/ratio_first_microbatch_maxdev"] < 1e-5
    assert 1.0 <= row["rollout/turns_mean"] <= 2.0
    received = srv.settled()
    resets = [(sid, m["data"]) for sid, m in received if m["type"] == "reset"]
    assert len(resets) == 8 and srv.opened == 8  # one session per episode
    seeds = Counter(d["seed"] for _, d in resets)  # the records' own seeds: each group's episodes reset alike
    assert set(seeds) <= set(range(8)) and all(n % 4 == 0 for n in seeds.values())
    closes = {sid for sid, m in received if m["type"] == "close"}
    steps = [m for _, m in received if m["type"] == "step"]
    assert closes == {sid for sid, _ in resets} and srv.active == 0  # every session ended with its episode
    assert steps and all(set(m["data"]) == {"answer"} for m in steps)


def test_grpo_stops_on_a_server_slower_than_env_timeout(env_server, tmp_path, tiny_model_dir):
    from rlhfkit.trainers.grpo import train as grpo_train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    srv = env_server(mode="silent")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"problem {i}", "seed": i}) + "\n" for i in range(4)))
    cfg = build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(prompts), env=f"openenv:{srv.url}", env_timeout=0.5, iterations=1,
        rollout_batch_size=4, group_size=4, micro_batch_size=4, mini_batch_size=4, max_new_tokens=4, max_turns=2,
        max_total_tokens=64, num_eval_prompts=0, dtype="fp32", update_epochs=1, output_dir=str(tmp_path / "runs"),
        run_name="t", quiet=True, tensorboard=False))
    with pytest.raises(UserError, match=r"no reply to step within 0.5 s") as e:
        grpo_train(cfg)
    assert "\n" not in str(e.value)


def test_the_documented_example_on_openenvs_own_server(tmp_path, monkeypatch):
    """docs/environments.md's arith_env.py served by openenv-core itself (where it is installed)."""
    pytest.importorskip("openenv")
    import importlib
    import pathlib

    import uvicorn

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if b.startswith('"""arith_env.py')]
    (tmp_path / "arith_env.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    app = importlib.import_module("arith_env").app
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):  # up to 20 s for the server to start
            if server.started:
                break
            thread.join(0.1)
        make_env = make_env_factory(f"openenv:http://127.0.0.1:{server.config.port}")
        question, right = sum_for(3)
        episode = make_env()
        assert episode.reset({"prompt": "p", "seed": 3})[0]["content"] == question + " Answer with just the number."
        assert episode.step([], "0").observation[0]["content"] == "Not quite. Try again with just the number."
        assert tuple(episode.step([], str(right))) == (None, 1.0, True)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
