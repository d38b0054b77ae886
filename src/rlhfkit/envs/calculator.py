"""The built-in tools: ``calculator`` (arithmetic by walking Python's syntax tree, never ``eval``) and
``make_lookup_tool`` (a key -> value table). The tool protocol they follow, and the formats a model
calls them in, are in :mod:`rlhfkit.envs.tools` (docs/environments.md)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from rlhfkit.envs.tools import Tool, ToolError, format_number

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e300  # results and intermediates beyond this are refused (floats overflow at ~1.8e308)
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SYMBOLS = {
    ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>",
    ast.MatMult: "@", ast.Invert: "~", ast.Not: "not",
}  # fmt: skip
_ALLOWED = "numbers, + - * / // % ** and parentheses"


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression, by walking its syntax tree (no ``eval``).

    Allowed: int and float literals, + - * / // % **, unary minus and plus, parentheses; ``×`` and
    ``÷`` read as * and /. Anything else (names, calls, attributes, strings), division by zero, a
    non-real power and any value beyond 1e300 in magnitude raise ToolError. Powers are checked
    before they are computed, so ``9**9**9`` is refused at once.
    """
    if not isinstance(expression, str):
        raise ToolError(f"calculator: expected an expression as text, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise ToolError("calculator: empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"calculator: expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        hint = " (use ** for powers)" if "^" in text else ""
        raise ToolError(f"calculator: cannot read {text!r}{hint}; use {_ALLOWED}") from None
    try:
        return _eval_node(tree.body)
    except ZeroDivisionError:
        raise ToolError("calculator: division by zero") from None
    except (OverflowError, RecursionError):
        raise ToolError(f"calculator: result too large (beyond {MAX_MAGNITUDE:g})") from None


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolError(f"calculator: only {_ALLOWED} are allowed (found {value!r})")
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    raise ToolError(f"calculator: only {_ALLOWED} are allowed (found {_describe(node)})")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power whose result would pass MAX_MAGNITUDE or is not real, before computing it."""
    if base < 0 and not float(exponent).is_integer():
        raise ToolError("calculator: a negative number to a fractional power is not a real number")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise OverflowError
    if 0 < abs(base) < 1 and exponent < 0 and -exponent * -math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise OverflowError


def _bounded(value: int | float) -> int | float:
    if not abs(value) <= MAX_MAGNITUDE:  # also catches inf and nan
        raise OverflowError
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Attribute):
        return "an attribute"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        symbol = _SYMBOLS.get(type(node.op), type(node.op).__name__)
        return f"the operator {symbol}" + ("; use ** for powers" if symbol == "^" else "")
    return f"a {type(node).__name__}"


def calculator(expression: str) -> str:
    """The calculator tool's function: the value of ``expression`` as text (see evaluate_arithmetic)."""
    return format_number(evaluate_arithmetic(expression))


CALCULATOR = Tool(
    name="calculator",
    description="Evaluates arithmetic with + - * / // % ** and parentheses, e.g. 12*7.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "the expression, e.g. 12*7"}},
        "required": ["expression"],
    },
    fn=calculator,
    timeout_s=2.0,
)


def make_lookup_tool(table: Mapping[str, Any], name: str = "lookup", description: str = "") -> Tool:
    """A tool that returns ``table[key]`` (no Python code runs on the model's text); for tests and toy tasks."""
    entries = {str(k): v for k, v in table.items()}

    def lookup(key: str) -> Any:
        if key not in entries:
            raise ToolError(f"{name}: no entry for {key!r}")
        return entries[key]

    return Tool(
        name=name,
        description=description or "Looks up the value stored under a key.",
        parameters={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        fn=lookup,
        timeout_s=1.0,
    )
