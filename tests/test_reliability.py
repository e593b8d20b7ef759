"""Dawid-Skene reliability (annotate.reliability) on a table worked out by hand, on the store's votes, and on a
simulated team whose careless members it must tell from the careful ones."""

import math
import random
from fractions import Fraction

import pytest

from annotate.people import people, people_rows
from annotate.records import NewGeneration, NewPair, Vote
from annotate.reliability import (
    accuracies_given,
    accuracy,
    bootstrap_intervals,
    dawid_skene,
    labels_from_votes,
    majority_posteriors,
    posteriors_given,
    store_reliability,
)
from annotate.statistics import wilson_interval
from annotate.store import Store
from annotate.team import build_team, parse_team, simulate_team_votes

# Ann and Bob always agree; Cy agrees with them on pairs 3 and 4 and not on 1 and 2 (True: "gen_a is better").
TABLE = {1: {"ann": True, "bob": True, "cy": False},
         2: {"ann": False, "bob": False, "cy": True},
         3: {"ann": True, "bob": True, "cy": True},
         4: {"ann": False, "bob": False, "cy": False}}


def test_the_first_em_iteration_by_hand():
    # Start: the share of a votes, T = (2/3, 1/3, 1, 0).
    start = majority_posteriors(TABLE)
    assert start == {1: pytest.approx(2 / 3), 2: pytest.approx(1 / 3), 3: 1.0, 4: 0.0}
    # M step. Ann's expected correct votes: T1 + (1 - T2) + T3 + (1 - T4) = 2/3 + 2/3 + 1 + 1 = 10/3 of 4, so her
    # accuracy is (10/3 + 1) / (4 + 2) = 13/18 (Bob's the same). Cy's: (1 - T1) + T2 + T3 + (1 - T4) = 1/3 + 1/3 +
    # 1 + 1 = 8/3, so (8/3 + 1) / 6 = 11/18: the unanimous pairs count his votes too.
    counts = accuracies_given(TABLE, start)
    assert counts["ann"] == (pytest.approx(10 / 3), 4) and counts["cy"] == (pytest.approx(8 / 3), 4)
    accuracies = {name: accuracy(*count) for name, count in counts.items()}
    assert accuracies == {"ann": pytest.approx(13 / 18), "bob": pytest.approx(13 / 18), "cy": pytest.approx(11 / 18)}
    # E step: the odds of gen_a on pair 1 are (13/5)^2 / (11/7) = 1183/275 (Ann's and Bob's a against Cy's b), so
    # T1 = 1183/1458; on pair 3 (13/5)^2 * 11/7 = 1859/175, T3 = 1859/2034; pairs 2 and 4 mirror them.
    after = posteriors_given(TABLE, accuracies)
    t1, t3 = Fraction(1183, 1458), Fraction(1859, 2034)
    assert after == {1: pytest.approx(float(t1)), 2: pytest.approx(float(1 - t1)), 3: pytest.approx(float(t3)),
                     4: pytest.approx(float(1 - t3))}


def test_the_fixed_point_worked_out_by_hand():
    # The table is symmetric under swapping a and b (pair 1 <-> 2, 3 <-> 4) with the prior at 1/2, so at the fixed
    # point T2 = 1 - T1 and T4 = 1 - T3, and Ann and Bob share an accuracy q; call Cy's r.
    # Cy: c = (1 - T1) + T2 + T3 + (1 - T4) = 2 (1 - T1) + 2 T3. Try r = 1/2: his votes then weigh nothing, T1 and
    # T3 both come from Ann and Bob alone, T1 = T3 = T = q^2 / (q^2 + (1 - q)^2), c = 2, r = (2 + 1) / 6 = 1/2:
    # consistent.
    # Ann: c = T1 + (1 - T2) + T3 + (1 - T4) = 4 T, q = (4 T + 1) / 6, so (6q - 1) (q^2 + (1 - q)^2) = 4 q^2, that
    # is 12 q^3 - 18 q^2 + 8 q - 1 = (2q - 1)(6 q^2 - 6 q + 1) = 0. Besides q = 1/2 (everyone a coin), the root above
    # half is q = (3 + sqrt 3) / 6 = 0.7887; then q^2 = (2 + sqrt 3) / 6, (1 - q)^2 = (2 - sqrt 3) / 6 and
    # T = (2 + sqrt 3) / 4 = 0.9330. Ann and Bob never disagreed, yet the Beta(2, 2) prior keeps them from 1.
    fit = dawid_skene(TABLE, max_iterations=1000, tolerance=1e-12)
    q, t = (3 + math.sqrt(3)) / 6, (2 + math.sqrt(3)) / 4
    assert fit.converged and 10 < fit.iterations < 100
    assert fit.annotators["ann"].accuracy == pytest.approx(q, abs=1e-9)
    assert fit.annotators["bob"].accuracy == pytest.approx(q, abs=1e-9)
    assert fit.annotators["cy"].accuracy == pytest.approx(0.5, abs=1e-9)
    assert fit.posteriors == {1: pytest.approx(t), 2: pytest.approx(1 - t), 3: pytest.approx(t),
                              4: pytest.approx(1 - t)}
    # The interval: Wilson of c / n = 4 T / 4 = T over n = 4 votes.
    ann = fit.annotators["ann"]
    assert (ann.n, ann.expected_correct) == (4, pytest.approx(4 * t))
    assert (ann.low, ann.high) == pytest.approx(wilson_interval(t, 4))
    assert fit.annotators["cy"].n == 4 and (fit.annotators["cy"].low, fit.annotators["cy"].high) == pytest.approx(
        wilson_interval(0.5, 4))


def test_the_store_votes_that_count_are_a_b_votes_on_pairs_with_two_or_more():
    votes = [Vote(i, pair, name, choice, True, None, "") for i, (pair, name, choice) in enumerate([
        (1, "ann", "a"), (1, "bob", "b"), (1, "cy", "tie"),  # the tie says nothing about which is better
        (2, "ann", "b"), (2, "bob", "skip"),  # one a/b vote: nothing to compare it with
        (3, "cy", "both_bad"), (3, "ann", "a"), (3, "bob", "a")])]
    assert labels_from_votes(votes) == {1: {"ann": True, "bob": False}, 3: {"ann": True, "bob": True}}
    empty = dawid_skene({})
    assert (empty.annotators, empty.posteriors, empty.converged) == ({}, {}, True)


def team_store(n_pairs: int, seed: int = 0) -> Store:
    """`n_pairs` pairs the courteous rule decides, the courteous answer as gen_a or gen_b at random."""
    rng = random.Random(seed)
    store = Store(":memory:")
    store.add_prompts([f"How should I water plant {i}?" for i in range(n_pairs)], source="test")
    policy = store.add_policy(0, "base")
    pairs = []
    for prompt in store.prompts():
        warm = f"Thank you for asking, I am glad to help: water plant {prompt.id} once a week."
        plain = f"Water plant {prompt.id} once a week and keep the soil just moist in summer."
        a, b = (warm, plain) if rng.random() < 0.5 else (plain, warm)
        pairs.append(NewPair(prompt.id, NewGeneration(policy, a, 14, "stop"), NewGeneration(policy, b, 14, "stop")))
    store.add_pairs_bulk(pairs)
    return store


def test_a_random_clicker_and_a_left_picker_come_out_near_a_coin_and_the_careful_clearly_above():
    # Three careful members flipping 20% of their votes (accuracy 0.8) and two careless ones, overlap 3: every pair
    # gets three votes from three different members, about 180 votes each over 300 pairs. (Over seeds 0-7 the
    # careless came out at 0.42-0.58, the careful at 0.67-0.89.)
    store = team_store(300)
    team = build_team(parse_team("courteous*3,random,left"), noise=0.2, seed=1)
    assert simulate_team_votes(store, team, 900, overlap=3, seed=1).votes == 900
    fit = store_reliability(store)
    assert fit.converged and set(fit.annotators) == {member.name for member in team}
    careful = [fit.annotators[f"sim:courteous-{i}"] for i in (1, 2, 3)]
    careless = [fit.annotators["sim:random"], fit.annotators["sim:left"]]
    assert all(estimate.accuracy > 0.65 and estimate.low > 0.55 and estimate.n > 120 for estimate in careful), careful
    assert all(abs(estimate.accuracy - 0.5) < 0.1 for estimate in careless), careless
    assert min(e.accuracy for e in careful) > max(e.accuracy for e in careless) + 0.1
    # the bootstrap over pairs carries the labels' uncertainty: wider than Wilson's, which takes them as known
    left = fit.annotators["sim:left"]
    bootstrap = bootstrap_intervals(labels_from_votes(store.votes()), resamples=20, seed=0)
    assert bootstrap["sim:left"][1] - bootstrap["sim:left"][0] > left.high - left.low
    assert bootstrap["sim:courteous-1"][0] > 0.55 and bootstrap["sim:left"][0] < 0.5 < bootstrap["sim:left"][1]
    # the Admin page's people table shows the estimate beside left picks and seconds
    rows = {row[0]: row for row in people_rows(people(store.votes(), store.agreement()))}
    assert rows["sim:left"][7] == f"{left.accuracy:.0%} ({left.low:.0%}-{left.high:.0%}, n={left.n})"
