"""Active selection of pairs: from over-sampled answers, queue the pairs the reward model is least sure about.

The round (and the curve bench) over-samples several answers per prompt, forms every pair of distinct answers,
scores each pair's uncertainty (the spread of the bootstrap heads' P(a > b), rlhf.reward.bt_head.ensemble_disagreement),
and queues the most uncertain ones, at most `max_per_prompt` per prompt so one odd prompt cannot take the batch.
A share of the batch is drawn uniformly at random instead: those pairs are what an honest held-out estimate
and a fair comparison with plain random pairs need (pairs chosen for disagreement are harder than average).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import torch


@dataclass(frozen=True)
class CandidatePair:
    """Two distinct answers to one prompt, a pair that could be queued for a vote."""

    prompt_index: int
    """Which prompt (index into the prompts given to `candidate_pairs`)."""
    a: int
    """Index of the first answer among that prompt's answers."""
    b: int
    """Index of the second answer."""


@dataclass
class Selection:
    """Indices into the candidate list, in queue order."""

    uncertain: list[int]
    """Chosen for the highest disagreement."""
    random: list[int]
    """Drawn uniformly at random (the honest share)."""

    @property
    def all(self) -> list[int]:
        return self.uncertain + self.random

    @property
    def random_share(self) -> float:
        """Share of the chosen pairs that were drawn at random (round/active_share is 1 minus this)."""
        total = len(self.uncertain) + len(self.random)
        return len(self.random) / total if total else 0.0


def candidate_pairs(answers_per_prompt: Sequence[Sequence[str]]) -> list[CandidatePair]:
    """Every pair of distinct, non-empty answers of each prompt (k answers give up to k(k-1)/2 pairs)."""
    candidates = []
    for prompt_index, answers in enumerate(answers_per_prompt):
        for a, b in combinations(range(len(answers)), 2):
            if answers[a] and answers[b] and answers[a] != answers[b]:
                candidates.append(CandidatePair(prompt_index, a, b))
    return candidates


def select_pairs(disagreement: torch.Tensor, groups: Sequence[int], n: int, random_share: float,
                 seed: int = 0, max_per_prompt: int = 1) -> Selection:
    """Choose up to n candidates: round(n * random_share) at random, the rest by highest disagreement.

    disagreement (N,) and groups (N,) (the prompt of each candidate) run over the same candidates. The random ones
    are drawn first, from all candidates, so they are a plain random sample; then the most uncertain of the
    remaining candidates fill the batch. No prompt gives more than `max_per_prompt` pairs in all.
    """
    if not 0.0 <= random_share <= 1.0:
        raise ValueError(f"random_share must lie between 0 and 1, got {random_share}")
    if disagreement.shape[0] != len(groups):
        raise ValueError(f"{disagreement.shape[0]} disagreement scores for {len(groups)} candidates")
    rng = random.Random(seed)
    per_prompt: dict[int, int] = {}

    def take(index: int, into: list[int]) -> bool:
        if per_prompt.get(groups[index], 0) >= max_per_prompt:
            return False
        per_prompt[groups[index]] = per_prompt.get(groups[index], 0) + 1
        into.append(index)
        return True

    n_random = round(n * random_share)
    chosen_random: list[int] = []
    order = list(range(len(groups)))
    rng.shuffle(order)
    for index in order:
        if len(chosen_random) >= n_random:
            break
        take(index, chosen_random)
    taken = set(chosen_random)
    chosen_uncertain: list[int] = []
    ranked = torch.argsort(disagreement, descending=True, stable=True).tolist()
    for index in ranked:
        if len(chosen_uncertain) + len(chosen_random) >= n:
            break
        if index not in taken:
            take(index, chosen_uncertain)
    return Selection(uncertain=chosen_uncertain, random=chosen_random)


def choose_pairs(model, prompts: Sequence[str], answers_per_prompt: Sequence[Sequence[str]], n: int,
                 random_share: float, seed: int = 0, max_per_prompt: int = 1) -> tuple[list[CandidatePair], Selection]:
    """Candidates of the over-sampled answers and the Selection of n of them by `model.disagreement`.

    `model` is a rlhf.reward.strategies.TrainedPreferenceModel (anything with `.disagreement(prompts, a, b)`).
    """
    candidates = candidate_pairs(answers_per_prompt)
    if not candidates:
        return candidates, Selection([], [])
    spread = model.disagreement([prompts[c.prompt_index] for c in candidates],
                                [answers_per_prompt[c.prompt_index][c.a] for c in candidates],
                                [answers_per_prompt[c.prompt_index][c.b] for c in candidates])  # (N,)
    selection = select_pairs(spread, [c.prompt_index for c in candidates], n, random_share, seed, max_per_prompt)
    return candidates, selection
