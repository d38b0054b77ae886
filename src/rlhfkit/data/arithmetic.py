"""Deterministic small-number arithmetic problems for GRPO/RLOO demos and evaluation.

Problems are short word problems ("Sam has 7 apples and buys 5 more. ...") or
plain sums ("What is 7 + 5?"), each with a GSM8K-style ``answer`` string
(``"7 + 5 = 12\\n#### 12"``) and the integer ``answer_value``. Operands stay small
(<= 20 by default): SmolLM2-135M-Instruct starts at 3-8% sampled accuracy (T = 1,
16 new tokens) and `rlhfkit grpo` takes it to ~58% (docs/algorithms.md).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from rlhfkit.errors import ConfigError

INSTRUCTION = "Answer with just the number."
KINDS = ("add", "sub", "add_plain", "sub_plain")

NAMES = (
    "Sam", "Mia", "Leo", "Ana", "Ben", "Zoe", "Omar", "Lily", "Raj", "Emma",
    "Noah", "Ava", "Ivan", "Nora", "Kai", "Ella", "Tom", "Maya", "Eli", "Rosa",
)  # fmt: skip
OBJECTS = (
    ("apple", "apples"), ("marble", "marbles"), ("sticker", "stickers"), ("book", "books"),
    ("pencil", "pencils"), ("cookie", "cookies"), ("coin", "coins"), ("card", "cards"),
    ("shell", "shells"), ("balloon", "balloons"), ("stamp", "stamps"), ("orange", "oranges"),
    ("flower", "flowers"), ("crayon", "crayons"), ("toy car", "toy cars"),
)  # fmt: skip

# {n}: name, {a}/{b}: operands, {obj_a}: noun agreeing with a, {objs}: plural noun.
WORD_TEMPLATES = {
    "add": (
        "{n} has {a} {obj_a} and buys {b} more. How many {objs} does {n} have now?",
        "{n} had {a} {obj_a} and found {b} more. How many {objs} does {n} have now?",
        "There are {a} {obj_a} in a box. {n} puts in {b} more. How many {objs} are in the box now?",
        "{n} has {a} {obj_a}. A friend gives {n} {b} more. How many {objs} does {n} have now?",
    ),
    "sub": (
        "{n} has {a} {obj_a} and gives {b} to a friend. How many {objs} does {n} have now?",
        "{n} had {a} {obj_a} and lost {b}. How many {objs} does {n} have left?",
        "There are {a} {obj_a} in a box. {n} takes out {b}. How many {objs} are in the box now?",
        "{n} has {a} {obj_a} and sells {b}. How many {objs} does {n} have left?",
    ),
}
PLAIN_TEMPLATES = {
    "add": ("What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}."),
    "sub": ("What is {a} - {b}?", "What is {a} minus {b}?", "Subtract {b} from {a}."),
}

ProblemKey = tuple[str, int, int]


def problem_key(problem: dict) -> ProblemKey:
    """Identity of a problem regardless of wording: (operation, a, b).

    "What is 7 + 5?" and "Sam has 7 apples and buys 5 more..." share a key, so
    splits built on keys never test a question the model trained on.
    """
    a, b = problem["operands"]
    return (problem["kind"].removesuffix("_plain"), int(a), int(b))


def make_problems(
    n: int,
    seed: int,
    max_operand: int = 20,
    kinds: Sequence[str] = ("add", "sub"),
    *,
    exclude_keys: Collection[ProblemKey] = (),
    unique: bool = False,
    instruction: str = INSTRUCTION,
) -> list[dict]:
    """Generate ``n`` problems deterministically from ``seed``.

    Each problem has ``prompt``, ``answer`` (``"a + b = c\\n#### c"``),
    ``answer_value`` (int), ``kind`` and ``operands``. Kinds: ``add``/``sub``
    (word problems) and ``add_plain``/``sub_plain`` ("What is 7 + 5?").
    Operands are in 1..max_operand; subtraction never goes below zero.
    ``exclude_keys`` skips problems whose :func:`problem_key` is listed;
    ``unique`` makes every key distinct (raises ConfigError if the space is too small).
    """
    if n < 0:
        raise ConfigError(f"number of problems must be >= 0, got {n}")
    if max_operand < 1:
        raise ConfigError(f"max_operand must be >= 1, got {max_operand}")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError(
            f"unknown arithmetic kind {bad[0] if bad else '(none)'!r} (expected one of: {', '.join(KINDS)})"
        )
    rng = random.Random(seed)
    excluded = set(exclude_keys)
    seen: set[ProblemKey] = set()
    out: list[dict] = []
    attempts, max_attempts = 0, 200 * n + 1000
    while len(out) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ConfigError(
                f"could only make {len(out)} of {n} distinct arithmetic problems "
                f"with max_operand={max_operand} and kinds={tuple(kinds)}"
            )
        problem = _one_problem(rng, rng.choice(list(kinds)), max_operand, instruction)
        key = problem_key(problem)
        if key in excluded or (unique and key in seen):
            continue
        seen.add(key)
        out.append(problem)
    return out


def _one_problem(rng: random.Random, kind: str, max_operand: int, instruction: str) -> dict:
    op = kind.removesuffix("_plain")
    a = rng.randint(1, max_operand)
    b = rng.randint(1, max_operand) if op == "add" else rng.randint(1, a)
    value = a + b if op == "add" else a - b
    sign = "+" if op == "add" else "-"
    if kind.endswith("_plain"):
        text = rng.choice(PLAIN_TEMPLATES[op]).format(a=a, b=b)
    else:
        singular, plural = rng.choice(OBJECTS)
        text = rng.choice(WORD_TEMPLATES[op]).format(
            n=rng.choice(NAMES), a=a, b=b, obj_a=singular if a == 1 else plural, objs=plural
        )
    return {
        "prompt": f"{text} {instruction}".strip(),
        "answer": f"{a} {sign} {b} = {value}\n#### {value}",
        "answer_value": value,
        "kind": kind,
        "operands": [a, b],
    }


# Built-in `builtin:arithmetic`: the test split is drawn first with distinct keys,
# and train excludes every test key, so the splits are disjoint by construction.
BUILTIN_SIZES = {"train": 2000, "test": 200}
BUILTIN_SEEDS = {"train": 1000, "test": 2000}


def builtin_split(split: str) -> list[dict]:
    """The fixed ``train`` (2000) or ``test`` (200) problems of ``builtin:arithmetic``."""
    test = make_problems(BUILTIN_SIZES["test"], BUILTIN_SEEDS["test"], kinds=KINDS, unique=True)
    if split == "test":
        return test
    return make_problems(
        BUILTIN_SIZES["train"], BUILTIN_SEEDS["train"], kinds=KINDS,
        exclude_keys={problem_key(p) for p in test},
    )  # fmt: skip
