"""The growth-law fit of bench/growth.py: golden coefficients from exact data, and a least-squares
case worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from growth import fit_polynomial  # noqa: E402


def test_linear_fit_recovers_an_exact_line():
    # t = 1.5 + 0.25 x at the batch points 8..128: 3.5, 5.5, 9.5, 17.5, 33.5
    c = fit_polynomial([8, 16, 32, 64, 128], [3.5, 5.5, 9.5, 17.5, 33.5], 1)
    assert c == pytest.approx([1.5, 0.25], rel=1e-12)


def test_quadratic_fit_recovers_linear_plus_quadratic_growth_at_long_lengths():
    # t = 2 + 0.01 x + 3e-5 x^2 at 48..1024 tokens: x^2 reaches 1e6, the scaling keeps it exact.
    xs = [48, 128, 256, 512, 1024]
    ys = [2 + 0.01 * x + 3e-5 * x * x for x in xs]
    assert fit_polynomial(xs, ys, 2) == pytest.approx([2, 0.01, 3e-5], rel=1e-9)


def test_least_squares_line_through_noisy_points_by_hand():
    # Points (0, 1), (1, 2), (2, 2): mean x 1, mean y 5/3; slope = sum (x - 1)(y - 5/3) / sum (x - 1)^2
    # = ((-1)(-2/3) + 0 + (1)(1/3)) / 2 = 1/2; intercept = 5/3 - 1/2 = 7/6.
    assert fit_polynomial([0, 1, 2], [1, 2, 2], 1) == pytest.approx([7 / 6, 1 / 2], rel=1e-12)


def test_too_few_distinct_points_is_an_error():
    with pytest.raises(ValueError, match="distinct"):
        fit_polynomial([8, 8, 16], [1, 2, 3], 2)


def test_cpu_stamps_mark_each_iteration_start_and_the_end(monkeypatch):
    """One stamp per iteration (the first sampling draw only: DAPO's extra draws are inside the iteration)
    and one at finish, so consecutive differences are per-iteration CPU times."""
    import growth

    clock = iter([1.0, 3.5, 7.0, 7.25])
    monkeypatch.setattr(growth.time, "process_time", lambda: next(clock))

    class Run:
        def sample(self, records, iteration, draw=0):
            return (iteration, draw)

        def finish(self):
            return "done"

    stamps = growth.cpu_stamps(Run)
    run = Run()
    assert run.sample([], 0) == (0, 0)
    assert run.sample([], 0, 1) == (0, 1)  # a second draw of iteration 0: no stamp
    assert run.sample([], 1, draw=0) == (1, 0)
    assert run.sample([], 2) == (2, 0)
    assert run.finish() == "done"
    assert stamps == [1.0, 3.5, 7.0, 7.25]
    assert [b - a for a, b in zip(stamps, stamps[1:])] == [2.5, 3.5, 0.25]


def test_render_states_the_fitted_law_and_the_response_length():
    """Length axis: t = 1 + 2 x + 3 x^2 at x = 100, 200, 400 fits back to a = 1, b = 2, c = 3; a point
    without a response length (older results) shows nan rather than failing."""
    import growth

    def t(x):
        return 1 + 2 * x + 3 * x * x

    results = {str(x): {"iteration_s": t(x), "iteration_cpu_s": t(x), "peak_rss_gb": 1.5, "response_length": float(x)}
               for x in (100, 200, 400)}
    results["800"] = {"iteration_s": t(800), "iteration_cpu_s": t(800), "peak_rss_gb": 1.5}
    text = growth.render("length", results, "test machine")
    assert "| 200 | 120401.00 | 120401.00 | 1.50 | 200.0 |" in text  # 1 + 400 + 120000
    assert "| 800 | 1921601.00 | 1921601.00 | 1.50 | nan |" in text
    law = next(line for line in text.splitlines() if line.startswith("iteration_cpu_s"))
    coef = dict(part.split(" = ") for part in law.split(": ", 1)[1].replace(" CPU s", "").split(", "))
    assert abs(float(coef["a"]) - 1) < 1e-3 and abs(float(coef["b"]) - 2) < 1e-6 and abs(float(coef["c"]) - 3) < 1e-9
