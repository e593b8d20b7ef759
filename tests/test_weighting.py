"""votes.weighting = "reliability" (#30 item 4): each preference weighted, and flipped where careful voters outweigh a
careless majority, by how sure its votes are given each voter's accuracy (annotate.reliability.weighted_preferences),
worked out by hand; the weights reach the head's and LP-FT's losses; the round records the weighting."""

from __future__ import annotations

import math

import pytest
import torch

from annotate.agreement import AgreementReport
from annotate.people import PEOPLE_COLUMNS, people, people_rows
from annotate.records import Preference, Vote
from annotate.reliability import (UNKNOWN_ACCURACY, AnnotatorReliability, DawidSkeneFit, agreement_accuracies,
                                  side_click_share, side_counts, voter_accuracies, voter_accuracy_sources,
                                  weighted_preferences)
from rlhf.reward import bt_head, strategies
from rlhf.reward.config import StrategyConfig, VotesConfig


def preference(pair_id: int, chosen: str = "A", rejected: str = "B") -> Preference:
    return Preference(pair_id, "prompt", chosen, rejected, votes=1, kind="sample")


def votes(table: list[tuple[int, str, str]]) -> list[Vote]:
    return [Vote(i, pair, name, choice, True, 5.0, "") for i, (pair, name, choice) in enumerate(table)]


def test_weights_and_flips_worked_out_by_hand():
    accuracies = {"careful": 0.9, "careful2": 0.9, "careless": 0.5, "careless2": 0.5}
    cast = votes([(1, "careful", "a"), (1, "careful2", "a"), (1, "careless", "b"),  # a: L = 2 ln 9, P = 81/82
                  (2, "careless", "a"),  # P = 1/2: says nothing, weight 0
                  (3, "careful", "b"),  # P = 0.9, weight 0.8
                  (4, "careless", "a"), (4, "careless2", "a"), (4, "careful", "b"),  # majority a, L = -ln 9
                  (5, "new", "a")])  # nobody knows new: UNKNOWN_ACCURACY 0.75, weight 0.5
    prefs = [preference(1), preference(2), preference(3), preference(4, "A4", "B4"), preference(5), preference(6)]
    out = weighted_preferences(prefs, cast, accuracies, gold_pairs=frozenset({6}))
    raw = [2 * 81 / 82 - 1, 0.0, 0.8, 0.8, 2 * UNKNOWN_ACCURACY - 1, 1.0]  # pair 6: gold, its side, weight 1
    mean = sum(raw) / len(raw)
    assert [p.weight for p in out] == pytest.approx([w / mean for w in raw])
    assert sum(p.weight for p in out) == pytest.approx(len(out))  # scaled to mean 1, as majority labels weigh
    assert (out[3].chosen, out[3].rejected) == ("B4", "A4")  # the careful vote outweighs two careless ones: flipped
    assert [(p.chosen, p.rejected) for p in out if p.pair_id != 4] == [("A", "B")] * 5


def test_all_unknown_voters_on_single_votes_weigh_as_the_majority_does():
    out = weighted_preferences([preference(1), preference(2)], votes([(1, "x", "a"), (2, "y", "b")]), {})
    assert [p.weight for p in out] == pytest.approx([1.0, 1.0])
    # no vote says anything (all at 1/2): the weights stay 0 rather than dividing by zero
    assert [p.weight for p in weighted_preferences([preference(1)], votes([(1, "x", "a")]), {"x": 0.5})] == [0.0]


def test_a_voters_accuracy_is_gold_from_10_gold_votes_else_dawid_skene_from_10_shared_votes():
    fit = DawidSkeneFit({"ds": AnnotatorReliability("ds", 0.8, 0.6, 0.9, 12, 9.6),
                         "few": AnnotatorReliability("few", 0.9, 0.5, 0.99, 9, 8.1),
                         "both": AnnotatorReliability("both", 0.9, 0.7, 0.95, 30, 27.0)}, {}, 5, True)
    got = voter_accuracies(fit, {"both": (5, 10), "gold": (18, 20), "little": (3, 3)})
    assert got == pytest.approx({"ds": 0.8, "both": 6 / 12, "gold": 19 / 22})  # few, little: too few to say


def test_accuracies_from_agreement_with_a_held_out_head_worked_out_by_hand():
    # excess e = g - 1/2: 0.2, 0.1, 0, -0.1; mean 0.05; sample variance (0.15^2 + 0.05^2 + 0.05^2 + 0.15^2) / 3
    # = 0.05 / 3; s^2 = 1 / 400 each, tau^2 = 0.05 / 3 - 0.0025, shrink factor tau^2 / (0.05 / 3) = 0.85:
    # 0.1775, 0.0925, 0.0075, -0.0775 (floored at 0); the largest stands for UNKNOWN_ACCURACY = 0.75
    got = agreement_accuracies({"A": (70, 100), "B": (60, 100), "C": (50, 100), "D": (40, 100), "few": (19, 19)})
    assert got == pytest.approx({"A": 0.75, "B": 0.5 + 0.25 * 0.0925 / 0.1775, "C": 0.5 + 0.25 * 0.0075 / 0.1775,
                                 "D": 0.5})  # few: under 20 judged votes, not placed
    # a spread no wider than sampling noise (0.005 against s = 0.05): everyone shrinks to the mean, weighs alike
    assert agreement_accuracies({"A": (60, 100), "B": (61, 100)}) == pytest.approx({"A": 0.75, "B": 0.75})
    assert agreement_accuracies({"A": (70, 100)}) == {}  # nobody to compare with: q and p cannot be told apart
    assert agreement_accuracies({"A": (50, 100), "B": (45, 100)}) == {}  # nobody beats chance: nothing to anchor


def test_gold_and_dawid_skene_outrank_agreement_in_a_voters_accuracy():
    fit = DawidSkeneFit({"ds": AnnotatorReliability("ds", 0.8, 0.6, 0.9, 12, 9.6)}, {}, 5, True)
    agreement = {"ds": (50, 100), "gold": (50, 100), "coin": (50, 100), "sure": (70, 100)}
    got = voter_accuracies(fit, {"gold": (18, 20)}, agreement)
    # e 0, 0, 0, 0.2: mean 0.05, variance 0.03 / 3 = 0.01, tau^2 0.0075, factor 0.75: 0.0125 and 0.1625
    shrunk_coin = 0.5 + 0.25 * 0.0125 / 0.1625
    assert got == pytest.approx({"ds": 0.8, "gold": 19 / 22, "coin": shrunk_coin, "sure": 0.75})
    sources = voter_accuracy_sources(fit, {"gold": (18, 20)}, agreement)
    assert {name: source for name, (_, source) in sources.items()} == \
        {"ds": "Dawid-Skene", "gold": "gold", "coin": "agreement", "sure": "agreement"}


def test_the_share_of_side_clicks_worked_out_by_hand():
    assert side_click_share(20, 20) == 1.0  # p = 2 / 2^20: all left
    assert side_click_share(1, 20) == pytest.approx(0.9)  # p = 2 x 21 / 2^20 = 4e-5: |2 / 20 - 1|
    assert side_click_share(15, 20) == 0.0  # p = 2 x 0.0207 = 0.041: no bias established
    assert side_click_share(19, 19) == 0.0  # under 20 a/b votes
    assert side_click_share(70, 100) == pytest.approx(0.4)  # p = 8e-5
    cast = [Vote(1, 1, "x", "a", True, None, ""), Vote(2, 2, "x", "b", True, None, ""),
            Vote(3, 3, "x", "b", False, None, ""), Vote(4, 4, "x", "tie", True, None, "")]
    assert side_counts(cast) == {"x": (2, 3)}  # a shown left, b shown right; the tie says nothing


def test_a_side_bias_sets_an_unknown_voters_accuracy_and_caps_a_known_ones():
    fit = DawidSkeneFit({"ds": AnnotatorReliability("ds", 0.8, 0.6, 0.9, 12, 9.6)}, {}, 5, True)
    agreement = {"sure": (70, 100), "coin": (50, 100)}  # 0.75 and 0.5 + 0.25 / 15 (the people-table test below)
    sides = {"left": (20, 20), "half": (1, 20), "ds": (80, 100), "sure": (20, 20), "coin": (50, 100)}
    sources = voter_accuracy_sources(fit, {}, agreement, sides)
    assert sources["left"] == (0.5, "side bias")  # s = 1: a coin
    assert sources["half"] == (pytest.approx(0.5 + 0.1 * 0.25), "side bias")  # s = 0.9 of UNKNOWN_ACCURACY's excess
    assert sources["ds"] == (pytest.approx(0.5 + 0.4 / 2), "Dawid-Skene, capped by side bias")  # s = 0.6: 0.7 at most
    assert sources["sure"] == (0.5, "agreement, capped by side bias")
    assert sources["coin"] == (pytest.approx(0.5 + 0.25 / 15), "agreement")  # 50 of 100 left: no bias, no cap
    assert voter_accuracies(fit, {}, None, {"ds": (70, 100)}) == {"ds": 0.8}  # s = 0.4: at most 0.8, not above
    assert voter_accuracies(fit, {}, None, {"ds": (55, 100)}) == {"ds": 0.8}  # p = 0.37: no bias established


def test_the_round_weighs_an_always_left_voters_votes_nothing_from_their_20th_vote(tmp_path):
    from annotate.store import Store
    from loop.config_files import load_config
    from loop.round_plan import plan_round

    store = Store(tmp_path / "l.db")
    store.add_prompts([f"Question {i}?" for i in range(22)], source="test")
    base = store.ensure_base_policy("base")
    for prompt in range(1, 23):
        gen_a, gen_b = (store.add_generation(prompt, base.id, f"{side}{prompt}", 2, "eos") for side in "ab")
        pair = store.add_pair(prompt, gen_a, gen_b, kind="sample")
        if prompt <= 20:  # the left answer every time, gen_a shown left on odd prompts
            store.record_vote(pair, "left", "a" if prompt % 2 else "b", a_on_left=bool(prompt % 2))
        else:
            store.record_vote(pair, "careful", "a", a_on_left=prompt % 2 == 0)
    config = load_config(None, ["round.min_new_pairs=1", f"round.checkpoints_dir={tmp_path / 'c'}",
                                "votes.weighting=reliability", "promotion.rule=always"])
    plan = plan_round(store, "base", config, log=lambda message: None)
    weights = {p.pair_id: p.weight for p in plan.preferences}
    # left: 20 of 20 left picks, accuracy 1/2, weight 0; careful: UNKNOWN_ACCURACY, 2 x 0.75 - 1 = 0.5 each,
    # scaled so that the 22 weights have mean 1: 11 each
    assert [weights[pair] for pair in range(1, 21)] == [0.0] * 20
    assert [weights[21], weights[22]] == pytest.approx([11.0, 11.0])
    store.close()


def test_the_people_table_shows_each_voters_accuracy_for_weighting_and_its_source():
    cast = [Vote(i, i, name, "a", True, 5.0, "") for i, name in enumerate(["gold"] * 3 + ["sure", "coin", "new"])]
    agreement = {"sure": (70, 100), "coin": (50, 100)}  # e 0.2 and 0: mean 0.1, tau^2 0.02 - 0.0025, factor 0.875
    persons = people(cast, AgreementReport(0, 0, None, None), {"gold": (9, 10)}, agreement)
    rows = {row[0]: row for row in people_rows(persons)}
    column = PEOPLE_COLUMNS.index("accuracy for weighting (from)")
    assert rows["gold"][column] == "83% (gold)"  # (9 + 1) / (10 + 2)
    assert rows["sure"][column] == "75% (agreement)"
    assert rows["coin"][column] == f"{0.5 + 0.25 * 0.0125 / 0.1875:.0%} (agreement)"
    assert rows["new"][column] == "75% (nothing known yet)"


def test_the_people_tables_accuracy_for_weighting_leaves_the_excluded_out_as_a_round_does():
    # a and x on 12 pairs, x always against a: with x, Dawid-Skene starts from tied pairs (T = 1/2) and stays there,
    # a's accuracy (6 + 1) / (12 + 2) = 1/2 over 12 shared votes; without x, a's pairs have one vote each: nothing
    cast = [Vote(2 * pair + k, pair, name, "a" if name == "a" else "b", pair % 2 == 0, 5.0, "")
            for pair in range(12) for k, name in enumerate(("a", "x"))]
    column = PEOPLE_COLUMNS.index("accuracy for weighting (from)")
    everyone = {row[0]: row for row in people_rows(people(cast, AgreementReport(0, 0, None, None)))}
    assert everyone["a"][column] == "50% (Dawid-Skene)"
    rows = {row[0]: row for row in people_rows(people(cast, AgreementReport(0, 0, None, None), {"x": (0, 10)}, {},
                                                      frozenset({"x"})))}
    assert rows["a"][column] == "75% (nothing known yet)"  # as a round reads a's votes once x is excluded
    assert rows["x"][column] == "excluded: not trained on"
    assert rows["x"][PEOPLE_COLUMNS.index("Dawid-Skene accuracy (95%, n)")].startswith("50% (")  # still shown
    assert rows["x"][PEOPLE_COLUMNS.index("gold accuracy (95%, n)")].startswith("0% (")


def test_the_pair_weights_reach_the_heads_loss_multiplied_into_the_graded_weights(monkeypatch):
    seen = {}
    real_fit, real_boot = bt_head.fit_head, bt_head.fit_bootstrap_heads

    def fit_head(diffs, **kwargs):
        seen["fit"] = kwargs["weights"].clone()
        return real_fit(diffs, **kwargs)

    def bootstrap(diffs, lam, n_heads, **kwargs):
        seen["boot"] = kwargs["weights"].clone()
        return real_boot(diffs, lam, n_heads, **kwargs)

    monkeypatch.setattr(bt_head, "fit_head", fit_head)
    monkeypatch.setattr(bt_head, "fit_bootstrap_heads", bootstrap)
    torch.manual_seed(0)
    chosen, rejected = torch.randn(12, 3, dtype=torch.float64) + 0.5, torch.randn(12, 3, dtype=torch.float64)
    config = StrategyConfig(votes=VotesConfig(graded="weight", much_weight=2.0, n_heads=2, cv_folds=2))
    strengths = torch.tensor([1.0, 2.0] * 6, dtype=torch.float64)  # graded weights 1 and 2
    pair_weight = torch.tensor([0.0, 0.5, 1.5] * 4, dtype=torch.float64)
    strategies.fit_feature_heads(chosen, rejected, "head", config, strengths, pair_weight)
    expected = torch.tensor([1.0, 2.0] * 6, dtype=torch.float64) * pair_weight
    assert torch.equal(seen["fit"], expected) and torch.equal(seen["boot"], expected)


def test_lpft_multiplies_each_pairs_weight_into_its_loss(monkeypatch):
    seen = {}

    def finetune(model, tokenizer, pairs, margins, weights, settings, on_epoch=None):
        seen["weights"] = weights.clone()
        return model

    monkeypatch.setattr(strategies, "finetune_top_layers", finetune)
    monkeypatch.setattr(strategies.TrainedPreferenceModel, "as_reward_model", lambda self: "probe")
    pairs = [Preference(i, "p", "c", "r", 1, "sample", strength=1.0, weight=w) for i, w in enumerate((0.25, 2.0))]
    config = StrategyConfig(votes=VotesConfig(graded="off"))
    extractor = type("Extractor", (), {"tokenizer": None})()  # finetune_top_layers, stubbed, takes its tokenizer
    strategies.finetune_under_head(extractor, "mean@2", torch.zeros(3), pairs, torch.ones(2), config)
    assert seen["weights"].tolist() == [0.25, 2.0]


def test_the_round_trains_on_the_weighted_preferences_and_records_its_weighting(tmp_path):
    from loop.config_files import load_config
    from loop.round_plan import plan_round
    from tests.test_exclusion import two_annotator_store

    store, pairs = two_annotator_store(tmp_path / "w.db")
    for pair in pairs[1:]:  # a third voter sides with careful on pairs 2-4, so they have majorities
        store.record_vote(pair, "other", "a", a_on_left=True)
    config = load_config(None, ["round.min_new_pairs=1", f"round.checkpoints_dir={tmp_path / 'c'}",
                                "votes.weighting=reliability", "promotion.rule=always"])
    plan = plan_round(store, "base", config, log=lambda message: None)
    assert store.round(plan.round_id).metrics["round/weighting"] == "reliability"
    # nobody has 10 shared votes yet: every voter takes UNKNOWN_ACCURACY, and pair 1 (a 1, b 2) and pairs 2-4
    # (a 2, b 1) are all one net vote: equal weights, 1 after scaling
    assert [p.weight for p in plan.preferences] == pytest.approx([1.0] * 4)
    assert math.isclose(sum(p.weight for p in plan.preferences), len(plan.preferences))
    with pytest.raises(ValueError, match="votes.weighting must be one of majority, reliability"):
        VotesConfig(weighting="loudest")
    store.close()


def test_the_round_weighs_single_votes_by_the_last_rounds_agreement_with_a_held_out_head(tmp_path):
    from annotate.metrics import PEOPLE_MODEL_AGREEMENT
    from annotate.store import Store
    from loop.config_files import load_config
    from loop.round_plan import plan_round

    store = Store(tmp_path / "a.db")
    store.add_prompts([f"Question {i}?" for i in range(3)], source="test")
    base = store.ensure_base_policy("base")
    for prompt, name in zip(range(1, 4), ("careful", "careful", "coin")):
        gen_a, gen_b = (store.add_generation(prompt, base.id, f"{side}{prompt}", 2, "eos") for side in "ab")
        store.add_annotator(name)
        store.record_vote(store.add_pair(prompt, gen_a, gen_b, kind="sample"), name, "a", a_on_left=True)
    before = store.start_round()
    store.finish_round(before, {PEOPLE_MODEL_AGREEMENT: {"careful": [70, 100], "coin": [50, 100]}})
    config = load_config(None, ["round.min_new_pairs=1", f"round.checkpoints_dir={tmp_path / 'c'}",
                                "votes.weighting=reliability", "promotion.rule=always"])
    plan = plan_round(store, "base", config, log=lambda message: None)
    # excess 0.2 and 0: mean 0.1, variance 0.02, tau^2 0.0175, factor 0.875: 0.1875 and 0.0125, so p = 0.75 and
    # 0.5 + 0.25 / 15; single-vote weights 2p - 1 = 0.5, 0.5 and 1 / 30, scaled to mean 1
    raw = [0.5, 0.5, 1 / 30]
    assert [p.weight for p in plan.preferences] == pytest.approx([w * 3 / sum(raw) for w in raw])
    store.close()
