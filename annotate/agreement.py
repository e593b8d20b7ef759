"""Inter-annotator agreement: pure functions, no database.

Labels are vote choices (`a`, `b`, `tie`, `both_bad`); skips are not judgements and are left out by the caller.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import Hashable, Mapping, Sequence


def percent_agreement(pairs_of_labels: Sequence[tuple[str, str]]) -> float:
    """Share of rating pairs whose two labels are equal, in [0, 1]."""
    if not pairs_of_labels:
        raise ValueError("percent_agreement needs at least one pair of labels")
    return sum(first == second for first, second in pairs_of_labels) / len(pairs_of_labels)


def cohens_kappa(labels_1: Sequence[str], labels_2: Sequence[str]) -> float:
    """Cohen's kappa of two raters over the same items: (p_o - p_e) / (1 - p_e).

    p_o is the observed agreement, p_e the agreement expected by chance from each rater's own label frequencies.
    When both raters used one and the same label for everything, p_e = 1 and kappa is undefined: returns nan.
    """
    if len(labels_1) != len(labels_2):
        raise ValueError(f"cohens_kappa needs equally long label lists, got {len(labels_1)} and {len(labels_2)}")
    n = len(labels_1)
    if n == 0:
        raise ValueError("cohens_kappa needs at least one item")
    observed = sum(first == second for first, second in zip(labels_1, labels_2)) / n
    counts_1, counts_2 = Counter(labels_1), Counter(labels_2)
    expected = sum(counts_1[label] * counts_2[label] for label in counts_1) / (n * n)
    if expected == 1.0:
        return math.nan
    return (observed - expected) / (1.0 - expected)


@dataclass
class PairAgreement:
    """Agreement between two annotators on the items both of them labelled."""

    annotator_1: str
    """The annotator whose name sorts first."""
    annotator_2: str
    """The other annotator."""
    items: int
    """Number of items both labelled."""
    percent: float
    """Share of those items with equal labels, in [0, 1]."""
    kappa: float | None
    """Cohen's kappa; None when undefined (both used one single label)."""


@dataclass
class AgreementReport:
    """Agreement over every item labelled by two or more annotators."""

    items: int
    """Items (pairs) with two or more labels."""
    rating_pairs: int
    """Pairs of labels compared: one per item and per two annotators who both labelled it."""
    percent: float | None
    """Share of rating pairs that agree, in [0, 1]; None without any item."""
    kappa: float | None
    """Cohen's kappa over all rating pairs pooled (first rater = the name that sorts first); None when undefined."""
    by_pair: list[PairAgreement] = field(default_factory=list)
    """The same, per pair of annotators, sorted by names."""


def _kappa_or_none(labels_1: Sequence[str], labels_2: Sequence[str]) -> float | None:
    kappa = cohens_kappa(labels_1, labels_2)
    return None if math.isnan(kappa) else kappa


def agreement_report(labels_by_item: Mapping[Hashable, Mapping[str, str]]) -> AgreementReport:
    """Percent agreement and Cohen's kappa, overall and per annotator pair.

    `labels_by_item` maps an item (a pair id) to {annotator: label}; items with fewer than two labels are ignored.
    """
    pooled: list[tuple[str, str]] = []
    per_pair: dict[tuple[str, str], list[tuple[str, str]]] = {}
    items = 0
    for labels in labels_by_item.values():
        if len(labels) < 2:
            continue
        items += 1
        for name_1, name_2 in combinations(sorted(labels), 2):
            rating = (labels[name_1], labels[name_2])
            pooled.append(rating)
            per_pair.setdefault((name_1, name_2), []).append(rating)
    if not pooled:
        return AgreementReport(items=0, rating_pairs=0, percent=None, kappa=None)
    by_pair = [
        PairAgreement(
            annotator_1=names[0],
            annotator_2=names[1],
            items=len(ratings),
            percent=percent_agreement(ratings),
            kappa=_kappa_or_none([r[0] for r in ratings], [r[1] for r in ratings]),
        )
        for names, ratings in sorted(per_pair.items())
    ]
    return AgreementReport(
        items=items,
        rating_pairs=len(pooled),
        percent=percent_agreement(pooled),
        kappa=_kappa_or_none([r[0] for r in pooled], [r[1] for r in pooled]),
        by_pair=by_pair,
    )
