"""One iteration's agent episodes as a Rollout: the server on the current policy (127.0.0.1, a free
port, for the length of the call), the user's FN per record (rollout/agent.py), and the training
rows cut from what the server recorded (rollout/episodes.py).

Rows: one or more per episode that did not fail; `info["episode"]` holds each row's episode
number (the record's index in `records`), so the trainer can take its baseline over episodes,
not rows. Rows carry the episode's reward (module docstring of rollout/episodes.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from rlhfkit.data.prompts import info_lists
from rlhfkit.errors import UserError
from rlhfkit.rollout.agent import Outcome, outcome_metrics, run_episodes
from rlhfkit.rollout.core import Rollout, SamplingParams
from rlhfkit.rollout.episodes import cut_rows, last_reply, rows_to_rollout
from rlhfkit.rollout.openai_server import Api, OpenAIServer, Served
from rlhfkit.rollout.serving import BatchedSampler


class AllEpisodesFailed(UserError):
    """Every episode of a rollout failed: nothing to train on."""


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """How agent episodes run (the trainer's agent_* options)."""

    fn: Callable
    concurrency: int = 8
    timeout_s: float = 120.0
    max_calls: int = 32
    model_name: str = "policy"
    window_s: float = 0.02
    max_rows: int = 256


def serve_policy(model, tok, params: SamplingParams, settings: AgentSettings, max_prompt_tokens: int, seed: int,
                 fmt=None, context: Callable = contextlib.nullcontext) -> OpenAIServer:
    """An OpenAIServer (not started) on `model` with episodes on, sampling at params.temperature,
    replies capped at params.max_new_tokens."""
    stop_ids = tuple(params.stop_ids) or (tok.eos_token_id,)
    sampler = BatchedSampler(model, stop_ids, tok.pad_token_id, window_s=settings.window_s,
                             max_rows=settings.max_rows, seed=seed, context=context)
    served = Served(tok, sampler, settings.model_name, params.max_new_tokens, max_prompt_tokens,
                    temperature=params.temperature, fmt=fmt)
    return OpenAIServer(Api(served, episodes=True, max_calls_per_episode=settings.max_calls,
                            request_timeout_s=settings.timeout_s))


def first_failure(outcomes: list[Outcome]) -> str:
    bad = next(o for o in outcomes if o.reason != "ok")
    return f"episode {bad.index}: {bad.reason}: {bad.detail}"


def agent_rollout(model, tok, records: list[dict], params: SamplingParams, settings: AgentSettings,
                  max_prompt_tokens: int, seed: int, fmt=None,
                  context: Callable = contextlib.nullcontext) -> tuple[Rollout, list[Outcome], dict[str, float]]:
    """(Rollout of the episodes that did not fail, every episode's Outcome, agent/* metrics, with
    agent/prompt_tokens_per_episode: prompt tokens the server prefilled). AllEpisodesFailed when
    none is left."""
    server = serve_policy(model, tok, params, settings, max_prompt_tokens, seed, fmt, context)
    with server:
        outcomes = run_episodes(settings.fn, records, server.api, server.url + "/v1", settings.concurrency,
                                settings.timeout_s)
    metrics = outcome_metrics(outcomes)
    metrics["agent/prompt_tokens_per_episode"] = server.api.served.sampler.prompt_tokens / max(len(records), 1)
    rows, rewards, episode, completions = [], [], [], []
    for o in outcomes:
        if o.reason != "ok":
            continue
        for row in cut_rows(o.episode.calls):
            rows.append(row)
            rewards.append(o.reward)
            episode.append(o.index)
            completions.append(tok.decode(last_reply(row), skip_special_tokens=True).strip())
    if not rows:
        raise AllEpisodesFailed(f"agent: every episode failed; the first: {first_failure(outcomes)}")
    device = next(model.parameters()).device
    kept = [records[i] for i in episode]
    rollout = dataclasses.replace(rows_to_rollout(rows, rewards, tok.pad_token_id, device),
                                  prompts=[str(r.get("prompt", "")) for r in kept], completions=completions,
                                  info={**info_lists(kept), "episode": episode})
    metrics["agent/rows_per_episode"] = len(rows) / max(sum(o.reason == "ok" for o in outcomes), 1)
    return rollout, outcomes, metrics
