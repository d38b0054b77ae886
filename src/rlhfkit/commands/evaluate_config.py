"""EvalConfig: every option of `rlhfkit eval` (this text is --help), apart from the evaluation (commands/evaluate.py),
so reading a command line loads no model code."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.config import check, option, retune
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.options import OutDirArgs, PromptSplitArgs, SampleCommandArgs


@dataclass
class EvalConfig(OutDirArgs, PromptSplitArgs, SampleCommandArgs):
    """Evaluate a model on prompts: rewards, win rate vs a reference model, task accuracy, perplexity, ROUGE."""

    model = retune(help="model to evaluate (a folder, a run's final/, or the default)")
    num_prompts = retune(64)
    temperature = retune(0.0, "0 = greedy; > 0 samples with this temperature")
    batch_size = retune(help="prompts per generate() call")
    ref_model: str | None = option(None, "reference model for win rates (e.g. the SFT model); None = no comparison")
    rewards: list[str] = option(["sentiment"], "rewards to report, each SPEC or NAME=SPEC: sentiment | arithmetic | "
                           "length[:N] | model:PATH | python:module:function")
    perplexity: bool = option(True, "perplexity of reference responses (prompt records with a 'response' field)")
    rouge: bool = option(True, "ROUGE-1, ROUGE-2 and ROUGE-L F1 of completions against reference responses "
                         "(rouge-score package, stemmed)")

    def validate(self) -> None:
        check(self.temperature >= 0, f"temperature ({self.temperature}) must be >= 0")
        check(self.max_new_tokens >= 1 and self.batch_size >= 1, "max_new_tokens and batch_size must be >= 1")
        parse_rewards(self.rewards)


def parse_rewards(items: list) -> list[tuple[str, str]]:
    """[(name, spec)] from 'SPEC' or 'NAME=SPEC' items; names must be unique."""
    out = []
    for item in items:
        name, sep, spec = str(item).partition("=")
        if not sep:
            name, spec = str(item), str(item)
        if not name or not spec:
            raise ConfigError(f"rewards: {item!r} is not SPEC or NAME=SPEC")
        out.append((name.strip(), spec.strip()))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"rewards: names must be unique, got {names}")
    return out
