"""Intervals and standard errors of what the loop measures: the reward model's held-out accuracy (Wilson), the votes it
would take to tell it from chance, and the mean judge score or win rate of a policy's answers. Pure functions, no
torch: the Dashboard, the round's refusal and the demo loop all read them from here."""

from __future__ import annotations

import math

Z_95 = 1.959964
"""The two-sided 95% normal quantile."""


def wilson_interval(accuracy: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a proportion measured on n items ((0, 1) when n is 0): sound for small n and for values
    near 0 or 1.

    Hand check: 15 of 20 right, z = 1.96: centre (0.75 + 0.096) / 1.192 = 0.710, half-width
    1.96 * sqrt(0.75 * 0.25 / 20 + 0.0024) / 1.192 = 0.180 -> (0.531, 0.889).
    """
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (accuracy + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def votes_to_beat_chance(accuracy: float, heldout_fraction: float, z: float = Z_95) -> int | None:
    """Votes in all at which a model this accurate would have an interval clear of 0.5 (None: at or below 0.5)."""
    if accuracy <= 0.5 or heldout_fraction <= 0:
        return None
    n = 1
    while wilson_interval(accuracy, n, z)[0] < 0.5:
        n = n + max(1, n // 8)
    return math.ceil(n / heldout_fraction)


def mean_and_standard_error(values: list[float], per_group: int = 1) -> tuple[float | None, float | None]:
    """The mean of `values` and its standard error, the values taken in consecutive groups of `per_group`: the answers
    to one prompt share it, so they are no independent draws, and the standard error is that of the groups' means
    (sample std, n - 1, over sqrt(groups)). (None, None) without values; the error None with fewer than two groups.

    Hand check: [1, 1, 1, 0.5, 0] -> mean 0.7, squared deviations 3 * 0.09 + 0.04 + 0.49 = 0.8, variance 0.8 / 4 = 0.2,
    error sqrt(0.2 / 5) = 0.2. In pairs, [1, 0, 1, 1, 0.5, 0.5, 0, 1] -> means [0.5, 1, 0.5, 0.5], mean 0.625,
    variance (3 * 0.015625 + 0.140625) / 3 = 0.0625, error 0.25 / sqrt(4) = 0.125.
    """
    if not values:
        return None, None
    groups = [values[i:i + per_group] for i in range(0, len(values), per_group)]
    means = [sum(group) / len(group) for group in groups]
    mean = sum(means) / len(means)
    if len(means) < 2:
        return mean, None
    variance = sum((m - mean) ** 2 for m in means) / (len(means) - 1)
    return mean, math.sqrt(variance / len(means))


def win_rate_interval(scores: list[float], per_prompt: int = 1, z: float = 1.96) -> tuple[float, float]:
    """95% interval of the win rate (the mean of 1 win / 0.5 tie / 0 loss): mean +- z standard errors of the prompts'
    mean scores (`mean_and_standard_error`), clipped to [0, 1]; (0, 1) with fewer than two prompts.

    A normal interval on the mean with the scores' own spread, not Wilson's: Wilson takes the variance of a yes/no
    outcome, p(1 - p), which counts a tie as a coin flip between a win and a loss. A rule judges tie often (neither
    answer has what it looks for), and with ties the spread is smaller than that (all ties: no spread, Wilson +-7% at
    192 comparisons); several answers to one prompt are no independent draws either, which per-prompt means handle
    and Wilson cannot. At 64 or more prompts the mean of scores bounded in [0, 1] is near normal; only at the edges
    (every comparison alike) does the interval close to a point, which the counts beside it show.
    Hand check: [1, 1, 1, 0.5, 0] -> 0.7 +- 1.96 * 0.2 = (0.308, 1.092), clipped to (0.308, 1.0).
    """
    mean, error = mean_and_standard_error(scores, per_prompt)
    if mean is None or error is None:
        return 0.0, 1.0
    return max(0.0, mean - z * error), min(1.0, mean + z * error)


def binomial_two_sided_p(k: int, n: int, p: float = 0.5) -> float:
    """Exact two-sided binomial test: the chance, under Binomial(n, p), of an outcome no likelier than k (the sum of
    the probabilities at or below P(k), as scipy's binomtest sums them). 1.0 for n = 0.

    Hand check: 9 of 10 at p = 0.5: P(9) = 10/1024; as likely or less: 0, 1, 9, 10, (1 + 10 + 10 + 1) / 1024 = 0.0215.
    """
    if n <= 0:
        return 1.0

    def log_probability(i: int) -> float:
        return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * math.log(p) + (n - i) * math.log(1 - p))

    observed = log_probability(k)
    total = sum(math.exp(log_probability(i)) for i in range(n + 1) if log_probability(i) <= observed + 1e-7)
    return min(1.0, total)
