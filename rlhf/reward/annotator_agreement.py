"""Each annotator's agreement with a reward model that never saw their votes (leave one annotator out).

Where a pair has one vote, the common case (overlap 1), nobody else's vote on it says whether that vote was careful.
What can: a head fitted on everyone else's votes, asked about this annotator's. For each annotator j, the head is
fitted on the a/b votes of the others alone (cross-fitted: none of j's votes scores itself) and counts the votes of
j whose picked answer it scores strictly higher. The share estimates g_j = P(j and the model agree).

What the share means. With the model right on a share q of pairs and j on p_j, independently given the truth,
g_j = p_j q + (1 - p_j)(1 - q), so g_j - 1/2 = 2 (p_j - 1/2)(q - 1/2): an annotator who votes like a coin agrees with
any model half the time, one whose votes run against the others' less than half, a careful one more, by an amount
that shrinks with the model's own accuracy (a careful annotator at 25% flips against a head right on 65% of pairs:
g = 0.575). The shares rank annotators; without q they do not give p_j itself, so the people table shows them
beside the gold and Dawid-Skene accuracies and a flag reads them only where they fall below chance.
"""

from __future__ import annotations

from typing import Callable

import torch

HeadFit = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""fit(chosen (N, D), rejected (N, D)) -> the head's weight (D,): scores are features @ weight."""
MIN_OTHER_VOTES = 20
"""An annotator is measured only when the others have cast this many a/b votes to fit on."""


def held_out_agreement(chosen: torch.Tensor, rejected: torch.Tensor, voters: list[str], fit: HeadFit,
                       min_other_votes: int | None = None) -> dict[str, tuple[int, int]]:
    """{annotator: (votes the held-out head agrees with, their a/b votes)}: row i of `chosen` / `rejected` (N, D) holds
    the features of the answer vote i picked and of the other one, `voters[i]` who cast it. Each annotator's head is
    `fit` on the other annotators' rows; annotators whose others have fewer than `min_other_votes` rows (default
    MIN_OTHER_VOTES) are left out."""
    min_other_votes = MIN_OTHER_VOTES if min_other_votes is None else min_other_votes
    if not (chosen.shape == rejected.shape and chosen.shape[0] == len(voters)):
        raise ValueError(f"{len(voters)} voters for features of shapes {tuple(chosen.shape)}, {tuple(rejected.shape)}")
    diffs = chosen - rejected  # (N, D)
    agreement = {}
    for name in dict.fromkeys(voters):  # first-vote order
        own = torch.tensor([voter == name for voter in voters])  # (N,)
        if int((~own).sum()) < min_other_votes:
            continue
        weight = fit(chosen[~own], rejected[~own])  # (D,)
        agrees = (diffs[own] @ weight.to(diffs.dtype)) > 0  # (n_j,)
        agreement[name] = (int(agrees.sum()), int(own.sum()))
    return agreement
