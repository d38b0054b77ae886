"""Multi-turn rollouts: the policy and an environment (envs/base.py) take turns until the episode
ends, and the whole conversation becomes one Rollout the PPO and GRPO-family updates train on
unchanged.

Layout of one row (B rows, P prompt width, R response width):

    query    = the reset messages, chat-formatted, left-padded (as single-turn rollouts)
    response = model turn 1 | env tokens 1 | model turn 2 | env tokens 2 | ... | model turn n | padding
    response_mask = 1 on model tokens only: the policy loss, value loss, KL and entropy mask
    context_mask  = 1 on every real token (model and env): the attention mask and trim's extent
    turn_rewards  = each env reward on the last model token of the turn it rewards
    scores        = the sum of the episode's rewards (GRPO's sequence score)

Token in, token out: a model turn keeps the exact ids that were sampled, never a re-tokenisation of
its text, so the teacher-forced pass scores exactly those tokens (the first-micro-batch ratio check
holds). Environment tokens are the chat template's text for the new observation messages and the
next assistant header: the template is rendered over the conversation with the new messages, the
last model turn replaced by a marker, and everything after the marker is taken, less the stop
token the model already sampled (`env_text`). That is the template's own rendering "with the new
messages" minus "without them", plus what the template writes between a turn's stop token and the
next message (SmolLM2's "\\n" after <|im_end|>). A turn cut at max_new_tokens has no stop token, so
the template's end-of-turn text is then part of the environment tokens.

KV reuse (`reuse_cache`, on in training and evaluation with generation_backend=hf and full-vocabulary
sampling): each turn is sampled by the server's loop (rollout/serving.py `sample_rows`), which
keeps every finished row's keys/values (rollout/prefix_cache.py); the row's next turn starts from
them and runs only its new tokens (the last sampled token and the environment's), instead of
re-encoding the whole history. `info["prefill_tokens"]` counts the context tokens each row ran
through the model over its turns, either way.

Turns of different rows proceed together: each round samples one turn for the rows still running,
their full contexts left-padded (rollout/core.py `generate_ids`: the plain policy's sampling).
A row ends when the environment says done, at `max_turns`, or when its response region (model and
environment tokens, the prompt not counted: `max_prompt_length` bounds that) would pass
`max_total_tokens`; then its last model turn is cut there, or the observation left out, and the
row is marked not stopped. Finished rows are not sampled again.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch

from rlhfkit.algos import response_mask
from rlhfkit.core.devices import HOST
from rlhfkit.data.chat import format_prompt, plain_format, to_messages, use_chat_template, with_bos
from rlhfkit.envs.base import as_step, check_messages
from rlhfkit.errors import UserError
from rlhfkit.models.attention import native_attention
from rlhfkit.models.lora import merged_lora
from rlhfkit.rollout.core import Rollout, SamplingParams, generate_ids
from rlhfkit.rollout.decode import lean_supported
from rlhfkit.rollout.prefix_cache import PrefixCache
from rlhfkit.rollout.prompt_fit import encode_prompts
from rlhfkit.rollout.serving import sample_rows

MARKER = "\u2063RLHFKIT-MODEL-TURN\u2063"  # stands in for the last model turn when rendering env text


@dataclasses.dataclass
class Episode:
    """One row's state while its episode runs."""

    env: object
    history: list[dict]  # every message so far (reset messages, model turns, observations)
    prompt: torch.Tensor  # (p,) the real prompt tokens
    tokens: list[int] = dataclasses.field(default_factory=list)  # response region so far
    is_model: list[bool] = dataclasses.field(default_factory=list)  # per token: sampled by the policy
    rewards: dict[int, float] = dataclasses.field(default_factory=dict)  # response position -> reward
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    env_errors: int = 0
    stopped: bool = False
    last_turn: str = ""
    done: bool = False


# ----------------------------------------------------------------------------- text of a turn


def render(tokenizer, messages: list[dict], fmt=None) -> str:
    """`messages` as model text ending in the next assistant header: the tokenizer's chat template
    (or the plain 'User: ...' format), as prompts are formatted. `fmt`: an object with the
    PromptFormatArgs fields chat_template and system_prompt (None: template when there is one)."""
    setting, system = (getattr(fmt, "chat_template", None), getattr(fmt, "system_prompt", None))
    if not use_chat_template(tokenizer, setting):
        return with_bos(tokenizer, plain_format(to_messages(messages, system)))
    return format_prompt(tokenizer, messages, system=system)


def env_text(tokenizer, history: list[dict], observation: list[dict], stop_text: str, fmt=None) -> str:
    """The text the environment adds after the last model turn (history[-1]): the template's
    rendering of `observation` and the next assistant header, plus what the template writes after a
    turn's end, less `stop_text` (the stop token the model sampled to end that turn; "" when the turn
    was cut without one, and the template's end-of-turn text stays here)."""
    messages = [*history[:-1], {"role": "assistant", "content": MARKER}, *observation]
    full = render(tokenizer, messages, fmt)
    if MARKER not in full:
        raise UserError("env: the chat template drops earlier assistant turns from the context; multi-turn "
                        "rollouts need one that keeps them (or chat_template=false)")
    tail = full[full.rindex(MARKER) + len(MARKER) :]
    if stop_text and tail.startswith(stop_text):
        tail = tail[len(stop_text) :]
    return tail


def safe_step(ep: Episode, text: str):
    """(observation, reward, done, info) of env.step, an exception turned into an observation the
    model reads: one failing episode must not end the whole rollout. Counted in the row's `env_errors` and warned
    about (a tool's own errors are the env's to report, as Step.info's tool_error)."""
    try:
        result = ep.env.step(list(ep.history), text)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the env's own error becomes the model's observation
        ep.env_errors += 1
        warnings.warn(f"environment step raised {type(e).__name__}: {e}; it became the observation", stacklevel=3)
        return [{"role": "user", "content": f"Error: {type(e).__name__}: {e}"}], None, False, {}
    step = as_step(result, "env")  # a malformed result is the env's bug: one clear line, not an observation
    return step.observation or None, step.reward, step.done, dict(step.info)


# ----------------------------------------------------------------------------- the rollout


def left_pad(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (N, L), mask (N, L)) of rows left-padded to the longest."""
    width, device = max(len(r) for r in rows), rows[0].device
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = r
            mask[i, width - len(r) :] = 1
    return ids, mask


@torch.no_grad()
def generate_episodes(
    model: torch.nn.Module,
    tokenizer,
    make_env: Callable[[], object],
    records: list[dict],
    params: SamplingParams,
    max_turns: int,
    max_total_tokens: int,
    *,
    seed: int | None = None,
    batch_size: int | None = None,
    share_prompts: bool = False,
    share_prefix: bool = False,
    fmt=None,
    sample_ids: Callable = generate_ids,
    reuse_cache: bool = False,
) -> Rollout:
    """One episode per record, `make_env()` once per row; see the module docstring.

    `params.max_new_tokens` limits each model turn, `max_total_tokens` each row's response region
    (model and environment tokens), `max_turns` its model turns. `seed`: torch's global seed, set
    once before the first turn. `fmt`: prompt-format options (chat_template, system_prompt).
    `sample_ids`: samples each turn, `generate_ids`' signature (HF generate; or the lean loop's
    `lean_generate_ids`, rollout/decode.py); `reuse_cache`: `cached_turns` instead (module docstring)
    when the sampling is full-vocabulary.
    Returns the Rollout with query/response ids and masks, context_mask, turn_rewards, scores,
    stopped, `completions` = each episode's last model turn, and `info` lists per row: turns,
    tool_calls, tool_errors, env_errors.
    """
    if max_turns < 1 or max_total_tokens < 1:
        raise ValueError(f"max_turns ({max_turns}) and max_total_tokens ({max_total_tokens}) must be >= 1")
    stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
    pad = tokenizer.pad_token_id
    envs = [make_env() for _ in records]
    histories = [list(check_messages(env.reset(rec), "env: reset()")) for env, rec in zip(envs, records)]
    enc = encode_prompts(tokenizer, [render(tokenizer, h, fmt) for h in histories], params.max_prompt_length)
    episodes = [Episode(env, h, ids[m.bool()]) for env, h, ids, m in
                zip(envs, histories, enc["input_ids"], enc["attention_mask"])]
    prefix = PrefixCache() if reuse_cache and lean_supported(params) else None
    sample_ids = cached_turns(prefix) if prefix is not None else sample_ids
    prefilled = [0] * len(records)
    if seed is not None:
        torch.manual_seed(seed)
    active = list(range(len(records)))
    first = True
    while active:
        room = [max_total_tokens - len(episodes[i].tokens) for i in active]  # >= 1 for every running row
        turn_params = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, max(room)),
                                          max_prompt_length=None)
        if first:  # the tokenised prompts exactly as single-turn generate() sees them
            ids, mask = enc["input_ids"], enc["attention_mask"]
        else:
            ids, mask = left_pad([torch.cat([episodes[i].prompt, torch.tensor(episodes[i].tokens, dtype=torch.long,
                                                                                           device=episodes[i].prompt.device)])
                                  for i in active], pad)
        for k, i in enumerate(active):  # context tokens this turn runs: all of them, or those past a cached prefix
            real = ids[k][mask[k].bool()].tolist()
            prefilled[i] += len(real) - (prefix.match(real) if prefix is not None else 0)
        with warnings.catch_warnings():  # replace() re-runs SamplingParams' top-k/top-p warning
            warnings.simplefilter("ignore")
            rows = sample_ids(model, tokenizer, ids, mask, turn_params, batch_size, share_prompts, share_prefix)
        first = False
        for i, row, r in zip(active, rows, room):
            take_turn(episodes[i], row[:r], r < params.max_new_tokens, stop_ids, tokenizer, max_turns,
                      max_total_tokens, fmt)
        active = [i for i in active if not episodes[i].done]
    for env in envs:  # an environment's optional close(): a server session it holds ends with its episode
        if callable(getattr(env, "close", None)):
            env.close()
    rollout = episodes_to_rollout(episodes, enc, pad)
    return dataclasses.replace(rollout, info={**rollout.info, "prefill_tokens": prefilled})


def cached_turns(prefix: PrefixCache) -> Callable:
    """A `sample_ids` (generate_ids' signature) that samples each turn with the server's loop
    (rollout/serving.py `sample_rows`, every row at params.temperature) and keeps each finished
    row's K/V in `prefix`, so an episode's next turn runs only its new tokens."""
    def sample_ids(model, tokenizer, ids, mask, params, batch_size=None, share_prompts=False, share_prefix=False):
        rows = [r[m.bool()].tolist() for r, m in zip(ids, mask)]
        stop_ids = tuple(params.stop_ids) or (tokenizer.eos_token_id,)
        was_training = model.training
        model.eval()
        try:
            with merged_lora(model), native_attention():
                samples = sample_rows(model, rows, [params.temperature] * len(rows),
                                      [params.max_new_tokens] * len(rows), stop_ids, tokenizer.pad_token_id, prefix)
        finally:
            model.train(was_training)
        return [torch.tensor(s.ids, dtype=torch.long, device=HOST) for s in samples]

    return sample_ids


def take_turn(ep: Episode, sampled: torch.Tensor, budget_bound: bool, stop_ids: tuple[int, ...], tokenizer,
              max_turns: int, max_total_tokens: int, fmt) -> None:
    """Append one sampled model turn (ids after the context, pad after a stop), step the env, and
    append its observation or end the episode. `budget_bound`: the turn could not reach
    max_new_tokens within max_total_tokens, so a turn without a stop was cut by the budget."""
    m, stopped = response_mask(sampled[None], stop_ids)
    n = int(m.sum())
    turn = sampled[:n].tolist()
    hit_stop = bool(stopped[0])
    ep.tokens += turn
    ep.is_model += [True] * n
    ep.turns += 1
    text = tokenizer.decode(turn[: n - int(hit_stop)], skip_special_tokens=True).strip()
    ep.last_turn = text
    ep.history.append({"role": "assistant", "content": text})
    obs, reward, done, info = safe_step(ep, text)
    if reward is not None:  # on the last model token of the turn it rewards
        pos = len(ep.tokens) - 1
        ep.rewards[pos] = ep.rewards.get(pos, 0.0) + reward
    failed = bool(info.get("tool_error"))
    ep.tool_calls += int(bool(info.get("tool_call")) or failed)  # a malformed call that failed is a call too
    ep.tool_errors += int(failed)
    cut = budget_bound and not hit_stop and len(ep.tokens) >= max_total_tokens
    ep.stopped = hit_stop and not cut
    if done or cut or ep.turns >= max_turns:
        ep.done = True
        return
    stop_text = tokenizer.decode(turn[-1:]) if hit_stop else ""
    extra = tokenizer(env_text(tokenizer, ep.history, obs or [], stop_text, fmt), add_special_tokens=False)["input_ids"]
    if len(ep.tokens) + len(extra) + 1 > max_total_tokens:  # no room for the observation and one model token
        ep.done, ep.stopped = True, False
        return
    ep.tokens += list(extra)
    ep.is_model += [False] * len(extra)
    ep.history.extend(obs or [])


def episodes_to_rollout(episodes: list[Episode], enc: dict, pad: int) -> Rollout:
    """The finished episodes as one Rollout, response region right-padded."""
    B = len(episodes)
    R = max(1, max(len(ep.tokens) for ep in episodes))
    device = enc["input_ids"].device  # the prompts': the response region joins them
    response = torch.full((B, R), pad, dtype=torch.long, device=device)
    model_mask = torch.zeros(B, R, device=device)
    context = torch.zeros(B, R, device=device)
    turn_rewards = torch.zeros(B, R, device=device)
    for b, ep in enumerate(episodes):
        n = len(ep.tokens)
        response[b, :n] = torch.tensor(ep.tokens, dtype=torch.long, device=device)
        model_mask[b, :n] = torch.tensor(ep.is_model, dtype=torch.float32, device=device)
        context[b, :n] = 1.0
        for pos, r in ep.rewards.items():
            turn_rewards[b, pos] = r
    return Rollout(
        query_ids=enc["input_ids"],
        query_mask=enc["attention_mask"],
        response_ids=response,
        response_mask=model_mask,
        stopped=torch.tensor([ep.stopped for ep in episodes], dtype=torch.bool, device=device),
        scores=turn_rewards.sum(1),
        completions=[ep.last_turn for ep in episodes],
        info={"turns": [ep.turns for ep in episodes], "tool_calls": [ep.tool_calls for ep in episodes],
              "tool_errors": [ep.tool_errors for ep in episodes], "env_errors": [ep.env_errors for ep in episodes]},
        context_mask=context,
        turn_rewards=turn_rewards,
    )
