"""The config contract the shared code reads is declared (typing.Protocol), not probed with getattr."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.api import CONFIGS, config_class

SRC = Path(rlhfkit.__file__).resolve().parent  # the package under test (an old tree too)
# getattr with a literal option name on a config object: a probe of an undeclared contract
PROBE = re.compile(r"getattr\((self\.)?(cfg|args|config)\s*,\s*[\"']")
NOT_OURS = {"models/policy.py": "reads a transformers model config (word_embed_proj_dim)",
            "rollout/core.py": "reads a transformers model config", "rollout/prompt_fit.py": "a transformers config",
            "models/trunk.py": "a transformers config", "models/shared_prompts.py": "a transformers config",
            "models/hf_compat.py": "a transformers model config (_attn_implementation)"}
RL_CONFIGS = ("PPOConfig", "TRPOConfig", "GRPOConfig", "RLOOConfig", "GSPOConfig", "DAPOConfig", "ReinforcePPConfig",
              "OnlineDPOConfig")


def test_no_getattr_probe_of_a_config_in_src():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in NOT_OURS:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PROBE.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "declare the field (a Protocol, a ClassVar) instead of probing it:\n" + "\n".join(found)


def _protocol_names(protocol) -> list[str]:
    return [n for k in protocol.__mro__ if k not in (typing.Protocol, typing.Generic, object)
            for n in getattr(k, "__annotations__", {})]


def _contracts():
    from rlhfkit.data.sft import SFTLossOptions
    from rlhfkit.rollout.backends import BackendOptions
    from rlhfkit.runtime.optim import OptimizerOptions
    from rlhfkit.runtime.run_folder import FolderOptions
    from rlhfkit.trainers.rl import RLConfig

    every = sorted(CONFIGS)
    return [(RLConfig, RL_CONFIGS), (BackendOptions, RL_CONFIGS), (OptimizerOptions, every),
            (FolderOptions, every), (SFTLossOptions, ("SFTConfig",))]


@pytest.mark.parametrize("index", range(5))
def test_every_config_declares_what_the_shared_code_reads(index):
    protocol, names = _contracts()[index]
    for name in names:
        cls = config_class(name)
        fields = set(cls.__dataclass_fields__)
        missing = [n for n in _protocol_names(protocol) if n not in fields and not hasattr(cls, n)]
        assert not missing, f"{name} lacks {missing} of {protocol.__name__}"


def test_declared_defaults_are_the_old_probes_defaults():
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.online_dpo_config import OnlineDPOConfig
    from rlhfkit.trainers.trpo_config import TRPOConfig

    assert (GRPOConfig.eval_samples_per_prompt, GRPOConfig.trunk_cache_mb) == (1, 0.0)
    assert (OnlineDPOConfig.env, OnlineDPOConfig.reward_weights, OnlineDPOConfig.trunk_cache_mb) == ("", None, 0.0)
    assert TRPOConfig.kl_penalty == "reward"
    # ClassVars are no options: --help and config.yaml list the same fields as before
    assert "env" not in {f.name for f in dataclasses.fields(OnlineDPOConfig)}
    assert "trunk_cache_mb" not in {f.name for f in dataclasses.fields(GRPOConfig)}


def test_planned_optimiser_steps_per_config():
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.rl import planned_optimizer_steps

    def steps(name, **kw):
        return planned_optimizer_steps(build_config(config_class(name), kw))

    # iterations x epochs x rollout / mini-batch (rlhfkit's defaults)
    assert steps("PPOConfig", iterations=3, ppo_epochs=2, rollout_batch_size=16, mini_batch_size=8,
                 micro_batch_size=4) == 3 * 2 * 2
    assert steps("GRPOConfig", iterations=3, update_epochs=2, rollout_batch_size=64, mini_batch_size=16) == 3 * 2 * 4
    assert steps("RLOOConfig", iterations=3) == 3  # mini_batch_size None: the whole rollout, one step
    assert steps("TRPOConfig", iterations=3) == 3 and steps("OnlineDPOConfig", iterations=3) == 3
