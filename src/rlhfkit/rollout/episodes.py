"""Agent episodes recorded by the server, and the training rows cut from them, token for token.

While an agent runs, the server (rollout/openai_server.py) appends one `Call` per chat or
completion request of its episode: the prompt ids it built (chat template included) and the
sampled replies (ids, log-probs, stopped). Nothing is ever re-tokenised afterwards: the training
rows are made of these ids.

How an episode is cut into training rows (`cut_rows`), call by call in the order they came:
  - a reply whose prompt starts with all the tokens of an existing row (the agent appended to the
    conversation: the model's earlier replies, then tool results or user messages) continues that
    row: the new prompt tokens join it as context (masked), the reply's tokens as model tokens;
  - otherwise (the agent edited, dropped or re-ordered messages, or sent a prompt of its own) the
    reply starts a new row whose context is its whole prompt, masked;
  - with n > 1 choices, the first choice continues the row, each other starts a new row holding
    the same context with every earlier token masked.
Every sampled token is therefore trained exactly once, in the context it was sampled in, and
every other token (template, tool results, the agent's own text) is context only. All rows of
an episode share its reward; per-turn rewards sit on the last token of the reply they reward.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from rlhfkit.rollout.core import Rollout
from rlhfkit.rollout.serving import Sample


@dataclasses.dataclass(frozen=True)
class Call:
    """One request of an episode: the prompt ids the model continued and its n replies."""

    prompt: tuple[int, ...]
    replies: tuple[Sample, ...]


@dataclasses.dataclass
class EpisodeRecord:
    """What the server saw of one episode (thread-safe appends)."""

    key: str
    calls: list[Call] = dataclasses.field(default_factory=list)
    known: dict = dataclasses.field(default_factory=dict)  # reply key -> (ids, stop text): rollout/chat_ids.py
    rejected: list[str] = dataclasses.field(default_factory=list)  # why the server refused requests
    closed: bool = False  # past its time: further requests are refused
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, call: Call, keys: list[str], stop_texts: list[str]) -> None:
        with self.lock:
            self.calls.append(call)
            for key, reply, stop_text in zip(keys, call.replies, stop_texts):
                self.known.setdefault(key, (reply.ids, stop_text))

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.rejected.append(reason)

    @property
    def replies(self) -> int:
        return sum(len(c.replies) for c in self.calls)


@dataclasses.dataclass
class Row:
    """One training row: ids, 1 on sampled tokens, their recorded log-probs (0 elsewhere), and
    (reply number in the episode, position of its last token) of each reply it trains."""

    ids: list[int]
    model: list[int]
    logprobs: list[float]
    ends: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    stopped: bool = False


def _append(row: Row, prompt: tuple[int, ...], reply: Sample, number: int) -> None:
    extra = len(prompt) - len(row.ids)
    row.ids += list(prompt[len(row.ids):]) + list(reply.ids)
    row.model += [0] * extra + [1] * len(reply.ids)
    row.logprobs += [0.0] * extra + list(reply.logprobs)
    row.ends.append((number, len(row.ids) - 1))
    row.stopped = reply.stopped


def cut_rows(calls: list[Call]) -> list[Row]:
    """The episode's training rows (module docstring), in the order they were started."""
    rows: list[Row] = []
    number = 0
    for call in calls:
        p = call.prompt
        base = max((r for r in rows if len(r.ids) <= len(p) and tuple(r.ids) == p[: len(r.ids)]),
                   key=lambda r: len(r.ids), default=None)
        for i, reply in enumerate(call.replies):
            if i == 0 and base is not None:
                _append(base, p, reply, number)
            else:
                row = Row([], [], [])
                _append(row, p, reply, number)
                rows.append(row)
            number += 1
    return [r for r in rows if any(r.model)]


def last_reply(row: Row) -> list[int]:
    """The ids of the row's last reply (the sampled tokens up to its end, back to the previous context token)."""
    end = start = row.ends[-1][1]
    while start > 0 and row.model[start - 1]:
        start -= 1
    return row.ids[start : end + 1]


def rows_to_rollout(rows: list[Row], rewards: list[float | list[float]], pad_id: int, device) -> Rollout:
    """One Rollout row per Row. `rewards[i]`: row i's episode reward, or its per-reply rewards
    (indexed by reply number). query = the row's tokens before its first sampled token (left-padded),
    response = the rest (right-padded); response_mask = sampled tokens; sampler_logprobs = their
    recorded log-probs (NaN elsewhere); turn_rewards on each reply's last token; scores = their sum."""
    starts = [r.model.index(1) for r in rows]
    P = max(starts)
    R = max(len(r.ids) - s for r, s in zip(rows, starts))
    B = len(rows)
    q_ids = torch.full((B, P), pad_id, dtype=torch.long, device=device)
    q_mask = torch.zeros((B, P), dtype=torch.long, device=device)
    resp = torch.full((B, R), pad_id, dtype=torch.long, device=device)
    model = torch.zeros((B, R), device=device)
    context = torch.zeros((B, R), device=device)
    lps = torch.full((B, R), float("nan"), device=device)
    turn = torch.zeros((B, R), device=device)
    for b, (row, s, reward) in enumerate(zip(rows, starts, rewards)):
        n = len(row.ids) - s
        if s:
            q_ids[b, P - s:] = torch.tensor(row.ids[:s], dtype=torch.long, device=device)
            q_mask[b, P - s:] = 1
        resp[b, :n] = torch.tensor(row.ids[s:], dtype=torch.long, device=device)
        m = torch.tensor(row.model[s:], dtype=torch.float32, device=device)
        model[b, :n] = m
        context[b, :n] = 1.0
        lps[b, :n] = torch.where(m > 0, torch.tensor(row.logprobs[s:], device=device), lps[b, :n])
        for number, pos in row.ends:
            turn[b, pos - s] += reward[number] if isinstance(reward, list) else 0.0
        if not isinstance(reward, list):
            turn[b, row.ends[-1][1] - s] += reward
    return Rollout(query_ids=q_ids, query_mask=q_mask, response_ids=resp, response_mask=model,
                   stopped=torch.tensor([r.stopped for r in rows], dtype=torch.bool, device=device),
                   scores=turn.sum(1), sampler_logprobs=lps, context_mask=context, turn_rewards=turn)
