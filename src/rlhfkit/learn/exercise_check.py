"""`rlhfkit selfcheck --exercise NAME FILE`: check a learner's function against rlhfkit's own.

Each exercise (rlhfkit/learn/exercise_cases.py; stubs in rlhfkit/learn/exercises/) is run on random
tensors, several shapes, right-padded masks with garbage at the padding, and seeds, next to the
function of `rlhfkit.algos` that the trainers use. The first output (and, for the losses, gradient)
that differs by more than RTOL times the reference's scale is reported with a hint; when the
learner's output equals a classic bug's (each exercise keeps a list of them), the hint names that bug.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlhfkit.learn.exercise_cases import EXERCISES, Exercise

__all__ = ["EXERCISES", "RTOL", "BadExerciseFile", "Outcome", "check", "load_function", "run"]

RTOL = 1e-4  # float32 inputs: a right answer agrees to ~1e-6 of the scale; a real bug is off by far more


@dataclass
class Outcome:
    """What the checker found: pass, or the first mismatch and its hint, and the cases it ran."""

    ok: bool
    cases: int
    mismatch: str = ""
    hint: str = ""
    notes: list[str] = field(default_factory=list)


class BadExerciseFile(Exception):
    """The learner's FILE cannot be loaded, or defines no function of the expected name."""


# ---- loading and comparing ----------------------------------------------------------------------


def load_function(path: str | Path, name: str) -> Callable:
    """The function `name` defined in the python file `path`; BadExerciseFile (one line) when it cannot be had."""
    p = Path(path)
    if not p.is_file():
        raise BadExerciseFile(f"{path}: no such file (expected a python file defining {name}(...))")
    spec = importlib.util.spec_from_file_location(f"rlhfkit_exercise_{p.stem}", p)
    if spec is None or spec.loader is None:
        raise BadExerciseFile(f"{path}: not a python file (expected a .py file defining {name}(...))")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise BadExerciseFile(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # noqa: BLE001  (the learner's module failed at import: one line, not a traceback)
        raise BadExerciseFile(f"{path}: importing it raised {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise BadExerciseFile(f"{path}: defines no function '{name}' (the stub's name; see the stub file)")
    return fn


def _as_outputs(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _first_mismatch(got, want) -> tuple[tuple[int, ...], float, float] | None:
    """None when `got` matches `want` (|got - want| <= RTOL * scale, scale = max(1, max finite |want|); equal
    infinities and NaN in both count as equal), else (index, got value, want value) of the first element that
    does not, in reverse time order for (B, T) tensors (the recursion's first step is the last token)."""
    import torch

    want = want.detach().double()
    got = got.detach().double()
    finite = want[torch.isfinite(want)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    same = ((got - want).abs() <= RTOL * scale) | (got == want) | (got.isnan() & want.isnan())
    if bool(same.all()):
        return None
    idx = (~same).nonzero()
    if want.dim() == 2:  # latest t first, then the lowest row
        idx = idx[torch.argsort(idx[:, 1] * -1000 + idx[:, 0])]
    i = tuple(int(k) for k in idx[0])
    return i, float(got[i]), float(want[i])


def _outputs(ex: Exercise, f: Callable, args: tuple) -> tuple:
    """f's outputs on (copies of) args, and for the losses the gradient of their sum wrt input `grad_of`
    (zeros when none flows)."""
    import torch

    inputs = [a.clone().requires_grad_(i == ex.grad_of) if isinstance(a, torch.Tensor) else a
              for i, a in enumerate(args)]
    out = _as_outputs(f(*inputs))
    if ex.grad_of is None:
        return out
    grad = None
    if isinstance(out[0], torch.Tensor) and out[0].requires_grad:
        (grad,) = torch.autograd.grad(out[0].sum(), inputs[ex.grad_of], allow_unused=True)
    return (*out, torch.zeros_like(args[ex.grad_of]) if grad is None else grad)


def _names(ex: Exercise) -> list[str]:
    if ex.name == "gae":
        return ["advantages", "returns"]
    if ex.grad_of is not None:
        return ["loss", f"gradient wrt {ex.function}'s argument {ex.grad_of + 1}"]
    return ["output"]


def _compare(ex: Exercise, got: tuple, want: tuple) -> tuple[str, str] | None:
    """None when `got` agrees with `want`; else (what differs, hint-or-empty): the hint is given here when
    the output has the wrong form, else left for the exercise's `locate`."""
    import torch

    names = _names(ex)
    if len(got) != len(want):
        return f"returned {len(got) - (ex.grad_of is not None)} value(s), expected {len(want) - (ex.grad_of is not None)}", \
            f"return {' and '.join(names[:len(want) - (ex.grad_of is not None)])}, as the stub's docstring says"
    for k, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor):
            return f"{names[k]}: returned {type(g).__name__}", f"return a tensor of shape {tuple(w.shape)}"
        if tuple(g.shape) != tuple(w.shape):
            return f"{names[k]}: shape {tuple(g.shape)}, expected {tuple(w.shape)}", \
                "one loss per pair, (B,): the caller takes the mean" if ex.name == "dpo-loss" else \
                "keep the shapes of the stub's docstring"
        found = _first_mismatch(g, w)
        if found is not None:
            i, gv, wv = found
            where = f" at row {i[0]}, t={i[1]}" if len(i) == 2 else (f" at index {i[0]}" if i else "")
            return f"{names[k]}{where}: got {gv:.6g}, expected {wv:.6g}", ""
    return None


def _mismatch_index(ex: Exercise, got: tuple, want: tuple) -> tuple[tuple[int, ...], float]:
    """(output number + element index, the learner's value) of the first mismatch."""
    for k, (g, w) in enumerate(zip(got, want)):
        found = _first_mismatch(g, w)
        if found is not None:
            return (k, *found[0]), found[1]
    return (0,), float("nan")


def _matches(ex: Exercise, fn: Callable, bug: Callable, cases: list[tuple]) -> bool:
    """Whether `fn` agrees with `bug` (outputs and gradient) on the first few of `cases`."""
    import torch

    for args in cases[:4]:
        try:
            got, want = _outputs(ex, fn, args), _outputs(ex, bug, args)
        except Exception:  # noqa: BLE001  (a variant that cannot run on these inputs does not match)
            return False
        if len(got) != len(want) or any(not isinstance(g, torch.Tensor) or g.shape != w.shape
                                        or _first_mismatch(g, w) is not None for g, w in zip(got, want)):
            return False
    return True


def check(ex: Exercise, fn: Callable) -> Outcome:
    """Run `fn` against the reference on every case of `ex`; stop at the first mismatch."""
    cases = list(ex.cases())
    for n, (label, args, _) in enumerate(cases, 1):
        want = _outputs(ex, ex.reference, args)
        try:
            got = _outputs(ex, fn, args)
        except NotImplementedError:
            return Outcome(False, n, f"{label}: {ex.function} raised NotImplementedError",
                           "the stub is not written yet: replace the raise with your code")
        except Exception as e:  # noqa: BLE001  (the learner's code failed: a mismatch, with the error)
            return Outcome(False, n, f"{label}: {ex.function} raised {type(e).__name__}: {e}",
                           f"the inputs' shapes and dtypes are in the stub's docstring ({ex.stub_path.name})")
        found = _compare(ex, got, want)
        if found is None:
            continue
        what, hint = found
        if not hint:
            bug = next((b for b in ex.bugs if _matches(ex, fn, b.fn, [c[1] for c in cases[n - 1:]])), None)
            hint = bug.hint if bug is not None else ex.locate(args, *_mismatch_index(ex, got, want))
        return Outcome(False, n, f"{label}: {what}", hint)
    return Outcome(True, len(cases))


def run(name: str, path: str | Path) -> tuple[Outcome, Exercise]:
    """Load FILE's function for exercise `name` and check it. Raises BadExerciseFile or KeyError (unknown name)."""
    ex = EXERCISES[name]
    return check(ex, load_function(path, ex.function)), ex
