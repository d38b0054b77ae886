"""Agent episodes: the user's own OpenAI-client code drives the policy (`agent=python:FILE:FN`).

For each episode the driver opens an episode on the server (rollout/openai_server.py), makes a
real `openai.OpenAI` client whose API key is that episode's key, and calls `FN(client, record)`.
FN talks to the model as it would to any OpenAI-compatible server, runs its tools, and returns
the episode's reward: a number, or a list with one number per model reply (per-turn rewards, in
the order the replies were made). An `async def FN` gets an `openai.AsyncOpenAI` client instead.

Episodes run concurrently, at most `concurrency` at a time, each in its own thread (an async FN
in its own event loop there). One that fails is dropped, and the reason counted:
  raised      FN raised an exception
  rejected    the server refused one of its requests (unknown model name, unsupported parameter,
              prompt too long, call limit): the episode is dropped even if FN caught the error
  timeout     FN did not return within `timeout_s`; its key is revoked, so its next request fails.
              (Python cannot stop a thread: an FN stuck in pure computation keeps its thread.)
  no_call     FN returned without a reply from the model: nothing to train on
  bad_reward  FN returned something other than a finite number (or a list of one per reply)
The driver's loop ends when every episode has ended or timed out, so it is bounded by
ceil(episodes / concurrency) x timeout_s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import numbers
import threading
import time
from collections.abc import Callable

from rlhfkit.core.imports import first_line, get_attribute, is_file_source, load_source, split_target
from rlhfkit.errors import UserError
from rlhfkit.rollout.episodes import EpisodeRecord

REASONS = ("raised", "rejected", "timeout", "no_call", "bad_reward")
RATE_METRICS = {"raised": "agent/raised_rate", "rejected": "agent/rejected_rate", "timeout": "agent/timeout_rate",
                "no_call": "agent/no_call_rate", "bad_reward": "agent/bad_reward_rate"}  # glossary entries


@dataclasses.dataclass
class Outcome:
    """How one episode ended: `reason` "ok" or one of REASONS (with `detail`), its reward (a number
    or per-reply numbers) when ok, and what the server recorded."""

    index: int
    record: dict
    episode: EpisodeRecord
    reason: str = "ok"
    detail: str = ""
    reward: float | list[float] | None = None
    seconds: float = 0.0


def load_agent(spec: str) -> Callable:
    """FN of `python:FILE.py:FN`, `python:MODULE:FN` or `FILE.py:FN`: a callable of (client, record)."""
    label = f"agent {spec!r}"
    rest = spec[len("python:"):] if spec.startswith("python:") else spec
    parts = split_target(rest)
    if parts is None or (not spec.startswith("python:") and not is_file_source(parts[0])):
        raise UserError(f"{label}: expected 'python:FILE.py:FN', 'python:MODULE:FN' or 'FILE.py:FN'")
    source, attr = parts
    fn = get_attribute(load_source(source, label), source, attr, label)
    if not callable(fn):
        raise UserError(f"{label}: {attr!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise UserError(f"{label}: {attr} must take two arguments, (client, record)") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    return fn


def checked_reward(value: object, replies: int) -> tuple[float | list[float] | None, str]:
    """(the reward, "") or (None, why it is not one): a finite number, or a list of `replies`
    finite numbers."""
    def finite(x: object) -> bool:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))

    if finite(value):
        return float(value), ""
    if isinstance(value, (list, tuple)) and value and all(finite(x) for x in value):
        if len(value) != replies:
            return None, f"returned {len(value)} per-turn rewards for {replies} model replies"
        return [float(x) for x in value], ""
    return None, f"returned {type(value).__name__} {value!r:.60}, not a finite number or a list of them"


def _client(base_url: str, key: str, timeout_s: float, is_async: bool):
    try:
        import openai
    except ImportError:
        raise UserError("agent=... needs the openai client package: pip install openai") from None
    cls = openai.AsyncOpenAI if is_async else openai.OpenAI
    return cls(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s)


def _run_one(fn: Callable, out: Outcome, base_url: str, timeout_s: float) -> None:
    """Call FN for one episode and fill `out.reward` or `out.reason`/`out.detail` (a timed-out
    episode's outcome is already set and stays)."""
    is_async = inspect.iscoroutinefunction(fn)
    client = _client(base_url, out.episode.key, timeout_s, is_async)
    t0 = time.monotonic()
    try:
        if is_async:
            value = asyncio.run(asyncio.wait_for(fn(client, out.record), timeout_s))
        else:
            value = fn(client, out.record)
        error = None
    except BaseException as e:  # noqa: BLE001 - any failure of user code drops its episode only
        value, error = None, f"{type(e).__name__}: {first_line(e)}"
        if isinstance(e, asyncio.TimeoutError):
            error = "timeout"
    finally:
        close = getattr(client, "close", None)
        if callable(close) and not is_async:
            close()
    seconds = time.monotonic() - t0
    with out.episode.lock:
        if out.reason != "ok":  # timed out meanwhile
            return
        out.seconds = seconds
        if error == "timeout":
            out.reason, out.detail = "timeout", f"no result within agent_timeout={timeout_s:g} s"
        elif out.episode.rejected:
            out.reason, out.detail = "rejected", f"the server refused a request: {out.episode.rejected[0]}"
        elif error is not None:
            out.reason, out.detail = "raised", error
        elif not out.episode.calls:
            out.reason, out.detail = "no_call", "returned without calling the model"
        else:
            reward, why = checked_reward(value, out.episode.replies)
            out.reward, out.reason, out.detail = reward, ("ok" if why == "" else "bad_reward"), why
        out.episode.closed = True


def run_episodes(fn: Callable, records: list[dict], api, base_url: str, concurrency: int,
                 timeout_s: float, poll_s: float = 0.02) -> list[Outcome]:
    """One episode per record through `api` (an openai_server.Api with episodes on) at `base_url`
    (ending in /v1); at most `concurrency` at once; each ends, fails or times out (module docstring)."""
    outcomes = [Outcome(i, r, api.open_episode()) for i, r in enumerate(records)]
    pending = list(range(len(records)))[::-1]
    running: dict[int, float] = {}  # episode -> start time
    threads: dict[int, threading.Thread] = {}
    while pending or running:
        now = time.monotonic()
        for i, start in list(running.items()):
            out = outcomes[i]
            if not threads[i].is_alive():
                del running[i]
            elif now - start > timeout_s:
                with out.episode.lock:
                    out.reason, out.detail = "timeout", f"no result within agent_timeout={timeout_s:g} s"
                    out.seconds = now - start
                api.close_episode(out.episode)
                del running[i]
        while pending and len(running) < concurrency:
            i = pending.pop()
            threads[i] = threading.Thread(target=_run_one, args=(fn, outcomes[i], base_url, timeout_s),
                                          name=f"rlhfkit-agent-{i}", daemon=True)
            running[i] = time.monotonic()
            threads[i].start()
        if running:
            time.sleep(poll_s)
    for out in outcomes:
        api.close_episode(out.episode)
    return outcomes


def outcome_metrics(outcomes: list[Outcome]) -> dict[str, float]:
    """agent/error_rate (episodes dropped), agent/REASON_rate per reason, agent/calls_per_episode
    and agent/episode_s (mean wall time of an episode)."""
    n = max(len(outcomes), 1)
    metrics = {"agent/error_rate": sum(o.reason != "ok" for o in outcomes) / n}
    metrics.update({RATE_METRICS[r]: sum(o.reason == r for o in outcomes) / n for r in REASONS})
    metrics["agent/calls_per_episode"] = sum(len(o.episode.calls) for o in outcomes) / n
    metrics["agent/episode_s"] = sum(o.seconds for o in outcomes) / n
    return metrics
