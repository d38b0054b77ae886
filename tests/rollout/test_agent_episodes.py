"""Agent episodes through the OpenAI-compatible server with the real openai client: batching,
token-exact rows (teacher-forced log-probs equal the recorded ones), edited conversations, per-turn
rewards and every bad input the driver must survive."""

from __future__ import annotations

import math
import time

import pytest
import torch

from rlhfkit.core.devices import HOST
from rlhfkit.models.trunk import position_ids_from_mask
from rlhfkit.rollout.agent_rollout import AgentSettings, AllEpisodesFailed, agent_rollout
from rlhfkit.rollout.core import SamplingParams
from rlhfkit.rollout.episodes import Call, cut_rows
from rlhfkit.rollout.serving import BatchedSampler, Sample

from tiny_lm import build_tiny_model, build_tokenizer

pytest.importorskip("openai")

RECORDS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]


@pytest.fixture(scope="module")
def lm():
    tok = build_tokenizer()
    return build_tiny_model(len(tok), seed=1).eval(), tok


def run(lm, fn, records=RECORDS, **kw):
    model, tok = lm
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    settings = AgentSettings(fn=fn, **{"concurrency": 4, "timeout_s": 30.0, **kw})
    return agent_rollout(model, tok, records, params, settings, max_prompt_tokens=400, seed=0)


def two_turns(client, record):
    messages = [{"role": "user", "content": record["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "Sure?"}]
    second = client.chat.completions.create(model="policy", messages=messages)
    return float(second.choices[0].message.content == record["answer"])


def teacher_forced(model, rollout, temperature=1.0):
    """log pi(token) of every response token from one forward over query + response (B, R)."""
    ids, mask = rollout.input_ids, rollout.attention_mask
    P = rollout.query_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logp = torch.log_softmax(logits[:, P - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(2, rollout.response_ids[..., None]).squeeze(2)


def test_rows_hold_exactly_the_sampled_tokens_and_their_logprobs(lm):
    rollout, outcomes, metrics = run(lm, two_turns)
    assert [o.reason for o in outcomes] == ["ok"] * len(RECORDS)
    assert rollout.response_ids.shape[0] == len(RECORDS)  # appended conversations: one row per episode
    assert rollout.info["episode"] == list(range(len(RECORDS)))
    for b, o in enumerate(outcomes):  # the row's model tokens are the two replies, in order
        sampled = [t for c in o.episode.calls for s in c.replies for t in s.ids]
        row = rollout.response_ids[b][rollout.response_mask[b].bool()].tolist()
        assert row == sampled
    tf = teacher_forced(lm[0], rollout)
    m = rollout.response_mask.bool()
    # the ids the teacher-forced pass scores are those the sampler drew, in the same context
    torch.testing.assert_close(tf[m], rollout.sampler_logprobs[m], rtol=0, atol=1e-4)
    assert metrics["agent/error_rate"] == 0.0 and metrics["agent/calls_per_episode"] == 2.0


def test_an_edited_conversation_trains_each_sampled_token_once(lm):
    def editing(client, record):
        first = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": record["prompt"]}])
        reply = first.choices[0].message
        # the agent rewrites its own question and re-orders: not an extension of the first call
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Again: " + record["prompt"]},
                    reply, {"role": "user", "content": "Sure?"}]
        client.chat.completions.create(model="policy", messages=messages)
        return 1.0

    rollout, outcomes, _ = run(lm, editing, RECORDS[:2])
    assert rollout.response_ids.shape[0] == 4  # two rows per episode
    assert rollout.info["episode"] == [0, 0, 1, 1]
    for k, o in enumerate(outcomes):
        replies = [list(s.ids) for c in o.episode.calls for s in c.replies]
        rows = [rollout.response_ids[b][rollout.response_mask[b].bool()].tolist() for b in (2 * k, 2 * k + 1)]
        assert rows == replies  # each reply trained once, in its own row
    tf = teacher_forced(lm[0], rollout)
    m = rollout.response_mask.bool()
    torch.testing.assert_close(tf[m], rollout.sampler_logprobs[m], rtol=0, atol=1e-4)


def test_cut_rows_rules():
    """Golden: a call that extends a row continues it; an edited prompt starts a row; n > 1 forks."""
    s = lambda *ids: Sample(tuple(ids), tuple(-0.5 for _ in ids), True)  # noqa: E731
    calls = [Call((1, 2), (s(10, 11),)),
             Call((1, 2, 10, 11, 3), (s(12), s(13))),  # extends row 0; second choice forks
             Call((9, 2), (s(14),))]  # edited: a new row
    rows = cut_rows(calls)
    assert [r.ids for r in rows] == [[1, 2, 10, 11, 3, 12], [1, 2, 10, 11, 3, 13], [9, 2, 14]]
    assert [r.model for r in rows] == [[0, 0, 1, 1, 0, 1], [0, 0, 0, 0, 0, 1], [0, 0, 1]]
    assert [r.ends for r in rows] == [[(0, 3), (1, 5)], [(2, 5)], [(3, 2)]]


def test_per_turn_rewards_sit_on_each_replys_last_token(lm):
    def per_turn(client, record):
        two_turns(client, record)
        return [0.25, 1.0]

    rollout, _, _ = run(lm, per_turn, RECORDS[:1])
    m = rollout.response_mask[0]
    turn = rollout.turn_rewards[0]
    ends = [i for i in range(len(m)) if m[i] == 1 and (i + 1 == len(m) or m[i + 1] == 0)]
    assert turn[ends].tolist() == [0.25, 1.0] and float(turn.sum()) == 1.25
    assert float(rollout.scores[0]) == 1.25


def test_requests_arriving_together_share_one_decoding_loop(lm):
    model, tok = lm
    sampler = BatchedSampler(model, (tok.eos_token_id,), tok.pad_token_id, window_s=0.0)
    futures = [sampler.submit([1, 5, 6 + i], 2, 1.0, 4) for i in range(5)]  # queued before the worker starts
    with sampler:
        results = [f.result(timeout=60) for f in futures]
    assert sampler.batches == 1 and sampler.rows == 10
    assert all(len(r) == 2 and all(1 <= len(s.ids) <= 4 for s in r) for r in results)


def test_batched_rows_equal_rows_sampled_alone_at_temperature_0(lm):
    """Left padding and dropped rows change nothing: greedy rows match one-row calls."""
    model, tok = lm
    from rlhfkit.rollout.serving import sample_rows

    prompts = [[1, 5, 6], [1, 7, 8, 9, 10, 11], [1, 12]]
    together = sample_rows(model, prompts, [0.0] * 3, [5, 3, 5], (2,), 2)
    alone = [sample_rows(model, [p], [0.0], [k], (2,), 2)[0] for p, k in zip(prompts, [5, 3, 5])]
    assert [s.ids for s in together] == [s.ids for s in alone]
    for a, b in zip(together, alone):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def bad_agents():
    def raises(client, record):
        raise ValueError("tool crashed")

    def nan(client, record):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        return math.nan

    def none(client, record):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])

    def text(client, record):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        return "1.0"

    def hangs(client, record):
        time.sleep(6)
        return 1.0

    def wrong_model(client, record):
        try:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        except Exception:  # noqa: BLE001 - the agent swallows the error: still dropped
            pass
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        return 1.0

    def unsupported(client, record):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], top_p=0.5)
        return 1.0

    def no_call(client, record):
        return 1.0

    return {"raised": raises, "bad_reward": nan, "bad_reward ": none, "bad_reward  ": text, "timeout": hangs,
            "rejected": wrong_model, "rejected ": unsupported, "no_call": no_call}


def test_bad_agents_are_dropped_with_their_reason_and_the_rest_trains(lm):
    agents = list(bad_agents().items())
    fns = {i: fn for i, (_, fn) in enumerate(agents)}

    def dispatch(client, record):
        if record["k"] < len(agents):
            return fns[record["k"]](client, record)
        return two_turns(client, {"prompt": "hi", "answer": "1"})

    records = [{"prompt": "p", "k": k} for k in range(len(agents) + 2)]
    rollout, outcomes, metrics = run(lm, dispatch, records, timeout_s=2.0, concurrency=len(records))
    assert [o.reason for o in outcomes] == [name.strip() for name, _ in agents] + ["ok", "ok"]
    assert rollout.info["episode"] == [len(agents), len(agents) + 1]  # the two good ones train
    assert metrics["agent/error_rate"] == pytest.approx(len(agents) / len(records))
    assert metrics["agent/timeout_rate"] == pytest.approx(1 / len(records))
    assert "tool crashed" in outcomes[0].detail and "gpt-4o" in outcomes[5].detail and "top_p" in outcomes[6].detail


def test_every_episode_failing_is_one_line_naming_the_first_error(lm):
    def raises(client, record):
        raise RuntimeError("no tools here")

    with pytest.raises(AllEpisodesFailed, match="every episode failed; the first: episode 0: raised: RuntimeError: no tools"):
        run(lm, raises, RECORDS[:3])


def test_the_server_listens_on_loopback_and_is_closed_after_the_rollout(lm):
    import socket

    from rlhfkit.rollout.agent_rollout import serve_policy

    model, tok = lm
    server = serve_policy(model, tok, SamplingParams(max_new_tokens=2), AgentSettings(fn=two_turns), 100, 0)
    host, port = server.httpd.server_address[:2]
    assert host == "127.0.0.1"
    with server:
        pass
    with pytest.raises(OSError), socket.create_connection((host, port), timeout=2):
        pass
    assert HOST.type == "cpu"


def test_a_turn_that_extends_a_cached_row_runs_only_its_new_tokens(lm):
    """KV reuse: second calls start from the first calls' cached K/V (prompt + reply but its last
    token; two rows of different cached lengths) and give the tokens and log-probs of a full
    prefill; a repeated prompt without a cached prefix in the same batch is unaffected."""
    from rlhfkit.rollout.prefix_cache import PrefixCache
    from rlhfkit.rollout.serving import sample_rows

    model, _ = lm
    cache = PrefixCache()
    starts = [[1, 5, 6, 7], [1, 8, 9, 10, 11, 12, 13, 14, 15]]
    first = sample_rows(model, starts, [0.0, 0.0], [4, 2], (2,), 2, cache)
    assert set(cache.entries) == {tuple(p) + s.ids[:-1] for p, s in zip(starts, first)}
    prompts = [p + list(s.ids) + [9, 10][: k + 1] for k, (p, s) in enumerate(zip(starts, first))] + [[1, 3], [1, 3]]
    reused = sample_rows(model, prompts, [0.0] * 4, [5] * 4, (2,), 2, cache)
    assert cache.hits == 2 and cache.reused_tokens == sum(len(p) + len(s.ids) - 1 for p, s in zip(starts, first))
    plain = sample_rows(model, prompts, [0.0] * 4, [5] * 4, (2,), 2)
    assert [s.ids for s in reused] == [s.ids for s in plain]
    for a, b in zip(reused, plain):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_64_concurrent_agents_all_get_answers(lm):
    def one_call(client, record):
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": record["prompt"]}])
        return float(reply.choices[0].finish_reason in ("stop", "length"))

    records = [{"prompt": f"q{i}"} for i in range(64)]
    rollout, outcomes, metrics = run(lm, one_call, records, concurrency=64)
    assert [o.reason for o in outcomes] == ["ok"] * 64 and rollout.response_ids.shape[0] == 64


def test_an_async_agent_gets_an_async_client_and_its_timeout(lm):
    import asyncio

    async def solve(client, record):
        reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        if record["k"] == 1:
            await asyncio.sleep(30)  # past agent_timeout: cancelled at this await
        return float(len(reply.choices) == 1)

    records = [{"prompt": "p", "k": k} for k in range(3)]
    rollout, outcomes, _ = run(lm, solve, records, timeout_s=3.0)
    assert [o.reason for o in outcomes] == ["ok", "timeout", "ok"]
    assert rollout.info["episode"] == [0, 2]


def test_a_reply_to_a_client_that_left_ends_the_connection_quietly():
    """A timed-out episode's client is closed while its request is served: writing the reply then
    fails, which must end that connection, not print a traceback per request into the run's log."""
    import io
    import types

    from rlhfkit.rollout.openai_server import _Handler

    class Gone(io.RawIOBase):
        def write(self, b):
            raise BrokenPipeError(32, "Broken pipe")

    handler = object.__new__(_Handler)
    handler.wfile, handler.request_version, handler.command = Gone(), "HTTP/1.1", "POST"
    handler.requestline, handler.client_address = "POST /v1/chat/completions HTTP/1.1", ("127.0.0.1", 1)
    handler.server, handler.close_connection = types.SimpleNamespace(verbose=False), False
    handler._reply(200, {"ok": True})
    assert handler.close_connection
