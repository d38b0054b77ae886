"""`env=SPEC` loading: built-in names, python:MODULE:CLASS, FILE.py:CLASS, and the errors a user
sees for everything else (rlhfkit.envs.make_env_factory)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rlhfkit.envs import ArithmeticToolEnv, Environment, SelfCorrectEnv, Step, as_step, make_env_factory
from rlhfkit.errors import UserError

USER_ENVS = """
    CREATED = []

    class Echo:
        '''Ends at once; reward 1.0 when the turn repeats the prompt.'''

        def __init__(self):
            CREATED.append(self)

        def reset(self, record):
            self.prompt = record["prompt"]
            return [{"role": "user", "content": self.prompt}]

        def step(self, history, model_turn):
            return None, float(model_turn == self.prompt), True

    class WithTokenizer(Echo):
        prompts = "builtin:reviews"

        def __init__(self, tokenizer=None, tool_format="?", **options):
            super().__init__()
            self.tokenizer, self.tool_format, self.options = tokenizer, tool_format, options

    class NoStep:
        def reset(self, record):
            return []

    class Broken:
        def __init__(self):
            raise RuntimeError("needs a sandbox\\nsecond line")

        def reset(self, record):
            return []

        def step(self, history, model_turn):
            return None, None, True

    def not_a_class():
        return Echo()

    LIMIT = 3
"""


@pytest.fixture()
def user_envs(tmp_path, monkeypatch):
    (tmp_path / "my_envs.py").write_text(textwrap.dedent(USER_ENVS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_envs", None)


@pytest.mark.parametrize("spec, cls", [("arithmetic-tool", ArithmeticToolEnv), ("self-correct", SelfCorrectEnv),
                                       ("  self-correct ", SelfCorrectEnv)])
def test_builtin_names(spec, cls):
    make = make_env_factory(spec)
    first, second = make(), make()
    assert type(first) is cls and type(second) is cls and first is not second  # a fresh env per episode
    assert isinstance(first, Environment)


def test_builtin_defaults_to_tags_and_user_messages_without_a_tokenizer(tiny_tokenizer):
    env = make_env_factory("arithmetic-tool")()
    assert (env.tool_format, env.observation_role) == ("tag", "user")
    env = make_env_factory("arithmetic-tool", tokenizer=tiny_tokenizer)()
    assert (env.tool_format, env.observation_role) == ("tag", "user")  # ChatML without a tool format


def test_python_module_class(user_envs):
    import my_envs

    before = len(my_envs.CREATED)
    make = make_env_factory("python:my_envs:Echo")
    assert len(my_envs.CREATED) == before + 1  # built once at load time, to surface constructor errors
    env = make()
    assert len(my_envs.CREATED) == before + 1  # ... and that instance serves the first episode
    assert env.reset({"prompt": "hi"}) == [{"role": "user", "content": "hi"}]
    assert tuple(as_step(env.step([], "hi"))) == (None, 1.0, True)
    assert make() is not env and len(my_envs.CREATED) == before + 2


@pytest.mark.parametrize("prefix", ["python:", ""])
def test_file_class(user_envs, prefix):
    make = make_env_factory(f"{prefix}{user_envs / 'my_envs.py'}:Echo")
    env = make()
    env.reset({"prompt": "x"})
    assert tuple(as_step(env.step([], "y"))) == (None, 0.0, True)


def test_same_file_is_imported_once(user_envs):
    a = make_env_factory(f"{user_envs / 'my_envs.py'}:Echo")()
    b = make_env_factory(f"python:{user_envs / 'my_envs.py'}:Echo")()
    assert type(a) is type(b)


def test_constructor_gets_the_arguments_it_names(user_envs, tiny_tokenizer):
    make = make_env_factory("python:my_envs:WithTokenizer", tokenizer=tiny_tokenizer)
    env = make()
    assert env.tokenizer is tiny_tokenizer and env.tool_format == "tag"
    assert env.options == {}  # observation_role is not named, and **options catches nothing
    assert make_env_factory("python:my_envs:WithTokenizer")().tokenizer is None


def test_factory_names_the_data_of_the_env(user_envs):
    assert make_env_factory("python:my_envs:WithTokenizer").prompts == "builtin:reviews"
    assert make_env_factory("python:my_envs:Echo").prompts is None
    assert make_env_factory("arithmetic-tool").prompts == "builtin:arithmetic"
    assert make_env_factory("self-correct").prompts == "builtin:arithmetic"


def test_builtin_picks_json_and_the_tool_role_for_a_tool_template(tiny_tokenizer):
    tiny_tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}{# calls: <tool_call>{...}</tool_call> #}"
    )
    env = make_env_factory("arithmetic-tool", tokenizer=tiny_tokenizer)()
    assert (env.tool_format, env.observation_role) == ("json", "tool")


@pytest.mark.parametrize(
    "spec, match",
    [
        ("arithmetic", r"^unknown env 'arithmetic' \(did you mean 'arithmetic-tool'\?\); expected one of: "
                       r"arithmetic-tool, self-correct, python:MODULE:CLASS, python:FILE.py:CLASS, FILE.py:CLASS, openenv:http://HOST:PORT$"),
        ("self_correct", r"did you mean 'self-correct'\?"),
        ("my_envs:Echo", r"did you mean 'python:my_envs:Echo'\?"),
        ("zzz", r"^unknown env 'zzz'; expected one of"),
        ("", r"env spec must be a non-empty string"),
        ("python:my_envs", r"expected 'python:MODULE:CLASS'"),
        ("python:my_envs:Ech", r"'my_envs' has no attribute 'Ech' \(did you mean 'Echo'\?\)"),
        ("python:no_such_module_xyz:E", r"cannot import module 'no_such_module_xyz': ModuleNotFoundError"),
        ("missing/envs.py:E", r"^env 'missing/envs.py:E': no such file 'missing/envs.py'$"),
        ("python:my_envs:NoStep", r"class NoStep has no step method; an environment needs reset\(record\) and step"),
        ("python:my_envs:not_a_class", r"'not_a_class' is a function, not a class"),
        ("python:my_envs:LIMIT", r"'LIMIT' is a int, not a class"),
        ("python:my_envs:Broken", r"^env 'python:my_envs:Broken': creating Broken\(\) failed: RuntimeError: "
                                  r"needs a sandbox$"),
    ],
)
def test_errors(user_envs, spec, match):
    with pytest.raises(UserError, match=match):
        make_env_factory(spec)


def test_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "broken_env.py"
    bad.write_text("class E(:\n")
    with pytest.raises(UserError, match=r"^env '.*broken_env.py:E': importing .*broken_env\.py' failed: SyntaxError"):
        make_env_factory(f"{bad}:E")


# --------------------------------------------------------------------------- step results


def test_as_step_accepts_steps_and_tuples():
    obs = [{"role": "user", "content": "again"}]
    assert as_step(Step(obs, None, False, {"k": 1})) == Step(obs, None, False, {"k": 1})
    assert as_step((obs, 1, False)) == Step(obs, 1.0, False, {})
    assert as_step((None, 0.5, True, {"tool_call": "calculator"})) == Step(None, 0.5, True, {"tool_call": "calculator"})
    assert as_step((obs[0], None, False)).observation == obs  # one message
    obs_, reward, done = Step(obs, 2.0, True)
    assert (obs_, reward, done) == (obs, 2.0, True)


@pytest.mark.parametrize(
    "result, match",
    [
        ("text", r"must return a Step or an \(observation, reward, done\) tuple, got str"),
        ((None, 1.0), r"must return a Step or an \(observation, reward, done\) tuple, got a tuple of 2$"),
        (("hello", 1.0, True), r"observation must be a list of messages"),
        (([{"role": "user"}], 1.0, True), r"observation must be a list of messages"),
        ((None, float("nan"), True), r"reward must be a finite number or None, got nan$"),
        ((None, True, True), r"reward must be a finite number or None, got True"),
        ((None, "1", True), r"reward must be a finite number"),
        ((None, 1.0, "yes"), r"done must be True or False, got 'yes'"),
        ((None, 1.0, True, []), r"info must be a dict, got list"),
    ],
)
def test_as_step_rejects_malformed_results(result, match):
    with pytest.raises(UserError, match=r"^env 'mine': step\(\) " + match):
        as_step(result, "env 'mine'")
