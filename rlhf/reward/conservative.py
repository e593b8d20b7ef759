"""Pure maths of a reward PPO can trust: the bootstrap heads' scores of an answer as a conservative reward and as a
budget of drift (torch only).

A head strategy fits bootstrap heads (rlhf.reward.bt_head.fit_bootstrap_heads) beside its main head; each scores an
answer. Where the votes pin an answer down the heads agree, where they do not the heads spread apart, and an answer
PPO pushed into that region scores well under some heads only. Reward-model ensembles against over-optimisation
(Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization", uncertainty-weighted optimisation) give
PPO the heads' mean less k times their spread, and the spread of the answers PPO writes tells how far they have moved
from where the votes were.

Spread is the population standard deviation over the heads (divided by H, not H - 1), as the heads' disagreement
about a pair is (bt_head.ensemble_disagreement): the heads are the whole ensemble, not a sample of one.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def head_spread(head_scores: Tensor) -> Tensor:
    """Population standard deviation over the heads of each answer's score: (H, N) -> (N,)."""
    return head_scores.std(dim=0, unbiased=False)  # (N,)


def conservative_scores(head_scores: Tensor, k: float) -> Tensor:
    """mean - k * std over the heads of each answer's score (std: population, `head_spread`): (H, N) -> (N,).

    k = 0 is the heads' mean; PPO itself keeps the main head's score at k = 0 (rlhf.ppo.config, reward_spread_penalty).
    """
    return head_scores.mean(dim=0) - k * head_spread(head_scores)  # (N,)


def drift_exceeded(first_spread: float, spread: float, budget: float) -> bool:
    """Whether a step's mean head spread is above (1 + budget) times the first step's: the answers have moved where
    the heads disagree (at the limit itself, not yet)."""
    return spread > (1.0 + budget) * first_spread
