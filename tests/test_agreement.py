"""Agreement maths checked against numbers worked out by hand."""

import math

import pytest

from annotate.agreement import AgreementReport, PairAgreement, agreement_report, cohens_kappa, percent_agreement


def test_percent_agreement_counts_equal_pairs():
    # 3 of 4 pairs agree: 3/4 = 0.75
    assert percent_agreement([("a", "a"), ("b", "b"), ("a", "b"), ("tie", "tie")]) == 0.75


def test_percent_agreement_needs_pairs():
    with pytest.raises(ValueError):
        percent_agreement([])


def test_cohens_kappa_by_hand():
    # rater 1: a a b b tie ; rater 2: a b b b tie
    # p_o = 4/5 = 0.8 (items 1, 3, 4, 5 agree)
    # rater 1 counts: a 2, b 2, tie 1 ; rater 2 counts: a 1, b 3, tie 1
    # p_e = (2*1 + 2*3 + 1*1) / 5^2 = 9/25 = 0.36
    # kappa = (0.8 - 0.36) / (1 - 0.36) = 0.44 / 0.64 = 0.6875
    assert cohens_kappa(["a", "a", "b", "b", "tie"], ["a", "b", "b", "b", "tie"]) == pytest.approx(0.6875)


def test_cohens_kappa_perfect_and_worse_than_chance():
    # perfect: p_o = 1, p_e = (1*1 + 1*1)/4 = 0.5 -> (1 - 0.5)/(1 - 0.5) = 1
    assert cohens_kappa(["a", "b"], ["a", "b"]) == 1.0
    # always opposite: p_o = 0, p_e = (1*1 + 1*1)/4 = 0.5 -> (0 - 0.5)/0.5 = -1
    assert cohens_kappa(["a", "b"], ["b", "a"]) == -1.0


def test_cohens_kappa_is_undefined_when_both_use_one_label():
    # p_e = (3*3)/9 = 1: chance agreement is already perfect
    assert math.isnan(cohens_kappa(["a", "a", "a"], ["a", "a", "a"]))


def test_cohens_kappa_rejects_bad_lengths():
    with pytest.raises(ValueError, match="equally long"):
        cohens_kappa(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="at least one item"):
        cohens_kappa([], [])


def test_agreement_report_overall_and_per_pair():
    labels = {
        1: {"ann": "a", "bob": "a", "cid": "b"},
        2: {"ann": "b", "bob": "b"},
        3: {"bob": "tie", "cid": "tie"},
        4: {"ann": "a"},  # one label: ignored
    }
    report = agreement_report(labels)
    # rating pairs (first = name sorting first):
    #   item 1: ann-bob (a, a), ann-cid (a, b), bob-cid (a, b); item 2: ann-bob (b, b); item 3: bob-cid (tie, tie)
    # pooled: 5 pairs, 3 agree -> 0.6
    # pooled raters: first = [a, a, a, b, tie], second = [a, b, b, b, tie]
    #   p_o = 0.6; counts first a3 b1 tie1, second a1 b3 tie1; p_e = (3*1 + 1*3 + 1*1)/25 = 7/25 = 0.28
    #   kappa = (0.6 - 0.28) / 0.72 = 0.32 / 0.72 = 4/9
    # ann-bob: (a, a), (b, b): 1.0; p_e = (1*1 + 1*1)/4 = 0.5 -> kappa 1
    # ann-cid: (a, b): 0.0; p_e = 0 -> kappa 0
    # bob-cid: (a, b), (tie, tie): 0.5; first a1 tie1, second b1 tie1: p_e = 1/4 -> (0.5 - 0.25)/0.75 = 1/3
    assert report == AgreementReport(
        items=3, rating_pairs=5, percent=0.6, kappa=pytest.approx(4 / 9),
        by_pair=[
            PairAgreement("ann", "bob", items=2, percent=1.0, kappa=1.0),
            PairAgreement("ann", "cid", items=1, percent=0.0, kappa=0.0),
            PairAgreement("bob", "cid", items=2, percent=0.5, kappa=pytest.approx(1 / 3)),
        ],
    )


def test_agreement_report_without_shared_items():
    assert agreement_report({1: {"ann": "a"}, 2: {}}) == AgreementReport(items=0, rating_pairs=0, percent=None, kappa=None)


def test_agreement_report_undefined_kappa_is_none():
    report = agreement_report({1: {"ann": "a", "bob": "a"}})
    assert (report.percent, report.kappa, report.by_pair[0].kappa) == (1.0, None, None)
