"""Agreement with a reward model that never saw the annotator's votes (rlhf.reward.annotator_agreement), worked by
hand, and how the people table reads and flags it (annotate.people)."""

from __future__ import annotations

import torch

from annotate.people import PEOPLE_COLUMNS, Person, careless_reason, people_rows
from annotate.reliability import recorded_model_agreement
from annotate.records import Round
from rlhf.reward.annotator_agreement import held_out_agreement


def mean_difference(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """A head a hand can fit: the mean of the votes' feature differences."""
    return (chosen - rejected).mean(0)


def one_feature(diffs: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = torch.tensor(diffs, dtype=torch.float64)[:, None]  # (N, 1): picked answer's feature
    return chosen, torch.zeros_like(chosen)  # the other answer's at 0: the difference is `diffs`


def test_each_annotator_is_scored_by_a_head_fitted_on_the_others_votes_alone():
    # alice's differences 2, 1, 1; bob's 1, -1; carol's -3, -2
    chosen, rejected = one_feature([2, 1, 1, 1, -1, -3, -2])
    voters = ["alice"] * 3 + ["bob"] * 2 + ["carol"] * 2
    measured = held_out_agreement(chosen, rejected, voters, mean_difference, min_other_votes=1)
    # alice: the others' mean (1 - 1 - 3 - 2) / 4 = -1.25 < 0 scores none of her three picks higher
    # bob: (2 + 1 + 1 - 3 - 2) / 5 = -0.2 < 0 agrees with his -1 alone; carol: (2 + 1 + 1 + 1 - 1) / 5 = 0.8 > 0, none
    assert measured == {"alice": (0, 3), "bob": (1, 2), "carol": (0, 2)}
    # fitted on everyone (mean -1/7) it would agree with both of carol's: her own votes would have scored themselves
    assert (torch.tensor([-3.0, -2.0]) * mean_difference(chosen, rejected) > 0).all()


def test_an_annotator_whose_others_cast_too_few_votes_is_left_out():
    chosen, rejected = one_feature([2, 1, 1, 1, -1, -3, -2])
    voters = ["alice"] * 3 + ["bob"] * 2 + ["carol"] * 2
    measured = held_out_agreement(chosen, rejected, voters, mean_difference, min_other_votes=5)
    assert set(measured) == {"bob", "carol"}  # alice's others cast 4


def test_the_people_table_reads_the_newest_round_that_measured_and_flags_votes_against_it():
    rounds = [Round(1, "done", "", None, {"people/model_agreement": {"ann": [3, 4]}}, None, None),
              Round(2, "done", "", None, {"people/model_agreement": {"ann": [5, 30]}}, None, None),
              Round(3, "failed", "", None, {}, None, None)]
    assert recorded_model_agreement(rounds) == {"ann": (5, 30)}
    assert recorded_model_agreement(rounds[2:]) == {}

    def person(agreeing: int, judged: int) -> Person:
        return Person("ann", judged, judged, judged // 2, 1.0, 0, None, 8.0, None, 0, 0, agreeing, judged)

    # 5 of 30: Wilson's 95% interval reaches 34%, below chance: flagged; 14 of 30 reaches 64%: not
    assert "votes against a reward model fitted on the others' votes (17% agreement, at most 34%, n=30)" in \
        careless_reason(person(5, 30))
    assert careless_reason(person(14, 30)) == ""
    assert careless_reason(person(2, 19)) == ""  # too few votes to tell
    column = PEOPLE_COLUMNS.index("agreement with the reward model (95%, n)")
    assert people_rows([person(5, 30)])[0][column] == "17% (7%-34%, n=30)"
