"""``reward=judge:URL``: an LLM judge behind any OpenAI-compatible chat-completions server (`rlhfkit serve`,
vLLM, llama.cpp's server, a hosted API), called through the ``openai`` client package (extra ``judge``).

Each sample becomes one chat request: the template (`judge_template`, else `DEFAULT_TEMPLATE`) filled with
{prompt}, {completion} and the record's columns by name, sent as the user message at temperature 0 to
`judge_model` (else the first model the server lists). The reply's score (`parse_score`): the field
`judge_score_field` of a JSON object in the reply, else the last "N/10" in it read as N/10 (so 7/10 ->
0.7). A reply with neither scores 0 and is counted (rollout/judge_unparsed_rate), or with
``judge_unparsed=error`` stops the run naming the reply. Requests run `reward_concurrency` at a time;
timeouts and retries are the client's, set from `reward_timeout` and `reward_retries`.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import string
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhfkit.data.chat import text_of
from rlhfkit.errors import UserError
from rlhfkit.rewards.remote import api_key_from, check_reachable, parse_urls, settings_from
from rlhfkit.rewards.scoring import RewardError

DEFAULT_TEMPLATE = (
    "Rate the response to the request below for helpfulness, correctness and clarity, from 0 (useless) to 10 "
    "(excellent).\n\nRequest:\n{prompt}\n\nResponse:\n{completion}\n\nReply with the rating only, written as N/10."
)
_RATIO = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*10\b")
_OBJECT = re.compile(r"\{[^{}]*\}")
BUILTIN_FIELDS = ("prompt", "completion")


# ----------------------------------------------------------------------------- parsing


def parse_score(reply: str, field: str = "score") -> float | None:
    """The score in a judge's reply: a JSON object's `field` (as given), else the last "N/10" as N/10;
    None if there is neither.

    >>> parse_score('{"score": 8, "why": "clear"}'), parse_score("Rating: 7/10."), parse_score("good")
    (8.0, 0.7, None)
    """
    for found in reversed(_OBJECT.findall(reply)):
        try:
            obj = json.loads(found)
        except ValueError:
            continue
        value = obj.get(field) if isinstance(obj, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    ratios = _RATIO.findall(reply)
    return float(ratios[-1]) / 10 if ratios else None


def template_fields(template: str, spec: str) -> list[str]:
    """The names a template fills ({prompt}, {completion}, {COLUMN}); an error for a malformed one."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise UserError(f"reward {spec!r}: judge_template is not a valid template ({e}); write {{prompt}}, "
                        "{completion} or {COLUMN}, and {{ }} for a literal brace") from None
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UserError(f"reward {spec!r}: judge_template has the field {{{bad[0]}}}; fields are {{prompt}}, "
                        "{completion} or a prompt column's name, like {answer}")
    return sorted(set(names))


def read_template(text: str, spec: str) -> str:
    """`judge_template` as given, or the text of the .txt file it names; the built-in one when empty."""
    if not text:
        return DEFAULT_TEMPLATE
    if text.endswith(".txt") and "\n" not in text:
        path = Path(text)
        if not path.is_file():
            raise UserError(f"reward {spec!r}: judge_template names {text!r}, which is not a file")
        return path.read_text(encoding="utf-8")
    return text


# ----------------------------------------------------------------------------- the reward


class JudgeReward:
    """The reward function of ``reward=judge:URL``: ``(prompts, completions, **columns) -> list[float]``."""

    def __init__(self, client: Any, model: str, template: str, options: Mapping[str, Any], spec: str):
        self.client, self.model, self.template, self.reward_name = client, model, template, spec
        self.fields = template_fields(template, spec)
        self.concurrency = int(options.get("reward_concurrency", 4))
        self.max_tokens = int(options.get("judge_max_tokens", 64))
        self.score_field = str(options.get("judge_score_field", "score"))
        self.on_unparsed = str(options.get("judge_unparsed", "zero"))
        self._lock = threading.Lock()
        self._waited, self._replies, self._unparsed = 0.0, 0, 0

    def __call__(self, prompts: Sequence, completions: Sequence, **columns: Any) -> list[float]:
        t0 = time.perf_counter()
        texts = [self.render(i, prompts, completions, columns) for i in range(len(prompts))]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(self.concurrency, len(texts)))) as pool:
            replies = list(pool.map(self.ask, texts))
        scores = [self.score(i, reply, completions) for i, reply in enumerate(replies)]
        with self._lock:
            self._waited += time.perf_counter() - t0
        return scores

    def render(self, i: int, prompts: Sequence, completions: Sequence, columns: Mapping[str, Any]) -> str:
        values = {"prompt": text_of(prompts[i]), "completion": text_of(completions[i])}
        values.update({k: columns[k][i] for k in self.fields if k not in BUILTIN_FIELDS})
        return self.template.format(**values)

    def ask(self, text: str) -> str:
        """The judge's reply to one filled template (the client retries and times out)."""
        try:
            answer = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": text}], temperature=0.0,
                max_tokens=self.max_tokens)
        except Exception as e:  # the openai package's APIError family, after its retries
            raise RewardError(f"reward {self.reward_name!r}: the judge failed: {type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}") from None
        choices = getattr(answer, "choices", None) or []
        content = choices[0].message.content if choices else None
        return content or ""

    def score(self, i: int, reply: str, completions: Sequence) -> float:
        value = parse_score(reply, self.score_field)
        with self._lock:
            self._replies += 1
            self._unparsed += value is None
        if value is None and self.on_unparsed == "error":
            raise RewardError(f"reward {self.reward_name!r}: the judge's reply to sample {i} "
                              f"(completion={text_of(completions[i])[:40]!r}) has no score: {reply[:80]!r}; "
                              "expected 'N/10' or a JSON object with the score field")
        return 0.0 if value is None else value

    def check_columns(self, columns: Sequence[str]) -> None:
        """Before any model loads: every {NAME} of the template is {prompt}, {completion} or a column."""
        missing = [f for f in self.fields if f not in BUILTIN_FIELDS and f not in columns]
        if missing:
            raise UserError(f"reward {self.reward_name!r}: judge_template uses {{{missing[0]}}}, which is not a "
                            f"column of the prompts (they have: {', '.join(sorted(columns)) or 'none'}; "
                            "{prompt} and {completion} are always there)")

    def pop_metrics(self) -> dict[str, float]:
        """Seconds waited on the judge and the share of replies without a score, since the last call."""
        with self._lock:
            out = {"timing/reward_remote_s": self._waited}
            if self._replies:
                out["rollout/judge_unparsed_rate"] = self._unparsed / self._replies
            self._waited, self._replies, self._unparsed = 0.0, 0, 0
        return out


# ----------------------------------------------------------------------------- the kind


def build_judge(url: str, spec: str, options: Mapping[str, Any]) -> JudgeReward:
    """The reward of ``reward=judge:URL``: the server reached and its model chosen before any model loads."""
    if not url:
        raise UserError(f"reward {spec!r}: expected 'judge:URL' with an OpenAI-compatible server's base URL, "
                        "e.g. judge:http://127.0.0.1:8000/v1")
    urls = parse_urls(url)
    if len(urls) != 1:
        raise UserError(f"reward {spec!r}: a judge takes one server URL, got {len(urls)}")
    url = urls[0]
    settings = settings_from(options, spec)
    check_reachable(url, spec, settings.timeout)
    try:
        import openai
    except ImportError:
        raise UserError(f"reward {spec!r}: an LLM judge needs the openai package: pip install 'rlhfkit[judge]'") from None
    key = api_key_from(options.get("judge_api_key_env") or "", spec, "judge_api_key_env") or "not-needed"
    client = openai.OpenAI(base_url=url, api_key=key, timeout=settings.timeout, max_retries=settings.retries)
    model = options.get("judge_model") or first_model(client, spec)
    return JudgeReward(client, model, read_template(options.get("judge_template") or "", spec), options, spec)


def first_model(client: Any, spec: str) -> str:
    """The first model the server lists at /v1/models (for a judge without judge_model)."""
    try:
        models = [m.id for m in client.models.list()]
    except Exception as e:
        raise UserError(f"reward {spec!r}: listing the judge server's models failed ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:120]}); check the base URL (it usually ends in /v1) or set "
                        "judge_model=NAME") from None
    if not models:
        raise UserError(f"reward {spec!r}: the judge server lists no models; set judge_model=NAME")
    return models[0]
