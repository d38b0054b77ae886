"""get_reward: built-in names, python: imports, model: paths, and error messages."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rlhfkit.errors import UserError
from rlhfkit.rewards import get_reward, registry, reward_name


@pytest.mark.parametrize("spec", ["sentiment", "arithmetic", "length", " sentiment "])
def test_builtin_names(spec):
    fn = get_reward(spec)
    assert callable(fn)
    assert reward_name(fn) == spec.strip()


def test_builtins_behave_through_the_registry():
    assert get_reward("arithmetic")(["q"], ["12"], answer=["#### 12"]) == [1.0]
    assert get_reward("sentiment")(["q"], ["I love it!"])[0] > 0
    assert get_reward("length:3")(["q"], ["a b c", "a"][:1]) == [0.0]
    assert get_reward("length:4")(["q"], ["a b"]) == [-0.5]


@pytest.mark.parametrize("spec", ["length:abc", "length:0", "length:-2"])
def test_bad_length_target(spec):
    with pytest.raises(UserError, match=r"length target must be a positive whole number"):
        get_reward(spec)


def test_unknown_spec_suggests_the_closest_name_and_lists_choices():
    with pytest.raises(UserError) as err:
        get_reward("sentimnet")
    msg = str(err.value)
    assert "did you mean 'sentiment'?" in msg
    assert "python:MODULE:FUNCTION" in msg and "model:PATH" in msg
    with pytest.raises(UserError, match="reward spec must be a non-empty string"):
        get_reward("")


def test_callable_passes_through():
    def mine(prompts, completions, **info):
        return [0.0] * len(prompts)

    assert get_reward(mine) is mine


# --------------------------------------------------------------------------- python:


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            SCALE = 2.0

            def exclaim(prompts, completions, **info):
                return [SCALE * c.count("!") for c in completions]

            class Counter:
                def __init__(self):
                    self.calls = 0

                def __call__(self, prompts, completions, **info):
                    self.calls += 1
                    return [float(self.calls)] * len(prompts)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def test_python_module_function(user_module):
    fn = get_reward("python:my_rewards:exclaim")
    assert fn(["p", "p"], ["hi!", "hi!!"]) == [2.0, 4.0]
    assert reward_name(fn) == "python:my_rewards:exclaim"


def test_python_file_function(user_module):
    fn = get_reward(f"python:{user_module / 'my_rewards.py'}:exclaim")
    assert fn(["p"], ["!!!"]) == [6.0]


def test_python_class_is_instantiated_once(user_module):
    fn = get_reward("python:my_rewards:Counter")
    assert fn(["p"], ["c"]) == [1.0]
    assert fn(["p"], ["c"]) == [2.0]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("python:my_rewards:exclam", r"'my_rewards' has no attribute 'exclam' \(did you mean 'exclaim'\?\)"),
        ("python:my_rewards:SCALE", r"'SCALE' is a float, not a function"),
        ("python:no_such_module_xyz:f", r"cannot import module 'no_such_module_xyz': ModuleNotFoundError"),
        ("python:my_rewards", r"expected 'python:MODULE:FUNCTION'"),
        ("python:missing/file.py:f", r"no such file 'missing/file.py'"),
    ],
)
def test_python_spec_errors(user_module, spec, match):
    with pytest.raises(UserError, match=match):
        get_reward(spec)


def test_python_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n")
    with pytest.raises(UserError, match=r"importing .*broken\.py' failed: SyntaxError"):
        get_reward(f"python:{bad}:f")
    boom = tmp_path / "boom.py"
    boom.write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(UserError, match="RuntimeError: no GPU here"):
        get_reward(f"python:{boom}:f")


# --------------------------------------------------------------------------- model:


def test_model_spec_calls_load_reward_scorer(monkeypatch):
    calls = []

    def load_reward_scorer(path):
        calls.append(path)
        return lambda prompts, completions, **info: [0.25] * len(prompts)

    monkeypatch.setattr(registry, "load_reward_scorer", load_reward_scorer)
    fn = get_reward("model:runs/rm")
    assert calls == ["runs/rm"]
    assert fn(["a", "b"], ["x", "y"]) == [0.25, 0.25]
    assert reward_name(fn) == "model:runs/rm"


def test_model_spec_needs_a_path():
    with pytest.raises(UserError, match=r"expected 'model:PATH'"):
        get_reward("model:")
