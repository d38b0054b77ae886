"""Inter-labeller agreement: Fleiss' kappa (any number of labellers) and Cohen's kappa (two).

Both compare observed agreement with the agreement expected by chance:
``kappa = (P_o - P_e) / (1 - P_e)``; 1 is perfect agreement, 0 is chance level.
Categories are treated as nominal (a 1-vs-2 disagreement counts as much as 1-vs-5).
When ``P_e == 1`` (every rating in one category) kappa is undefined and NaN is returned.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence


def fleiss_kappa(table: Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa from an items x categories table of rating counts.

    ``table[i][j]`` = number of labellers who put item i in category j (Fleiss 1971). Rows
    may have different totals n_i >= 2 (the usual generalisation: each item's agreement is
    ``P_i = (sum_j n_ij^2 - n_i) / (n_i (n_i - 1))``, and ``p_j`` pools all ratings); with a
    constant n this is exactly Fleiss' formula. Rows with fewer than two ratings are ignored.
    """
    rows = [list(r) for r in table if sum(r) >= 2]
    if not rows:
        return math.nan
    k = len(rows[0])
    if any(len(r) != k for r in rows) or any(x < 0 for r in rows for x in r):
        raise ValueError("every row needs the same number of non-negative category counts")
    p_items = [(sum(x * x for x in r) - sum(r)) / (sum(r) * (sum(r) - 1)) for r in rows]
    p_bar = sum(p_items) / len(rows)  # mean observed agreement
    total = sum(sum(r) for r in rows)
    p_cat = [sum(r[j] for r in rows) / total for j in range(k)]  # share of ratings per category
    p_e = sum(p * p for p in p_cat)  # chance agreement
    if math.isclose(p_e, 1.0):
        return math.nan
    return (p_bar - p_e) / (1.0 - p_e)


def cohen_kappa(ratings_1: Sequence[Hashable], ratings_2: Sequence[Hashable]) -> float:
    """Cohen's kappa for two labellers who rated the same items (same order).

    ``P_o`` = share of items with equal labels; ``P_e = sum_c p1(c) p2(c)`` from each
    labeller's own label frequencies (Cohen 1960).
    """
    if len(ratings_1) != len(ratings_2):
        raise ValueError("both labellers must rate the same items")
    n = len(ratings_1)
    if n == 0:
        return math.nan
    p_o = sum(a == b for a, b in zip(ratings_1, ratings_2)) / n
    c1, c2 = Counter(ratings_1), Counter(ratings_2)
    p_e = sum(c1[c] * c2[c] for c in c1) / (n * n)
    if math.isclose(p_e, 1.0):
        return math.nan
    return (p_o - p_e) / (1.0 - p_e)


def counts_table(ratings_per_item: Sequence[Sequence[Hashable]], categories: Sequence[Hashable]) -> list[list[int]]:
    """Turn each item's list of labels into a row of counts over ``categories``."""
    index = {c: j for j, c in enumerate(categories)}
    table = []
    for labels in ratings_per_item:
        row = [0] * len(categories)
        for label in labels:
            row[index[label]] += 1
        table.append(row)
    return table
