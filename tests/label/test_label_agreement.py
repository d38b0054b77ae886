"""Golden tests for Fleiss' and Cohen's kappa, with the arithmetic written out."""

from __future__ import annotations

import math

import pytest

from rlhfkit.label.agreement import cohen_kappa, counts_table, fleiss_kappa

# Fleiss' worked example (Wikipedia, "Fleiss' kappa"): 10 items, 14 raters each, 5 categories.
FLEISS_TABLE = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def test_fleiss_kappa_worked_example() -> None:
    # Per item: sum_j n_ij^2 = 196, 60, 70, 94, 74, 98, 58, 46, 66, 66  (total 828)
    # P_i = (sum_j n_ij^2 - 14) / (14 * 13)  ->  sum_i P_i = (828 - 10 * 14) / 182 = 688 / 182
    p_bar = 688 / 182 / 10  # 0.37802
    # Column totals 20, 28, 39, 21, 32 of 140 ratings -> P_e = sum_j (n_j / 140)^2
    p_e = (20**2 + 28**2 + 39**2 + 21**2 + 32**2) / 140**2  # 4170 / 19600 = 0.21276
    expected = (p_bar - p_e) / (1 - p_e)  # 0.20993
    assert expected == pytest.approx(0.20993, abs=1e-5)
    assert fleiss_kappa(FLEISS_TABLE) == pytest.approx(expected, rel=1e-12)


def test_fleiss_kappa_edge_cases() -> None:
    # Perfect agreement on varied categories -> 1; a fixed category for everyone -> undefined.
    assert fleiss_kappa([[3, 0], [0, 3], [3, 0]]) == pytest.approx(1.0)
    assert math.isnan(fleiss_kappa([[2, 0], [2, 0]]))
    # Rows with a single rating carry no agreement information and are ignored.
    assert fleiss_kappa([[3, 0], [0, 3], [1, 0]]) == pytest.approx(1.0)
    # Two raters that always disagree on two items: P_bar = 0, P_e = 0.5 -> kappa = -1.
    assert fleiss_kappa([[1, 1], [1, 1]]) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        fleiss_kappa([[1, 1], [2]])


def test_cohen_kappa_worked_example() -> None:
    # 50 items, yes/no. Both yes 20, A yes/B no 5, A no/B yes 10, both no 15 (Wikipedia example).
    a = ["y"] * 20 + ["y"] * 5 + ["n"] * 10 + ["n"] * 15
    b = ["y"] * 20 + ["n"] * 5 + ["y"] * 10 + ["n"] * 15
    p_o = (20 + 15) / 50  # 0.7
    p_e = (25 / 50) * (30 / 50) + (25 / 50) * (20 / 50)  # 0.3 + 0.2 = 0.5
    assert cohen_kappa(a, b) == pytest.approx((p_o - p_e) / (1 - p_e))  # 0.4
    assert cohen_kappa(a, b) == pytest.approx(0.4)


def test_cohen_kappa_edge_cases() -> None:
    assert cohen_kappa([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))
    assert math.isnan(cohen_kappa([], []))
    with pytest.raises(ValueError):
        cohen_kappa([1], [1, 2])


def test_counts_table() -> None:
    assert counts_table([[2, 2, 0], [-1]], categories=(2, 1, 0, -1, -2)) == [[2, 0, 1, 0, 0], [0, 0, 0, 1, 0]]
