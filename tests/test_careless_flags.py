"""Who looks careless (annotate.people.careless_reason): the thresholds on hand-made figures, then a simulated team at
overlap 1 where the left-picker and the hasty clicker are flagged within their first 50 votes and no careful member is.
"""

from __future__ import annotations

from annotate.people import Person, careless_reason, people, people_rows
from annotate.reliability import AnnotatorReliability
from annotate.statistics import binomial_two_sided_p
from annotate.team import build_team, parse_team, simulate_team_votes
from tests.test_reliability import team_store


def person(ab: int, left: int, seconds: float | None = 10.0, reliability: AnnotatorReliability | None = None,
           votes: int | None = None) -> Person:
    return Person("ann", votes if votes is not None else ab, ab, left, binomial_two_sided_p(left, ab), 0, None,
                  seconds, reliability)


def test_the_flags_and_their_thresholds_worked_by_hand():
    # 20 left picks of 20: p = 2 * 0.5^20 = 1.9e-6 < 0.001, and 20 a/b votes are enough
    assert careless_reason(person(20, 20)) == "picks the left answer in 100% of 20 a/b votes (p = 2e-06)"
    assert careless_reason(person(19, 19)) == ""  # p = 3.8e-6, but fewer than 20 a/b votes
    # 2 left picks of 30: the right answer 28 times, p = 2 * (1 + 30 + 435) / 2^30 = 8.7e-7
    assert careless_reason(person(30, 2)) == "picks the right answer in 93% of 30 a/b votes (p = 9e-07)"
    assert careless_reason(person(30, 10)) == ""  # p = 0.099: a careful person's spread
    assert careless_reason(person(12, 6, seconds=0.6)) == "a median of 0.6 s a pair"
    assert careless_reason(person(9, 5, seconds=0.6)) == ""  # fewer than 10 timed votes
    chance = AnnotatorReliability("ann", 0.5, 0.31, 0.58, 25, 12.5)
    assert careless_reason(person(25, 12, reliability=chance)) == \
        "agrees with the others no better than chance (50%, at most 58%, n=25)"
    assert careless_reason(person(25, 12, reliability=AnnotatorReliability("ann", 0.5, 0.4, 0.62, 25, 12.5))) == ""
    both = careless_reason(person(20, 20, seconds=0.5))
    assert both.startswith("picks the left answer") and both.endswith("; a median of 0.5 s a pair")


def test_a_simulated_teams_left_picker_and_hasty_clicker_are_flagged_within_50_votes_and_no_careful_member_is():
    for seed in range(4):
        store = team_store(250, seed=seed)
        team = build_team(parse_team("courteous*3,left,hasty"), 0.25, seed)
        simulate_team_votes(store, team, 250, seed=seed)  # about 50 votes each, overlap 1
        first_50 = [vote for name in {v.annotator for v in store.votes()}
                    for vote in sorted(store.votes(annotator=name), key=lambda v: v.id)[:50]]
        flags = {row[0]: row[-1] for row in people_rows(people(first_50, store.agreement()))}
        assert flags["sim:left"].startswith("picks the left answer in 100%"), (seed, flags)
        assert flags["sim:hasty"].startswith("a median of 0."), (seed, flags)
        assert all(flags[f"sim:courteous-{i}"] == "" for i in (1, 2, 3)), (seed, flags)
        store.close()
