"""The option groups of what scores an RL rollout: the `reward` spec's own settings (reward servers
and LLM judges, code run in a sandbox) and the sources whose rewards replace `reward` (a multi-turn
environment, the user's OpenAI-client agent). The RL trainers' configs mix them in beside the groups
of trainers/options.py, under the same rules (its docstring): each option declared once, checked by
its group's `validate()`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import MappingProxyType

from rlhfkit.core.choices import CODE_ISOLATIONS, CODE_REWARDS
from rlhfkit.core.code_settings import CodeSettings
from rlhfkit.core.config import check, option

# The reward specs the RL trainers take after their built-in default (`reward=` help text)
REWARD_SPECS_HELP = ("code[:fraction|all] (the completion's program against the record's tests in a sandbox, "
                     "the code_* options) | length[:N] | model:PATH (an `rlhfkit rm` folder, or any AutoModelForSequenceClassification "
                     "folder or Hub id) | python:module:function or python:FILE.py:function (called as TRL calls "
                     "rewards: prompts=, completions=, each prompt field as a keyword; a verl compute_score or OpenRLHF "
                     "reward_func is known by its parameters) | http(s)://HOST:PORT/PATH (a reward server speaking "
                     "OpenRLHF's protocol, e.g. `rlhfkit serve-reward`; several servers joined with +) | judge:URL (an "
                     "LLM judge behind an OpenAI-compatible /v1 server; judge_* options) | verl:FILE.py[:FN] (verl's "
                     "compute_score) | openrlhf:FILE.py[:FN] (OpenRLHF's reward_func); a,b (or a YAML list) = several, "
                     "summed with reward_weights, each logged as reward/NAME. docs/rewards.md has an example of each. "
                     "In Python: a callable or a list")


@dataclass
class EnvArgs:
    """Multi-turn rollouts against an environment (rollout/multiturn.py, docs/environments.md)."""

    env: str = option("", "environment the policy acts in over several turns: arithmetic-tool, self-correct, "
                      "python:FILE.py:CLASS (or python:MODULE:CLASS), or openenv:http://HOST:PORT (an OpenEnv "
                      "environment server; rlhfkit.envs.make_env_factory reads the spec); its rewards replace "
                      "`reward`, and `prompts` left at its default become the environment's own problems. "
                      "\"\" = single-turn rollouts")
    max_turns: int = option(4, "env: most model turns per episode")
    max_total_tokens: int = option(256, "env: most tokens after the prompt per episode, model turns and environment "
                                   "messages together (a turn that would pass it is cut and the row marked not stopped); "
                                   "max_new_tokens still limits each model turn")
    env_timeout: float = option(60.0, "env=openenv:URL: seconds to wait for the environment server (connecting, "
                                "/health, /schema, and each reply to a reset or step); a server slower than this "
                                "stops the run with one line")

    def validate(self) -> None:
        check(self.max_turns >= 1, f"max_turns ({self.max_turns}) must be >= 1")
        check(self.max_total_tokens >= 1, f"max_total_tokens ({self.max_total_tokens}) must be >= 1")
        check(self.env_timeout > 0, f"env_timeout ({self.env_timeout}) must be > 0 (seconds)")
        if self.env and self.generation_backend == "vllm":
            check(False, f"env ({self.env}) samples its turns on the training policy; set generation_backend=hf "
                  f"or lean (got {self.generation_backend})")


@dataclass
class RemoteRewardArgs:
    """Rewards scored outside the process: reward servers (reward=http://...) and LLM judges
    (reward=judge:URL); rewards/remote.py and rewards/judge.py read these."""

    reward_batch_size: int = option(64, "http rewards: samples per request to a reward server (a judge gets one "
                                    "chat request per sample)")
    reward_concurrency: int = option(4, "http/judge rewards: requests in flight at once (servers joined with + "
                                     "take the requests in turn)")
    reward_timeout: float = option(60.0, "http/judge rewards: seconds one request may take before it is retried")
    reward_retries: int = option(3, "http/judge rewards: further tries of a request that failed to connect, timed "
                                 "out or got a 5xx/429 answer, after 0.5 s, 1 s, 2 s, ... (at most 8 s)")
    reward_api_key_env: str = option("", "http rewards: environment variable holding the server's access token "
                                     "(sent as a bearer token; `rlhfkit serve-reward --token`). \"\" = none")
    reward_label_key: str | None = option(None, "the column sent as `labels` to reward servers and OpenRLHF "
                                          "reward_func (None: label, labels, answer, ground_truth, then verl's "
                                          "reward_model.ground_truth, the first present)")
    judge_model: str = option("", "judge: the model name sent to the judge server (\"\": the first model its "
                              "/v1/models lists)")
    judge_template: str = option("", "judge: the prompt the judge sees, a text or a .txt file, with {prompt}, "
                                 "{completion} and any prompt column as {NAME} (\"\": a built-in 0-10 rating "
                                 "prompt, rewards/judge.py)")
    judge_score_field: str = option("score", "judge: a reply holding a JSON object with this field scores its "
                                    "value as given; any other reply scores its last 'N/10' as N/10 (7/10 -> 0.7)")
    judge_unparsed: str = option("zero", "judge: a reply with no score scores 0 (zero; counted in "
                                 "rollout/judge_unparsed_rate) or stops the run (error)", ("zero", "error"))
    judge_max_tokens: int = option(64, "judge: most tokens of a judge's reply")
    judge_api_key_env: str = option("", "judge: environment variable holding the judge server's API key "
                                    "(\"\": none; a local server needs none)")

    def validate(self) -> None:
        for k in ("reward_batch_size", "reward_concurrency", "judge_max_tokens"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.reward_timeout > 0, f"reward_timeout ({self.reward_timeout}) must be > 0")
        check(self.reward_retries >= 0, f"reward_retries ({self.reward_retries}) must be >= 0")


@dataclass
class CodeRewardArgs:
    """reward=code: the completion's program run against the record's tests in a sandbox
    (rewards/code.py, rewards/sandbox.py; docs/rewards.md)."""

    code_reward: str = option("fraction", "reward=code's score: fraction = the share of the record's tests passed; all "
                              "= 1 only when every test passes (code:all / code:fraction in `reward` override it)",
                              CODE_REWARDS)
    code_workers: int | None = option(None, "reward=code: programs run at the same time, each in its own sandboxed "
                                      "process (None: the CPU cores)")
    code_timeout: float = option(10.0, "reward=code: CPU seconds one program (with all its tests) may use (rounded "
                                 "up); it is killed with its processes after 2 x this + 5 s of wall-clock time")
    code_memory_mb: int = option(1024, "reward=code: address-space limit of a program, in MB")
    code_isolation: str = option("auto", "reward=code: auto = bubblewrap (read-only system, no network, private "
                                 "/tmp, own pid namespace) where it runs, else resource limits only; bwrap = "
                                 "require it; rlimits = resource limits only. A run prints which it got",
                                 CODE_ISOLATIONS)
    tests_field: str | None = option(None, "reward=code: the column holding the tests (None: test_list + "
                                     "test_setup_code (MBPP), test + entry_point (HumanEval) or input_output (APPS))")

    def validate(self) -> None:
        CodeSettings.of({k: getattr(self, k) for k in CodeSettings.__dataclass_fields__})


REWARD_OPTION_GROUPS: tuple[type, ...] = (CodeRewardArgs, RemoteRewardArgs)


def reward_options(cfg) -> MappingProxyType:
    """The run's reward settings for rewards.get_rewards: every field of the reward option groups
    `cfg` mixes in, read-only."""
    names = [f.name for group in REWARD_OPTION_GROUPS if isinstance(cfg, group) for f in fields(group)]
    return MappingProxyType({k: getattr(cfg, k) for k in names})


@dataclass
class AgentArgs:
    """Episodes from the user's own OpenAI-client agent (rollout/agent.py, docs/environments.md)."""

    agent: str = option("", "python:FILE.py:FN (or python:MODULE:FN): FN(client, record) runs one episode with the "
                        "openai client it is given (an OpenAI-compatible server on 127.0.0.1 backed by the policy "
                        "being trained) and returns its reward, or one reward per model reply; the sampled tokens are "
                        "trained exactly as sampled. Its rewards replace `reward`. \"\" = no agent")
    agent_concurrency: int = option(8, "agent: episodes run at once (threads; requests that arrive together are "
                                    "sampled in one batch)")
    agent_timeout: float = option(120.0, "agent: seconds an episode may take; a slower one is dropped "
                                  "(agent/timeout_rate) and its client's key revoked")
    agent_max_calls: int = option(32, "agent: most requests one episode may make (more are refused, and the "
                                  "episode dropped)")
    agent_model: str = option("policy", "agent: the model name the server answers to (give your agent's own, e.g. "
                              "gpt-4o-mini, to run it unchanged); other names are refused")

    def validate(self) -> None:
        if not self.agent:
            return
        check(self.agent_concurrency >= 1, f"agent_concurrency ({self.agent_concurrency}) must be >= 1")
        check(self.agent_timeout > 0, f"agent_timeout ({self.agent_timeout}) must be > 0")
        check(self.agent_max_calls >= 1, f"agent_max_calls ({self.agent_max_calls}) must be >= 1")
        check(bool(self.agent_model), "agent_model must not be empty")
