"""rlhfkit: RLHF for causal language models. `rlhfkit COMMAND` on the command line; in Python
`from rlhfkit import GRPOConfig, train` (rlhfkit/api.py, docs/python-api.md). Names load lazily, so
importing rlhfkit stays instant."""

import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    api = importlib.import_module("rlhfkit.api")
    if name == "train":
        return api.train
    if name in api.CONFIGS:
        return api.config_class(name)
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return ["__version__", "train", *importlib.import_module("rlhfkit.api").CONFIGS]
