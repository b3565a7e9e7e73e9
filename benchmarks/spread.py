"""Ratios with their spread, and verdicts that hold across it: one definition for the benchmarks
that measure (bev_pool_v2.py, run.py) and the generators that render (readme_perf.py). Standard
library only, so the generators read JSON without loading torch.

    >>> spread([2.0, 2.2, 1.8, 2.0, 2.4], [1.0, 1.0, 1.0, 2.0, 1.0])
    [1.4, 2.0, 2.3]
    >>> verdict([1.1, 1.2, 1.25], 1.3, upper=True), verdict([1.2, 1.3, 1.45], 1.3, upper=True)
    ('met', 'undecided')
    >>> verdict([1.35, 1.4, 1.5], 1.3, upper=True), verdict([20.0, 30.0, 40.0], 25.0, upper=False)
    ('not met', 'undecided')
"""

from __future__ import annotations

import statistics


def quartiles(times: list[float]) -> list[float]:
    """The first and third quartiles of one contender's rounds (its own noise)."""
    q1, _, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0], None, times[0])
    return [q1, q3]


def spread(num: list[float], den: list[float], paired: bool = True) -> list[float]:
    """``num / den`` as [first quartile, median, third quartile]: of the per-round ratios when the two
    were timed in the same rounds (``paired``: round i of each, one right after the other, so a load
    that comes and goes hits both), else the widest range their own quartiles allow (q1/q3 .. q3/q1)."""
    if paired:
        ratios = [n / d for n, d in zip(num, den, strict=True)]
        q1, q3 = quartiles(ratios)
        return [q1, statistics.median(ratios), q3]
    (n1, n3), (d1, d3) = quartiles(num), quartiles(den)
    return [n1 / d3, statistics.median(num) / statistics.median(den), n3 / d1]


def verdict(q: list[float], bound: float, upper: bool) -> str:
    """"met" when the whole range ``q`` ([q1, median, q3]) meets the bound (at most it when ``upper``,
    else at least it), "not met" when none of it does, else "undecided" (the noise straddles the
    target: more rounds, or a quieter machine, decide it)."""
    lo, hi = q[0], q[-1]
    if (hi <= bound) if upper else (lo >= bound):
        return "met"
    if (lo > bound) if upper else (hi < bound):
        return "not met"
    return "undecided"
