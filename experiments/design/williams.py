"""Orders of conditions balanced for first-order carry-over (Williams 1949).

A culture that takes several conditions in turn carries something of each block into the next. A Williams
design gives each culture one row (a sequence of the k conditions) so that, over the rows, every condition
comes first, last and in every period equally often, and every condition follows every other condition
equally often: a carry-over from A into B is met as often as one from B into A, and a model with a
first-order carry-over term can estimate it apart from the conditions' own effects.

k even: k rows, each ordered pair met once. k odd: no k-row square does it, so the k rows and their mirror
images (2k rows), each ordered pair met twice.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np


def williams_rows(k: int) -> list[list[int]]:
    """The rows of a Williams design for conditions 0..k-1 (k rows for even k, 2k for odd k)."""
    if k < 1:
        raise ValueError(f"a design needs at least one condition, not {k}")
    # First row 0, 1, k-1, 2, k-2, ...: consecutive differences then run through every non-zero residue once,
    # which is what makes each ordered pair appear once over the k cyclic shifts.
    first = [0]
    low, high = 1, k - 1
    while len(first) < k:
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    rows = [[(c + shift) % k for c in first] for shift in range(k)]
    if k % 2 == 1 and k > 1:
        rows += [list(reversed(row)) for row in rows]
    return rows


def carry_over_counts(rows: list[list[int]]) -> Counter[tuple[int, int]]:
    """How often condition a is followed directly by b, over the rows: {(a, b): count}."""
    return Counter((row[i], row[i + 1]) for row in rows for i in range(len(row) - 1))


def is_balanced(rows: list[list[int]]) -> bool:
    """Every condition once per row and equally often in every period; every ordered pair equally often."""
    if not rows:
        return False
    k = len(rows[0])
    if any(sorted(row) != list(range(k)) for row in rows):
        return False
    per_period = [Counter(row[p] for row in rows) for p in range(k)]
    if any(len(set(count.values())) != 1 or len(count) != k for count in per_period):
        return False
    if k < 2:
        return True
    pairs = carry_over_counts(rows)
    return len(pairs) == k * (k - 1) and len(set(pairs.values())) == 1


def deal(k: int, n_cultures: int, seed: int, passes: int = 1) -> tuple[list[list[int]], list[list[int]]]:
    """(the orders, one sequence per culture) for k conditions, from a recorded seed.

    The conditions' labels are shuffled first, so no condition is always first in row 0; those labelled
    Williams rows are the orders. They are dealt out in a random order, a fresh shuffle for each round through
    them, so with a number of cultures that is a multiple of the row count every order is used equally often,
    and which culture gets which order is random. With several passes, each pass deals again: a culture's
    sequence is its orders one after another.
    """
    rng = np.random.default_rng(seed)
    labels = [int(v) for v in rng.permutation(k)]
    rows = _labelled(williams_rows(k), labels)
    sequences: list[list[int]] = [[] for _ in range(n_cultures)]
    for _ in range(passes):
        picks: list[int] = []
        while len(picks) < n_cultures:
            picks += [int(i) for i in rng.permutation(len(rows))]
        for culture, pick in enumerate(picks[:n_cultures]):
            sequences[culture] += rows[pick]
    return rows, sequences


def _labelled(rows: list[list[int]], labels: Sequence[int]) -> list[list[int]]:
    return [[labels[c] for c in row] for row in rows]


def deal_count(k: int, n_cultures: int, passes: int = 1) -> int:
    """How many equally likely outcomes `deal` has: label shuffles x each round's shuffle of the rows, per pass."""
    rows = len(williams_rows(k))
    full, last = divmod(n_cultures, rows)
    return math.factorial(k) * (math.factorial(rows) ** full * math.perm(rows, last)) ** passes


def every_deal(k: int, n_cultures: int, passes: int = 1) -> Iterator[list[list[int]]]:
    """Every outcome of `deal`'s draws (one order per culture per outcome): each draw is equally likely, so a
    randomisation test over them is exact. One set of orders can come from two draws (a label shuffle can map
    the rows onto each other), and is then listed twice, as its chance is twice."""
    rows = williams_rows(k)
    full, last = divmod(n_cultures, len(rows))
    shuffles = list(itertools.permutations(range(len(rows))))
    rounds = [shuffles] * full + [list(itertools.permutations(range(len(rows)), last))]
    one_pass = [[i for part in picks for i in part] for picks in itertools.product(*rounds)]
    for labels in itertools.permutations(range(k)):
        labelled = _labelled(rows, labels)
        for picks in itertools.product(one_pass, repeat=passes):
            yield [[c for pick in picks for c in labelled[pick[culture]]] for culture in range(n_cultures)]


def random_deals(
    k: int, n_cultures: int, count: int, rng: np.random.Generator, passes: int = 1
) -> list[list[list[int]]]:
    """`count` outcomes of `deal`, drawn as `deal` draws them."""
    seeds = rng.integers(0, 2**63, size=count)
    return [deal(k, n_cultures, int(s), passes)[1] for s in seeds]


def rows_needed(k: int) -> int:
    """Cultures per balanced set: the number of Williams rows (k, or 2k for odd k > 1)."""
    return len(williams_rows(k))
