"""Each annotator's reliability from the votes alone: Dawid-Skene on the pairs that several people voted on.

The model (one-coin Dawid-Skene). Each pair i has a hidden better answer, gen_a or gen_b, and each annotator j says
the better one with probability p_j, their accuracy, the other with 1 - p_j, independently of the others given the
truth. Only a/b votes count (ties, both_bad and skips say nothing about which is better), and only on pairs with at
least two of them: a pair one person voted on tells nothing about that person's reliability (its label would be
their own vote, and counting it would only pull their accuracy towards what the other pairs say).

Why one coin, not two (a sensitivity P(says a | a better) and a specificity P(says b | b better)): "a" and "b" are
the store's bookkeeping, not what anyone sees. The store draws the side of gen_a for every showing, so a careful
person, a random clicker and one who always takes the left answer each treat gen_a and gen_b alike; a difference
between the two coins would be noise fitted on a team's few overlapping votes (twice the parameters on tens of votes
each). A bias for a screen side is the position bias people.py measures (left picks, binomial test); in a/b terms
the left-picker is a coin flip, and the one-coin model gives them an accuracy near 1/2, which is what their votes
are worth. The prior P(a better) is fixed at 1/2, not fitted, for the same reason: gen_a is the pair maker's side
(the newer policy on versus pairs), and a fitted prior would lean pairs with split votes towards whichever side won
more often, which is the question versus pairs ask people, not one to answer from the others' votes.

The fit (EM, from the majority vote):
- start: T_i = the share of pair i's a/b votes that say a (the soft majority vote);
- M step: c_j = sum over j's votes of T_i where j said a, 1 - T_i where j said b (j's expected correct votes), n_j
  their votes; p_j = (c_j + 1) / (n_j + 2), the posterior mode under a Beta(2, 2) prior: one pseudo-vote right and
  one wrong, so that a person who never disagreed on their few pairs is not taken for infallible (p_j = 1 would
  give their vote the last word on every pair they share) and nobody's weight becomes infinite;
- E step: logit T_i = sum over i's votes of +-log(p_j / (1 - p_j)) (+ for a, - for b), the posterior that gen_a is
  better given the votes and the accuracies;
- until no T_i and no p_j moves by more than `tolerance`, or `max_iterations`.
Starting from the majority picks the fixed point where the team as a whole beats a coin (the model cannot tell it
from its mirror image, everyone's accuracy 1 - p_j). With few overlapping votes the prior weighs: two people who
agreed on two pairs stay near 1/2 (the fixed point solves (2p - 1)^3 = 0); from a few dozen votes each the votes
decide (tests/test_reliability.py).

The interval of p_j: the Wilson interval (annotate.statistics) of c_j / n_j over n_j, the expected correct votes
counted as if they were observed. It takes the pairs' labels as known, so where a pair has two or three votes and
its label is itself uncertain it is narrower than the truth; `bootstrap_intervals` resamples pairs with replacement
and refits (percentiles of p_j), which carries that uncertainty, at the price of refitting: use it to report, the
Wilson interval for the live table.

Own implementation, not crowd-kit (Apache-2.0, which has DawidSkene and OneCoinDawidSkene): the estimator is under
a hundred lines of pure Python over dictionaries, as the rest of annotate/'s statistics are (annotate.statistics),
while crowd-kit's works on pandas data frames and brings attrs, numpy and pandas into the module the app imports
for its people table. Its OneCoinDawidSkene also fits the class prior and clips accuracies at 1e-10 rather than
putting a prior on them: the two choices above are what this one does differently.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from annotate.metrics import PEOPLE_MODEL_AGREEMENT
from annotate.records import VersusVote, Vote, WinRate
from annotate.statistics import binomial_two_sided_p, wilson_interval

Labels = dict[int, dict[str, bool]]
"""pair id -> {annotator: True when they said gen_a is better, False for gen_b}."""


def labels_from_votes(votes: list[Vote]) -> Labels:
    """The estimator's input from the store's votes (store.votes()): every a/b vote on a pair with at least two."""
    by_pair: Labels = {}
    for vote in votes:
        if vote.choice in ("a", "b"):
            by_pair.setdefault(vote.pair_id, {})[vote.annotator] = vote.choice == "a"
    return {pair: said for pair, said in by_pair.items() if len(said) >= 2}


def majority_posteriors(labels: Labels) -> dict[int, float]:
    """The EM's start: each pair's share of a votes."""
    return {pair: sum(said.values()) / len(said) for pair, said in labels.items()}


def accuracies_given(labels: Labels, posteriors: dict[int, float]) -> dict[str, tuple[float, int]]:
    """The M step's counts: annotator -> (expected correct votes c_j, votes n_j)."""
    counts: dict[str, tuple[float, int]] = {}
    for pair, said in labels.items():
        for annotator, says_a in said.items():
            correct, n = counts.get(annotator, (0.0, 0))
            counts[annotator] = (correct + (posteriors[pair] if says_a else 1 - posteriors[pair]), n + 1)
    return counts


def accuracy(correct: float, n: int) -> float:
    """The accuracy under the Beta(2, 2) prior: (c + 1) / (n + 2)."""
    return (correct + 1) / (n + 2)


def posteriors_given(labels: Labels, accuracies: dict[str, float]) -> dict[int, float]:
    """The E step: P(gen_a better | the pair's votes), with the prior at 1/2."""
    posteriors = {}
    for pair, said in labels.items():
        log_odds = sum((1 if says_a else -1) * math.log(accuracies[annotator] / (1 - accuracies[annotator]))
                       for annotator, says_a in said.items())
        posteriors[pair] = 1 / (1 + math.exp(-log_odds)) if log_odds >= 0 else \
            math.exp(log_odds) / (1 + math.exp(log_odds))
    return posteriors


@dataclass(frozen=True)
class AnnotatorReliability:
    """One annotator's estimate."""

    annotator: str
    accuracy: float
    """P(they name the better answer): (c + 1) / (n + 2) at the fit's end."""
    low: float
    high: float
    """95% interval: Wilson of c / n over n (the module docstring), or the bootstrap's when asked for."""
    n: int
    """Their a/b votes on pairs with at least two: what the estimate rests on."""
    expected_correct: float
    """c: the expected number of those votes that named the better answer."""


@dataclass(frozen=True)
class DawidSkeneFit:
    """The fitted model."""

    annotators: dict[str, AnnotatorReliability]
    """By name, most votes first."""
    posteriors: dict[int, float]
    """Pair id -> P(gen_a is the better answer), for the pairs with at least two a/b votes."""
    iterations: int
    converged: bool
    """False when max_iterations ran out before the changes fell under the tolerance."""


def dawid_skene(labels: Labels, max_iterations: int = 200, tolerance: float = 1e-6) -> DawidSkeneFit:
    """One-coin Dawid-Skene by EM from the majority vote (the module docstring); an empty fit without labels."""
    posteriors = majority_posteriors(labels)
    accuracies: dict[str, float] = {}
    iterations, converged = 0, not labels
    while iterations < max_iterations and not converged:
        new_accuracies = {annotator: accuracy(*counts) for annotator, counts in
                          accuracies_given(labels, posteriors).items()}
        new_posteriors = posteriors_given(labels, new_accuracies)
        change = max([abs(new_posteriors[pair] - posteriors[pair]) for pair in labels] +
                     [abs(value - accuracies.get(annotator, math.inf)) for annotator, value in new_accuracies.items()])
        accuracies, posteriors, iterations = new_accuracies, new_posteriors, iterations + 1
        converged = change < tolerance
    counts = accuracies_given(labels, posteriors)
    estimates = {}
    for annotator, (correct, n) in sorted(counts.items(), key=lambda item: (-item[1][1], item[0])):
        low, high = wilson_interval(correct / n, n)
        estimates[annotator] = AnnotatorReliability(annotator, accuracy(correct, n), low, high, n, correct)
    return DawidSkeneFit(estimates, posteriors, iterations, converged)


def bootstrap_intervals(labels: Labels, resamples: int = 200, seed: int = 0,
                        level: float = 0.95) -> dict[str, tuple[float, float]]:
    """Percentile intervals of each annotator's accuracy over `resamples` refits on pairs drawn with replacement
    (seeded): the uncertainty of the pairs' labels included. An annotator absent from a resample (all their pairs
    left out) has no value from it; one with fewer than two values gets (0, 1)."""
    rng = random.Random(seed)
    pairs = list(labels)
    values: dict[str, list[float]] = {}
    for _ in range(resamples):
        drawn = {index: labels[rng.choice(pairs)] for index in range(len(pairs))}
        for annotator, estimate in dawid_skene(drawn).annotators.items():
            values.setdefault(annotator, []).append(estimate.accuracy)
    tail = (1 - level) / 2
    intervals = {}
    for annotator in accuracies_given(labels, majority_posteriors(labels)):
        ranked = sorted(values.get(annotator, []))
        last = len(ranked) - 1
        intervals[annotator] = (ranked[int(tail * last)], ranked[math.ceil((1 - tail) * last)]) if last >= 1 \
            else (0.0, 1.0)
    return intervals


def store_reliability(store) -> DawidSkeneFit:
    """Dawid-Skene on every vote in the store (store.votes())."""
    return dawid_skene(labels_from_votes(store.votes()))


UNKNOWN_ACCURACY = 0.75
"""The accuracy taken for a voter with neither gold votes nor enough overlap to estimate one: a careful person at 25%
flips, so that with nothing known every single-vote pair weighs the same (after normalising: 1, as by majority)."""
MIN_ESTIMATE_VOTES = 10
"""Gold votes, or a/b votes on pairs shared with others, from which a voter's own estimate replaces UNKNOWN_ACCURACY."""
ACCURACY_BOUNDS = (0.05, 0.95)
"""Accuracies are kept inside these so that no single vote is certain (an infinite log-odds)."""


SIDE_BIAS_P = 0.001
"""A voter's left picks establish a side bias below this two-sided binomial p against half (a careful person's do so
by chance once in 1,000): the people table flags them and weighting discounts their votes (side_click_share)..."""
SIDE_BIAS_VOTES = 20
"""...once they have cast this many a/b votes: 20 left picks in a row give p = 2e-6."""


def picked_left(vote: Vote) -> bool:
    """Whether an a/b vote picked the answer the screen showed on the left."""
    return (vote.choice == "a") == bool(vote.a_on_left)


def side_counts(votes: list[Vote]) -> dict[str, tuple[int, int]]:
    """Per voter (a/b votes that picked the left answer, a/b votes)."""
    counts: dict[str, tuple[int, int]] = {}
    for vote in votes:
        if vote.choice in ("a", "b"):
            left, n = counts.get(vote.annotator, (0, 0))
            counts[vote.annotator] = (left + picked_left(vote), n + 1)
    return counts


def side_click_share(left: int, n: int) -> float:
    """The share s of a voter's a/b votes that clicked a side whatever the answers, from `left` left picks of `n`:
    s = |2 left / n - 1| once the bias is established (SIDE_BIAS_VOTES votes, binomial p under SIDE_BIAS_P), else 0.
    The store draws each showing's side at random, so a side click is right half the time: a voter who clicks a side
    on a share s of their votes and reads the answers on the rest, with accuracy p there, picks the left answer on
    s + (1 - s) / 2 of their votes (for a left bias) and is right on 1/2 + (1 - s)(p - 1/2) of them."""
    if n < SIDE_BIAS_VOTES or binomial_two_sided_p(left, n) >= SIDE_BIAS_P:
        return 0.0
    return abs(2 * left / n - 1)


def voter_accuracies(fit: DawidSkeneFit, gold: dict[str, tuple[int, int]],
                     agreement: dict[str, tuple[int, int]] | None = None,
                     sides: dict[str, tuple[int, int]] | None = None) -> dict[str, float]:
    """Each voter's accuracy for weighting (voter_accuracy_sources without the sources)."""
    return {name: accuracy for name, (accuracy, _) in voter_accuracy_sources(fit, gold, agreement, sides).items()}


def voter_accuracy_sources(fit: DawidSkeneFit, gold: dict[str, tuple[int, int]],
                           agreement: dict[str, tuple[int, int]] | None = None,
                           sides: dict[str, tuple[int, int]] | None = None) -> dict[str, tuple[float, str]]:
    """Each voter's (accuracy for weighting, where it comes from): their gold accuracy ((right + 1) / (judged + 2))
    from MIN_ESTIMATE_VOTES gold votes ("gold"), else their Dawid-Skene accuracy from as many shared a/b votes
    ("Dawid-Skene"), else what their `agreement` with a head that never saw their votes says (agreement_accuracies,
    "agreement"); voters with none are left out (they take UNKNOWN_ACCURACY). `sides` (side_counts) then bound
    each: a voter who clicks a side on a share s > 0 of their votes (side_click_share) is right on at most
    1/2 + (1 - s) / 2 of them, whatever an estimate from few votes says ("..., capped by side bias"), and one with no
    other estimate takes 1/2 + (1 - s)(UNKNOWN_ACCURACY - 1/2) ("side bias"): from their first SIDE_BIAS_VOTES
    votes, without gold or a round's agreement, an always-left voter's votes weigh nothing."""
    sources = {name: (accuracy, "agreement") for name, accuracy in agreement_accuracies(agreement or {}).items()}
    sources.update({name: (estimate.accuracy, "Dawid-Skene") for name, estimate in fit.annotators.items()
                    if estimate.n >= MIN_ESTIMATE_VOTES})
    for name, (right, judged) in gold.items():
        if judged >= MIN_ESTIMATE_VOTES:
            sources[name] = ((right + 1) / (judged + 2), "gold")
    for name, (left, n) in (sides or {}).items():
        share = side_click_share(left, n)
        if share <= 0:
            continue
        if name not in sources:
            sources[name] = (0.5 + (1 - share) * (UNKNOWN_ACCURACY - 0.5), "side bias")
        elif sources[name][0] > 0.5 + (1 - share) / 2:
            sources[name] = (0.5 + (1 - share) / 2, f"{sources[name][1]}, capped by side bias")
    return sources


MIN_AGREEMENT_VOTES = 20
"""A voter's a/b votes a held-out head judged (people/model_agreement) from which that agreement places them."""


def agreement_accuracies(agreement: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Accuracies for weighting from each voter's (agreeing, judged) with a head fitted on the others' votes
    (rlhf.reward.annotator_agreement), for voters with MIN_AGREEMENT_VOTES judged; {} for fewer than two such voters
    or when none beats chance. With the head right on q and voter j on p_j, e_j = g_j - 1/2 = 2 (p_j - 1/2)(q - 1/2)
    (g_j = agreeing / judged): p_j's excess times a factor common to all. Each e_j is shrunk towards their mean by
    tau^2 / (tau^2 + s_j^2) (s_j^2 = 1 / (4 judged), a coin's sampling variance; tau^2 the sample variance of the
    e_j less the mean s_j^2, at least 0), so that a team whose spread is sampling noise weighs everyone alike, and
    floored at 0 (a voter at or below chance says nothing). q is unknown: the voter with the largest excess is taken
    to be a careful person, p = UNKNOWN_ACCURACY, and p_j = 1/2 + (UNKNOWN_ACCURACY - 1/2) e_j / e_max. A
    single-vote pair's weight 2 p_j - 1 is then proportional to e_j whatever q is (weights are scaled to mean 1);
    only pairs with several votes read the anchor."""
    judged = {name: (agreeing / n, n) for name, (agreeing, n) in agreement.items() if n >= MIN_AGREEMENT_VOTES}
    if len(judged) < 2:
        return {}
    excess = {name: share - 0.5 for name, (share, _) in judged.items()}
    sampling = {name: 1.0 / (4 * n) for name, (_, n) in judged.items()}
    mean = sum(excess.values()) / len(excess)
    spread = sum((e - mean) ** 2 for e in excess.values()) / (len(excess) - 1) - sum(sampling.values()) / len(excess)
    tau2 = max(spread, 0.0)
    shrunk = {name: max(mean + tau2 / (tau2 + sampling[name]) * (e - mean), 0.0) for name, e in excess.items()}
    top = max(shrunk.values())
    if top <= 0:
        return {}
    return {name: 0.5 + (UNKNOWN_ACCURACY - 0.5) * e / top for name, e in shrunk.items()}


def weighted_preferences(preferences: list, votes: list[Vote], accuracies: dict[str, float],
                         gold_pairs: frozenset[int] = frozenset()) -> list:
    """The preferences (annotate.records.Preference, the store's majority labels) weighted by how sure their votes
    are: for pair i, log-odds L = sum over its a/b votes of +-log(p_j / (1 - p_j)) (+ for the majority's side), p_j
    the voter's accuracy (`accuracies`, else UNKNOWN_ACCURACY, within ACCURACY_BOUNDS); P = sigmoid(L); a pair with
    P < 1/2 is flipped (its careful voters outweigh a careless majority) and its weight is 2P - 1, 0 for votes that
    say nothing (a random clicker's alone). Gold pairs keep their gold side with weight 1. Weights are then scaled to
    mean 1, so the loss's scale (and the head's L2 choice) is as with majority labels."""
    by_pair: dict[int, list[tuple[str, str]]] = {}
    for vote in votes:
        if vote.choice in ("a", "b"):
            by_pair.setdefault(vote.pair_id, []).append((vote.annotator, vote.choice))
    weighted = []
    for preference in preferences:
        if preference.pair_id in gold_pairs:
            weighted.append(replace(preference, weight=1.0))
            continue
        cast = by_pair.get(preference.pair_id, [])
        majority = "a" if sum(choice == "a" for _, choice in cast) * 2 > len(cast) else "b"
        sure = 1.0 / (1.0 + math.exp(-sum(_log_odds(accuracies, name) * (1 if choice == majority else -1)
                                          for name, choice in cast)))
        if sure < 0.5:
            preference, sure = replace(preference, chosen=preference.rejected, rejected=preference.chosen), 1.0 - sure
        weighted.append(replace(preference, weight=2.0 * sure - 1.0))
    total = sum(p.weight for p in weighted)
    return [replace(p, weight=p.weight * len(weighted) / total) for p in weighted] if total > 0 else weighted


def _bounded_accuracy(accuracies: dict[str, float], name: str) -> float:
    """The voter's accuracy (UNKNOWN_ACCURACY if none is known) within ACCURACY_BOUNDS."""
    low, high = ACCURACY_BOUNDS
    return min(max(accuracies.get(name, UNKNOWN_ACCURACY), low), high)


def _log_odds(accuracies: dict[str, float], name: str) -> float:
    p = _bounded_accuracy(accuracies, name)
    return math.log(p / (1.0 - p))


def vote_weight(accuracies: dict[str, float], name: str) -> float:
    """A single vote's weight relative to a voter of whom nothing is known: (2 p - 1) / (2 UNKNOWN_ACCURACY - 1), p
    their accuracy within ACCURACY_BOUNDS (the weight 2P - 1 of a pair with that one vote): 1 with nothing known, 0 for
    a coin."""
    return max(2 * _bounded_accuracy(accuracies, name) - 1, 0.0) / (2 * UNKNOWN_ACCURACY - 1)


def weighted_win_rates(votes: list[VersusVote], accuracies: dict[str, float]) -> list[WinRate]:
    """People's verdict on each (policy, opponent) with every vote weighted by its voter's vote_weight: wins, losses
    and ties are the sums of their votes' weights times k = n_eff / W, W the judged votes' summed weight and
    n_eff = W^2 / (sum of squared weights) their effective number (Kish), so that the win rate is the weighted share
    and `judged` = n_eff is what its interval and promotion.min_votes read. Equal weights give the plain tallies
    (k = 1); a pair of policies whose votes all weigh 0 has nothing judged."""
    grouped: dict[tuple[int, int], list[tuple[str, float]]] = {}
    for vote in votes:
        grouped.setdefault((vote.policy_id, vote.opponent_id), []).append(
            (vote.choice, vote_weight(accuracies, vote.annotator)))
    rates = []
    for (policy_id, opponent_id), weighted in sorted(grouped.items()):
        judged = [w for choice, w in weighted if choice in ("a", "b", "tie")]
        total, squares = sum(judged), sum(w * w for w in judged)
        scale = total / squares if squares > 0 else 0.0  # n_eff / W = W / sum of squares
        sums = {choice: scale * sum(w for c, w in weighted if c == choice) for choice in ("a", "b", "tie", "both_bad")}
        rates.append(WinRate(policy_id, opponent_id, sums["a"], sums["b"], sums["tie"], sums["both_bad"]))
    return rates


def recorded_model_agreement(rounds: list) -> dict[str, tuple[int, int]]:
    """Per annotator (agreeing, judged) from the newest of `rounds` (Store.rounds()) that measured it; {} if none."""
    for round_ in sorted(rounds, key=lambda r: r.id, reverse=True):
        measured = round_.metrics.get(PEOPLE_MODEL_AGREEMENT)
        if measured:
            return {name: (int(agreeing), int(judged)) for name, (agreeing, judged) in measured.items()}
    return {}


def counted_votes(store) -> list[Vote]:
    """The store's votes that train and promote: excluded annotators' left out."""
    excluded = set(store.excluded_annotators())
    return [vote for vote in store.votes() if vote.annotator not in excluded]


def store_voter_accuracies(store, votes: list[Vote] | None = None) -> dict[str, float]:
    """voter_accuracies as a round weighs by: on the store's counted votes (`votes` when the caller has read them),
    their Dawid-Skene fit, the gold results, the last round's agreement with a held-out head and the side picks."""
    votes = counted_votes(store) if votes is None else votes
    return voter_accuracies(dawid_skene(labels_from_votes(votes)), store.gold_results(),
                            recorded_model_agreement(store.rounds()), side_counts(votes))


def reliability_weighted(store, preferences: list) -> list:
    """`weighted_preferences` of the store's preferences, on its counted votes (excluded annotators' left out) and
    their voters' accuracies (store_voter_accuracies)."""
    votes = counted_votes(store)
    return weighted_preferences(preferences, votes, store_voter_accuracies(store, votes),
                                frozenset(store.gold_pair_ids()))
