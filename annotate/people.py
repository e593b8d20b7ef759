"""Who votes how: per annotator, their votes, agreement with the others on shared pairs, position bias and speed, each
with its n. Pure functions over the store's rows (and `store_people` to read them); the Dashboard shows the table to
admins.

Position bias: of a person's a/b votes, the share that picked the answer shown on the left (the store records the side,
`votes.a_on_left`), with an exact two-sided binomial test against a fair 50% (a careful person's left picks vary
around half; one who always clicks the left button does not). Reliability: their accuracy by Dawid-Skene on the pairs
with several a/b votes (annotate.reliability), with its Wilson interval and n. Agreement with the reward model: the
share of their a/b votes that a head fitted on everyone else's votes agrees with (rlhf.reward.annotator_agreement),
as the last round that measured it recorded; on pairs one person voted on, the only check of their votes. Accuracy
for weighting: the one `[votes] weighting = "reliability"` weighs their votes by, and which of gold, Dawid-Skene or
that agreement it comes from, bounded by an established side bias (annotate.reliability.voter_accuracy_sources).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from annotate.agreement import AgreementReport
from annotate.records import Vote
from annotate.reliability import (UNKNOWN_ACCURACY, AnnotatorReliability, dawid_skene, labels_from_votes,
                                  picked_left, recorded_model_agreement, side_click_share, side_counts,
                                  voter_accuracy_sources)
from annotate.statistics import binomial_two_sided_p, wilson_interval


@dataclass(frozen=True)
class Person:
    """One annotator's figures."""

    name: str
    votes: int
    """Votes cast, skips included."""
    ab_votes: int
    """Of which a/b votes: the ones that say which answer is better."""
    left_picks: int
    """Of those, the ones that picked the answer shown on the left."""
    left_p: float
    """Two-sided binomial p-value of left_picks against half of ab_votes (1.0 without a/b votes)."""
    shared_pairs: int
    """Pairs this person and someone else both labelled (skips aside): the n of `agreement`."""
    agreement: float | None
    """Share of those comparisons in which the labels were equal; None without shared pairs."""
    median_seconds: float | None
    """Median time on a pair before voting; None when no vote recorded its time."""
    reliability: AnnotatorReliability | None = None
    """Their Dawid-Skene accuracy on pairs with other a/b votes; None without such pairs."""
    gold_right: int = 0
    """Of their a/b votes on gold pairs (an admin marked the right answer), the ones that named it..."""
    gold_judged: int = 0
    """...of this many."""
    model_agreeing: int = 0
    """Of their a/b votes as the last round measured them, the ones a head fitted on everyone else's votes agrees
    with..."""
    model_judged: int = 0
    """...of this many (0: not measured)."""
    weighting_accuracy: float = UNKNOWN_ACCURACY
    """The accuracy `[votes] weighting = "reliability"` weighs their votes by (annotate.reliability.voter_accuracies):
    from gold, else Dawid-Skene, else the agreement above, capped by a side bias; UNKNOWN_ACCURACY when none is
    known..."""
    weighting_source: str = ""
    """...and which of those it came from ("gold", "Dawid-Skene", "agreement", "side bias", or one of the first three
    "capped by side bias"; "" for none: annotate.reliability.voter_accuracy_sources; "excluded" for one an admin
    excluded, whose votes weigh nothing)."""

    @property
    def gold_accuracy(self) -> float | None:
        return self.gold_right / self.gold_judged if self.gold_judged else None

    @property
    def model_agreement(self) -> float | None:
        return self.model_agreeing / self.model_judged if self.model_judged else None

    @property
    def left_share(self) -> float | None:
        return self.left_picks / self.ab_votes if self.ab_votes else None


def people(votes: list[Vote], agreement: AgreementReport, gold: dict[str, tuple[int, int]] | None = None,
           model_agreement: dict[str, tuple[int, int]] | None = None,
           excluded: frozenset[str] = frozenset()) -> list[Person]:
    """Every annotator who voted, most votes first; `gold`: Store.gold_results(), per name (right, judged);
    `model_agreement`: per name (agreeing, judged), as `recorded_model_agreement` reads it; `excluded`: the names an
    admin excluded. Their figures are shown as for anyone, but the accuracy for weighting is what a round weighs by:
    on the counted votes alone, and none for the excluded (their source is "excluded")."""
    by_name: dict[str, list[Vote]] = {}
    for vote in votes:
        by_name.setdefault(vote.annotator, []).append(vote)
    shared: dict[str, tuple[int, float]] = {}  # name -> (comparisons, agreeing comparisons)
    for pair in agreement.by_pair:
        for name in (pair.annotator_1, pair.annotator_2):
            items, agreeing = shared.get(name, (0, 0.0))
            shared[name] = (items + pair.items, agreeing + pair.percent * pair.items)
    fit = dawid_skene(labels_from_votes(votes))
    reliability = fit.annotators
    counted = [vote for vote in votes if vote.annotator not in excluded]
    counted_fit = dawid_skene(labels_from_votes(counted)) if excluded else fit
    counted_gold = {name: result for name, result in (gold or {}).items() if name not in excluded}
    weighting = voter_accuracy_sources(counted_fit, counted_gold, model_agreement, side_counts(counted))
    weighting.update({name: (0.0, "excluded") for name in excluded})
    rows = []
    for name, own in by_name.items():
        ab = [vote for vote in own if vote.choice in ("a", "b")]
        left = sum(picked_left(vote) for vote in ab)
        seconds = [vote.seconds for vote in own if vote.seconds is not None]
        items, agreeing = shared.get(name, (0, 0.0))
        rows.append(Person(name, len(own), len(ab), left, binomial_two_sided_p(left, len(ab)), items,
                           agreeing / items if items else None, statistics.median(seconds) if seconds else None,
                           reliability.get(name), *(gold or {}).get(name, (0, 0)),
                           *(model_agreement or {}).get(name, (0, 0)), *weighting.get(name, (UNKNOWN_ACCURACY, ""))))
    return sorted(rows, key=lambda person: (-person.votes, person.name))


def store_people(store, agreement: AgreementReport | None = None) -> list[Person]:
    """`people` over a store now: its votes, agreement (`agreement` when the caller has read it), gold results, the
    last round's model agreement and its exclusions."""
    return people(store.votes(), agreement if agreement is not None else store.agreement(), store.gold_results(),
                  recorded_model_agreement(store.rounds()), frozenset(store.excluded_annotators()))


PEOPLE_COLUMNS = ["annotator", "votes", "a/b votes", "left picks (95% interval)", "p (left vs half)",
                  "agreement with others (n)", "median seconds", "Dawid-Skene accuracy (95%, n)",
                  "gold accuracy (95%, n)", "agreement with the reward model (95%, n)",
                  "accuracy for weighting (from)", "looks careless"]

FLAG_MEDIAN_SECONDS = 1.5
"""A median time on a pair below this (no one reads two answers in it) is flagged..."""
FLAG_SPEED_VOTES = 10
"""...over at least this many timed votes."""
FLAG_ACCURACY_HIGH = 0.6
"""A Dawid-Skene accuracy whose 95% interval stays below this is flagged..."""
FLAG_ACCURACY_PAIRS = 20
"""...over at least this many pairs shared with other a/b votes."""
FLAG_GOLD_VOTES = 10
"""A gold accuracy whose 95% interval stays below FLAG_ACCURACY_HIGH is flagged over at least this many gold votes."""
FLAG_MODEL_AGREEMENT_HIGH = 0.5
"""An agreement with the reward model whose 95% interval stays below this (votes that run against what everyone
else's taught it) is flagged over at least FLAG_ACCURACY_PAIRS votes. Chance, not FLAG_ACCURACY_HIGH: a careful
annotator agrees with a model right on 65% of pairs only 57.5% of the time (rlhf.reward.annotator_agreement)."""


def careless_reason(person: Person) -> str:
    """Why `person`'s votes look careless, in one line ("" when nothing does): one side picked far more often than
    chance, a median time no one reads two answers in, or labels that agree with the others' no better than chance.
    The thresholds (FLAG_*) keep a careful person's chance of a flag small; a flag is a reason to look, not a verdict.
    """
    reasons = []
    if side_click_share(person.left_picks, person.ab_votes) > 0:  # the bias weighting discounts, one test for both
        side, share = ("left", person.left_share) if person.left_share > 0.5 else ("right", 1 - person.left_share)
        reasons.append(f"picks the {side} answer in {share:.0%} of {person.ab_votes} a/b votes (p = "
                       f"{person.left_p:.1g})")
    timed = person.median_seconds is not None and person.votes >= FLAG_SPEED_VOTES
    if timed and person.median_seconds < FLAG_MEDIAN_SECONDS:
        reasons.append(f"a median of {person.median_seconds:.1f} s a pair")
    estimate = person.reliability
    if estimate is not None and estimate.n >= FLAG_ACCURACY_PAIRS and estimate.high < FLAG_ACCURACY_HIGH:
        reasons.append(f"agrees with the others no better than chance ({estimate.accuracy:.0%}, at most "
                       f"{estimate.high:.0%}, n={estimate.n})")
    if person.gold_judged >= FLAG_GOLD_VOTES:
        low, high = wilson_interval(person.gold_accuracy, person.gold_judged)
        if high < FLAG_ACCURACY_HIGH:
            reasons.append(f"right on {person.gold_accuracy:.0%} of {person.gold_judged} gold pairs (at most "
                           f"{high:.0%})")
    if person.model_judged >= FLAG_ACCURACY_PAIRS:
        low, high = wilson_interval(person.model_agreement, person.model_judged)
        if high < FLAG_MODEL_AGREEMENT_HIGH:
            reasons.append(f"votes against a reward model fitted on the others' votes ({person.model_agreement:.0%} "
                           f"agreement, at most {high:.0%}, n={person.model_judged})")
    return "; ".join(reasons)


def people_rows(rows: list[Person]) -> list[list]:
    """The table as people read it: shares with their interval or n beside them."""
    table = []
    for person in rows:
        if person.ab_votes:
            low, high = wilson_interval(person.left_share, person.ab_votes)
            left = f"{person.left_share:.0%} ({low:.0%}-{high:.0%})"
        else:
            left = ""
        agreement = "" if person.agreement is None else f"{person.agreement:.0%} (n={person.shared_pairs})"
        seconds = "" if person.median_seconds is None else f"{person.median_seconds:.1f}"
        estimate = person.reliability
        accuracy = "" if estimate is None else \
            f"{estimate.accuracy:.0%} ({estimate.low:.0%}-{estimate.high:.0%}, n={estimate.n})"
        gold = "" if person.gold_accuracy is None else \
            f"{person.gold_accuracy:.0%} ({_interval_text(person.gold_accuracy, person.gold_judged)}, " \
            f"n={person.gold_judged})"
        model = "" if person.model_agreement is None else \
            f"{person.model_agreement:.0%} ({_interval_text(person.model_agreement, person.model_judged)}, " \
            f"n={person.model_judged})"
        weighting = "excluded: not trained on" if person.weighting_source == "excluded" else \
            f"{person.weighting_accuracy:.0%} ({person.weighting_source or 'nothing known yet'})"
        table.append([person.name, person.votes, person.ab_votes, left, f"{person.left_p:.3g}", agreement, seconds,
                      accuracy, gold, model, weighting, careless_reason(person)])
    return table


def _interval_text(share: float, n: int) -> str:
    """"62%-91%": the share's 95% Wilson interval over n."""
    low, high = wilson_interval(share, n)
    return f"{low:.0%}-{high:.0%}"


@dataclass(frozen=True)
class GoldProposal:
    """A pair the app proposes as gold: careful annotators agree on its right answer."""

    pair_id: int
    side: str
    voters: int
    """Careful annotators whose a/b votes all picked `side`."""


def careful_names(rows: list[Person], excluded: set[str]) -> set[str]:
    """Who counts as careful: not excluded, and no careless_reason."""
    return {person.name for person in rows if person.name not in excluded and not careless_reason(person)}


def gold_proposals(votes: list[Vote], careful: set[str], gold_ids: set[int], min_voters: int = 2) -> list[GoldProposal]:
    """Pairs that are not gold yet on which at least `min_voters` careful annotators voted a or b, all the same side
    (ties and the others' votes aside), most voters first, then the oldest pair."""
    sides: dict[int, dict[str, str]] = {}
    for vote in votes:
        if vote.choice in ("a", "b") and vote.annotator in careful and vote.pair_id not in gold_ids:
            sides.setdefault(vote.pair_id, {})[vote.annotator] = vote.choice
    proposals = [GoldProposal(pair_id, next(iter(set(by.values()))), len(by)) for pair_id, by in sides.items()
                 if len(by) >= min_voters and len(set(by.values())) == 1]
    return sorted(proposals, key=lambda p: (-p.voters, p.pair_id))


def store_gold_proposals(store, persons: list[Person] | None = None) -> list[GoldProposal]:
    """gold_proposals over a store's votes now: careful means not excluded and not flagged in the people table
    (`persons`, when the caller has it already)."""
    votes = store.votes()
    persons = persons if persons is not None else store_people(store)
    return gold_proposals(votes, careful_names(persons, set(store.excluded_annotators())), set(store.gold_pair_ids()))
