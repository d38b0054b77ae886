"""Write src/rlhfkit/data/builtin/python_tasks.jsonl: the `builtin:python-tasks` prompt set.

Small function tasks written by the project, MBPP-style: a prompt, `test_list` (three asserts whose
expected values come from the reference implementation below, so every test is right by
construction), `entry_point`, `task_id` and `split` (about one task in five held out, chosen by a
fixed hash so re-running gives the same file). Each family has several variants (another constant,
another name) so the test split holds unseen variants of seen skills as well as unseen constants.

    python scripts/make_python_tasks.py            # rewrite the file
    python scripts/make_python_tasks.py --check    # exit 1 if the file differs from what this writes
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/rlhfkit/data/builtin/python_tasks.jsonl"
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
INTS = [[0], [3], [-4], [7], [10], [12]]
PAIRS = [[2, 3], [10, 4], [-1, 5], [7, 7], [0, 9]]
LISTS = [[[1, 2, 3]], [[5, 0, -2, 8]], [[4]], [[10, 20, 30, 40]], [[-3, -1, -7]]]
STRS = [["hello"], ["Python"], ["a b c"], ["racecar"], ["data science"]]


def family_k(name: str, text: str, fn, ks, args=INTS) -> list[tuple]:
    """One task per constant k: name and text take {k} (the number) and {w} (its word)."""
    return [(name.format(w=WORDS[k], k=k), text.format(w=WORDS[k], k=k), functools.partial(fn, k), args) for k in ks]


def families() -> list[tuple]:
    """(function name, what it does, reference implementation, argument lists) of every task."""
    tasks = []
    tasks += family_k("add_{w}", "takes a number x and returns x plus {k}", lambda k, x: x + k, range(2, 11))
    tasks += family_k("times_{w}", "takes a number x and returns x multiplied by {k}", lambda k, x: x * k, range(2, 11))
    tasks += family_k("minus_{w}", "takes a number x and returns x minus {k}", lambda k, x: x - k, range(2, 11))
    tasks += family_k("power_{w}", "takes a number x and returns x raised to the power {k}", lambda k, x: x ** k,
                      range(2, 6))
    tasks += family_k("is_multiple_of_{w}", "takes an integer n and returns True if n is divisible by {k}, else False",
                      lambda k, x: x % k == 0, range(2, 11), [[0], [9], [10], [12], [14], [15]])
    tasks += family_k("repeat_{w}", "takes a string s and returns s repeated {k} times", lambda k, s: s * k,
                      range(2, 6), STRS)
    tasks += family_k("scale_list_{w}", "takes a list of numbers and returns a new list with each number multiplied "
                      "by {k}", lambda k, xs: [x * k for x in xs], range(2, 8), LISTS)
    tasks += family_k("add_to_each_{w}", "takes a list of numbers and returns a new list with {k} added to each number",
                      lambda k, xs: [x + k for x in xs], range(2, 8), LISTS)
    tasks += family_k("is_greater_than_{w}", "takes a number x and returns True if x is greater than {k}, else False",
                      lambda k, x: x > k, range(2, 11))
    tasks += family_k("first_{w}", "takes a list and returns a list of its first {k} elements",
                      lambda k, xs: xs[:k], range(2, 5), LISTS)
    tasks += family_k("remainder_{w}", "takes an integer n and returns the remainder of n divided by {k}",
                      lambda k, x: x % k, range(2, 11))
    tasks += family_k("is_less_than_{w}", "takes a number x and returns True if x is less than {k}, else False",
                      lambda k, x: x < k, range(2, 11))
    tasks += family_k("divide_by_{w}", "takes a number x and returns x divided by {k}", lambda k, x: x / k, (2, 4, 5))
    for c in "aeiostnr":
        tasks.append((f"count_{c}", f"takes a string s and returns how many times the letter '{c}' appears in s",
                      functools.partial(_count, c), [["banana"], ["test case"], ["aaa"], ["xyz"], ["sister"]]))
    for greet in ("Hello", "Hi", "Welcome", "Goodbye", "Thanks"):
        tasks.append((f"say_{greet.lower()}", f"takes a name (a string) and returns the string '{greet}, ' followed by "
                      f"the name and '!'. For example {greet.lower()}('Ann') gives '{greet}, Ann!'",
                      functools.partial(_greet, greet), [["Ann"], ["Bob"], ["World"]]))
    tasks += [
        ("add", "takes two numbers a and b and returns their sum", lambda a, b: a + b, PAIRS),
        ("subtract", "takes two numbers a and b and returns a minus b", lambda a, b: a - b, PAIRS),
        ("multiply", "takes two numbers a and b and returns their product", lambda a, b: a * b, PAIRS),
        ("maximum", "takes two numbers a and b and returns the larger one", max, PAIRS),
        ("minimum", "takes two numbers a and b and returns the smaller one", min, PAIRS),
        ("average_of_two", "takes two numbers a and b and returns their average (a + b) / 2", lambda a, b: (a + b) / 2,
         PAIRS),
        ("is_even", "takes an integer n and returns True if n is even, else False", lambda n: n % 2 == 0, INTS),
        ("is_odd", "takes an integer n and returns True if n is odd, else False", lambda n: n % 2 == 1, INTS),
        ("square", "takes a number x and returns x squared", lambda x: x * x, INTS),
        ("cube", "takes a number x and returns x cubed", lambda x: x ** 3, INTS),
        ("absolute", "takes a number x and returns its absolute value", abs, INTS),
        ("negate", "takes a number x and returns -x", lambda x: -x, INTS),
        ("double", "takes a number x and returns 2 times x", lambda x: 2 * x, INTS),
        ("half", "takes a number x and returns x divided by 2", lambda x: x / 2, INTS),
        ("is_positive", "takes a number x and returns True if x is greater than 0, else False", lambda x: x > 0, INTS),
        ("is_negative", "takes a number x and returns True if x is less than 0, else False", lambda x: x < 0, INTS),
        ("is_zero", "takes a number x and returns True if x equals 0, else False", lambda x: x == 0, INTS),
        ("sign", "takes a number x and returns 1 if x > 0, -1 if x < 0 and 0 if x is 0",
         lambda x: (x > 0) - (x < 0), INTS),
        ("factorial", "takes a non-negative integer n and returns n factorial", math.factorial, [[0], [1], [4], [6]]),
        ("sum_to_n", "takes a positive integer n and returns the sum 1 + 2 + ... + n", lambda n: n * (n + 1) // 2,
         [[1], [4], [10], [100]]),
        ("fibonacci", "takes an integer n >= 0 and returns the n-th Fibonacci number (fibonacci(0) = 0, "
         "fibonacci(1) = 1)", lambda n: _fib(n), [[0], [1], [2], [7], [10]]),
        ("last_digit", "takes a non-negative integer n and returns its last digit", lambda n: n % 10,
         [[7], [42], [1009], [0]]),
        ("count_digits", "takes a positive integer n and returns how many digits it has", lambda n: len(str(n)),
         [[7], [42], [1009], [123456]]),
        ("celsius_to_fahrenheit", "takes a temperature c in Celsius and returns it in Fahrenheit (c * 9 / 5 + 32)",
         lambda c: c * 9 / 5 + 32, [[0], [100], [-40], [37]]),
        ("rectangle_area", "takes the width and height of a rectangle and returns its area", lambda w, h: w * h,
         [[2, 3], [10, 4], [7, 7]]),
        ("rectangle_perimeter", "takes the width and height of a rectangle and returns its perimeter",
         lambda w, h: 2 * (w + h), [[2, 3], [10, 4], [7, 7]]),
        ("list_sum", "takes a list of numbers and returns their sum", sum, LISTS),
        ("list_max", "takes a non-empty list of numbers and returns the largest", max, LISTS),
        ("list_min", "takes a non-empty list of numbers and returns the smallest", min, LISTS),
        ("list_length", "takes a list and returns how many elements it has", len, LISTS),
        ("first_element", "takes a non-empty list and returns its first element", lambda xs: xs[0], LISTS),
        ("last_element", "takes a non-empty list and returns its last element", lambda xs: xs[-1], LISTS),
        ("reverse_list", "takes a list and returns a new list with the elements in reverse order",
         lambda xs: xs[::-1], LISTS),
        ("sort_list", "takes a list of numbers and returns a new list sorted from smallest to largest", sorted, LISTS),
        ("list_product", "takes a list of numbers and returns the product of all of them", math.prod, LISTS),
        ("list_average", "takes a non-empty list of numbers and returns their average", lambda xs: sum(xs) / len(xs),
         LISTS),
        ("even_numbers", "takes a list of integers and returns a list of the even ones, in order",
         lambda xs: [x for x in xs if x % 2 == 0], LISTS),
        ("count_positive", "takes a list of numbers and returns how many are greater than 0",
         lambda xs: sum(x > 0 for x in xs), LISTS),
        ("squares", "takes a list of numbers and returns a new list with each number squared",
         lambda xs: [x * x for x in xs], LISTS),
        ("reverse_string", "takes a string s and returns it reversed", lambda s: s[::-1], STRS),
        ("to_upper", "takes a string s and returns it in upper case", str.upper, STRS),
        ("to_lower", "takes a string s and returns it in lower case", str.lower, STRS),
        ("string_length", "takes a string s and returns its length", len, STRS),
        ("first_char", "takes a non-empty string s and returns its first character", lambda s: s[0], STRS),
        ("last_char", "takes a non-empty string s and returns its last character", lambda s: s[-1], STRS),
        ("is_palindrome", "takes a string s and returns True if it reads the same forwards and backwards, else False",
         lambda s: s == s[::-1], STRS),
        ("count_vowels", "takes a string s and returns how many of its characters are vowels (a, e, i, o, u, "
         "lower case only)", lambda s: sum(c in "aeiou" for c in s), STRS),
        ("count_words", "takes a string s and returns how many words it has (words are separated by spaces)",
         lambda s: len(s.split()), STRS),
        ("remove_spaces", "takes a string s and returns it with every space removed", lambda s: s.replace(" ", ""),
         STRS),
        ("concat", "takes two strings a and b and returns a followed by b", lambda a, b: a + b,
         [["ab", "cd"], ["", "x"], ["hello ", "world"]]),
        ("capitalize_first", "takes a string s and returns it with its first letter in upper case", str.capitalize,
         [["hello"], ["python"], ["x"]]),
        ("swap", "takes two values a and b and returns the tuple (b, a)", lambda a, b: (b, a), PAIRS),
        ("make_pair_list", "takes two values a and b and returns the list [a, b]", lambda a, b: [a, b], PAIRS),
    ]
    return tasks


def _greet(greeting: str, name: str) -> str:
    return f"{greeting}, {name}!"


def _count(c: str, s: str) -> int:
    return s.count(c)


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def record(name: str, text: str, fn, args: list[list]) -> dict:
    params = _params(name, text, len(args[0]))
    example = args[0]
    call = f"{name}({', '.join(map(repr, example))})"
    prompt = (f"Write a Python function `{name}({', '.join(params)})` that {text}. "
              f"For example, {call} should return {fn(*example)!r}. Reply with the function in a ```python block.")
    tests = [f"assert {name}({', '.join(map(repr, a))}) == {fn(*a)!r}" for a in args[1:4]]
    split = "test" if int(hashlib.sha256(name.encode()).hexdigest(), 16) % 5 == 0 else "train"
    return {"prompt": prompt, "test_list": tests, "entry_point": name, "task_id": name, "split": split}


def _params(name: str, text: str, n: int) -> list[str]:
    """Parameter names as the text calls them."""
    if n == 2:
        return ["width", "height"] if "width" in text else ["a", "b"]
    for marker, param in (("list", "xs"), ("string s", "s"), ("integer n", "n"), ("temperature c", "c"),
                          ("a name", "name")):
        if marker in text:
            return [param]
    return ["x"]


def build() -> str:
    rows = [record(*task) for task in families()]
    names = [r["task_id"] for r in rows]
    assert len(set(names)) == len(names), "duplicate task names"
    return "".join(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    text = build()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text else 1)
    OUT.write_text(text)
    rows = [json.loads(line) for line in text.splitlines()]
    print(f"wrote {OUT}: {len(rows)} tasks, {sum(r['split'] == 'test' for r in rows)} held out")
