"""Promotion by evidence (annotate.promotion): the rule on constructed vote tables worked out by hand, the store's
current policy, and rounds of the tiny model where people's votes on a round's versus pairs hold it back or promote it.
"""

from __future__ import annotations

import sqlite3

import pytest

from annotate.promotion import PromotionDecision, PromotionEvidence, decide, evidence_for, refresh_promotions
from annotate.records import WinRate
from annotate.statistics import wilson_interval
from annotate.store import Store
from loop.config import PromotionConfig
from loop.config_files import load_config
from loop.round import run_round
from tests.test_round import seed_votes, tiny_settings

EVIDENCE = PromotionConfig()  # min_votes 16, min_win_rate 0.5, max_kl 10


def versus(wins: int, losses: int, ties: int = 0) -> WinRate:
    return WinRate(policy_id=2, opponent_id=1, wins=wins, losses=losses, ties=ties)


def test_people_decide_once_min_votes_are_in_with_ties_counting_half():
    # 10 wins, 6 losses, 2 ties: 18 judged, (10 + 1) / 18 = 0.611 >= 0.5
    up = decide(PromotionEvidence(versus(10, 6, 2), rm_accuracy=0.40, rm_low=0.30, rm_n=50, kl=3.0), EVIDENCE)
    assert (up.promoted, up.rule) == (True, "people")  # people's verdict wins over a chance-level reward model
    assert up.numbers["win_rate"] == pytest.approx(11 / 18)
    assert (up.numbers["low"], up.numbers["high"]) == pytest.approx(wilson_interval(11 / 18, 18))
    assert "61% (" in up.reason and "18 judged votes against policy 1, at least 50%" in up.reason
    # 6 wins, 10 losses, 2 ties: 7 / 18 = 0.389 < 0.5, however sure the reward model is
    down = decide(PromotionEvidence(versus(6, 10, 2), rm_accuracy=0.9, rm_low=0.8, rm_n=200, kl=1.0), EVIDENCE)
    assert (down.promoted, down.rule) == (False, "people") and "below 50%" in down.reason
    # 8 wins, 8 losses: exactly 0.5 is not worse: promoted
    assert decide(PromotionEvidence(versus(8, 8)), EVIDENCE).promoted


def test_before_min_votes_the_reward_models_interval_and_the_kl_decide():
    few = versus(9, 3, 3)  # 15 judged < 16: people's 70% does not decide yet
    sure = dict(rm_accuracy=0.64, rm_low=0.55, rm_n=120)
    assert decide(PromotionEvidence(few, kl=4.0, **sure), EVIDENCE).rule == "reward model"
    assert decide(PromotionEvidence(few, kl=4.0, **sure), EVIDENCE).promoted
    assert "15 of 16 votes" in decide(PromotionEvidence(few, kl=4.0, **sure), EVIDENCE).reason
    chance = PromotionEvidence(None, rm_accuracy=0.56, rm_low=0.47, rm_n=60, kl=1.0)
    assert not decide(chance, EVIDENCE).promoted and "cannot be told from chance" in decide(chance, EVIDENCE).reason
    at_half = PromotionEvidence(None, rm_accuracy=0.6, rm_low=0.5, rm_n=60, kl=1.0)  # the interval touches chance
    assert not decide(at_half, EVIDENCE).promoted
    far = PromotionEvidence(None, kl=10.5, **sure)
    too_far = decide(far, EVIDENCE)
    assert not too_far.promoted and "KL 10.5 is above promotion.max_kl = 10" in too_far.reason
    assert decide(PromotionEvidence(None, kl=10.0, **sure), EVIDENCE).promoted  # at most max_kl
    assert decide(far, PromotionConfig(max_kl=0)).promoted  # 0: no limit
    unmeasured = PromotionEvidence(None, kl=1.0)
    assert not decide(unmeasured, EVIDENCE).promoted and "not measured" in decide(unmeasured, EVIDENCE).reason


def test_the_kl_budget_holds_back_what_people_or_the_reward_model_would_promote():
    # people: 12 wins, 4 losses, 2 ties: 13 / 18 = 0.722 >= 0.5, but KL 10.6 > max_kl 10
    liked = PromotionEvidence(versus(12, 4, 2), rm_accuracy=0.75, rm_low=0.62, rm_n=57, kl=10.6)
    held = decide(liked, EVIDENCE)
    assert (held.promoted, held.rule) == (False, "KL budget")
    assert held.reason.startswith("PPO's KL 10.6 is above promotion.max_kl = 10; without it: promoted by people, "
                                  "people's votes: 72% (")
    assert (held.numbers["win_rate"], held.numbers["kl"], held.numbers["max_kl"]) == pytest.approx((13 / 18, 10.6, 10))
    assert decide(PromotionEvidence(versus(12, 4, 2), kl=10.0), EVIDENCE).promoted  # at most max_kl
    assert decide(liked, PromotionConfig(max_kl=0)).promoted  # 0: no budget
    assert decide(liked, PromotionConfig(max_kl=11)).promoted
    # before min_votes a sure reward model is held back the same way; a policy people voted down says so
    far = decide(PromotionEvidence(None, rm_accuracy=0.64, rm_low=0.55, rm_n=120, kl=10.5), EVIDENCE)
    assert (far.promoted, far.rule) == (False, "KL budget") and "without it: promoted by reward model" in far.reason
    disliked = decide(PromotionEvidence(versus(4, 12), kl=12.0), EVIDENCE)
    assert "without it: not promoted by people" in disliked.reason and "25% (" in disliked.reason
    assert decide(PromotionEvidence(versus(12, 4)), EVIDENCE).promoted  # no KL recorded (no PPO): no budget to apply
    assert decide(liked, EVIDENCE, override="promote").promoted  # an admin can spend more


def test_an_admins_override_and_the_always_rule_win_over_the_evidence():
    worse = PromotionEvidence(versus(2, 20), rm_accuracy=0.5, rm_low=0.4, rm_n=10, kl=50.0)
    assert decide(worse, EVIDENCE, override="promote") == PromotionDecision(True, "admin",
                                                                             "an admin chose to promote it", {})
    better = PromotionEvidence(versus(20, 2))
    assert (decide(better, EVIDENCE, override="reject").promoted, decide(better, EVIDENCE, "reject").rule) == \
        (False, "admin")
    assert decide(worse, PromotionConfig(rule="always")).promoted
    with pytest.raises(ValueError, match="promotion.rule is one of evidence, always"):
        PromotionConfig(rule="sometimes")


def test_the_decision_survives_its_json():
    decision = decide(PromotionEvidence(versus(10, 6, 2)), EVIDENCE)
    assert PromotionDecision.from_json(decision.to_json()) == decision
    assert PromotionDecision.from_json(None) is None


def vote_on_versus_pairs(store: Store, choice: str, annotator: str = "judge") -> int:
    """Vote `choice` ("a": the newer policy, "b": the earlier) on every versus pair; the votes cast."""
    store.add_annotator(annotator)
    pairs = store._rows("SELECT id FROM pairs WHERE kind = 'versus'")
    return sum(store.record_vote(row["id"], annotator, choice, a_on_left=True) for row in pairs)


def test_weighted_win_rates_worked_out_by_hand():
    from annotate.records import VersusVote
    from annotate.reliability import weighted_win_rates

    cast = [VersusVote(3, 2, name, choice) for name, choice in
            [("c", "a"), ("c", "a"), ("c", "b"), ("c", "both_bad")] + [("coin", "b")] * 4
            + [("half", "a"), ("half", "tie")]] + [VersusVote(2, 1, "coin", "a")]
    # weights (2p - 1) / (2 x 0.75 - 1): c unknown 1, coin (p 1/2) 0, half (p 0.625) 0.5; judged W = 3 + 1 = 4,
    # squares 3 + 0.5 = 3.5, n_eff = 16 / 3.5, k = n_eff / W = 4 / 3.5
    three, two = weighted_win_rates(cast, {"coin": 0.5, "half": 0.625})[::-1]
    k = 4 / 3.5
    assert (three.policy_id, three.opponent_id) == (3, 2)
    assert (three.wins, three.losses, three.ties, three.both_bad) == pytest.approx((2.5 * k, k, 0.5 * k, k))
    assert three.judged == pytest.approx(16 / 3.5) and three.win_rate == pytest.approx((2.5 + 0.25) / 4)
    assert three.judged_text() == "4.6 judged votes (effective, each weighed by its voter's reliability)"
    assert (two.judged, two.win_rate) == (0, None)  # a coin's votes alone: nothing judged
    equal = weighted_win_rates([VersusVote(2, 1, name, c) for name, c in [("x", "a"), ("y", "b"), ("x", "tie")]], {})
    assert equal == [WinRate(2, 1, 1, 1, 1, 0)]  # nothing known of anyone: the plain tallies
    assert equal[0].judged_text() == "3 judged votes"


def test_with_reliability_weighting_an_always_left_voters_versus_votes_do_not_hold_a_policy_back(tmp_path):
    from annotate.promotion import decide_for, store_win_rates
    from annotate.ui_dashboard import DashboardHandlers
    from annotate.ui_session import AppConfig

    with Store(tmp_path / "v.db") as store:
        store.add_prompts([f"Question {i}?" for i in range(40)], source="test")
        base = store.ensure_base_policy("base")
        one = store.add_policy(1, "one", parent_id=base.id, promoted=False)
        for name in ("careful", "left"):
            store.add_annotator(name)
        for prompt in range(1, 41):
            newer, older = (store.add_generation(prompt, policy, f"{policy}-{prompt}", 2, "eos")
                            for policy in (one, base.id))
            pair = store.add_pair(prompt, newer, older, kind="versus")
            if prompt <= 20:  # careful: the newer policy on 14 of 20
                store.record_vote(pair, "careful", "a" if prompt <= 14 else "b", a_on_left=prompt % 2 == 0)
            else:  # left: the left answer every time, the older policy's on 15 of 20
                store.record_vote(pair, "left", "b" if prompt <= 35 else "a", a_on_left=prompt > 35)
        policy = store.policy(one)
        majority = decide_for(store, policy, EVIDENCE)
        assert (majority.promoted, majority.numbers["wins"], majority.numbers["losses"]) == (False, 19, 21)
        assert store.current_policy().id == base.id
        # reliability: 20 left picks of 20 make the left voter a coin (weight 0); the careful one's 14 of 20 decide,
        # on the Dashboard's refresh as in a round
        DashboardHandlers(store, AppConfig(promotion=EVIDENCE, weighting="reliability")).refresh(with_report=False)
        assert store.current_policy().id == one
        weighted = decide_for(store, store.policy(one), EVIDENCE, weighting="reliability")
        assert weighted.promoted and weighted.rule == "people"
        assert (weighted.numbers["win_rate"], weighted.numbers["judged"]) == (pytest.approx(0.7), pytest.approx(20))
        assert "70% (48%-85%) over 20 judged votes against policy 1" in weighted.reason
        assert store_win_rates(store) == store.versus_win_rates()


def test_the_current_policy_is_the_newest_promoted_and_rows_from_before_promotion_count_as_promoted(tmp_path):
    db = tmp_path / "p.db"
    with Store(db) as store:
        base = store.ensure_base_policy("base")
        one = store.add_policy(1, "one", parent_id=base.id, promoted=False)
        assert store.current_policy().id == base.id and store.latest_policy().id == one
        store.set_promotion(one, True, "{}")
        assert store.current_policy().id == one
        two = store.add_policy(2, "two", parent_id=one, promoted=False)
        store.set_promotion_override(two, "promote")
        with pytest.raises(KeyError):
            store.set_promotion(999, True, "{}")
        with pytest.raises(ValueError):
            store.set_promotion_override(two, "maybe")
        changed = {policy.id: decision for policy, decision in refresh_promotions(store, EVIDENCE)}
        # one was set promoted by hand with no evidence behind it: decided again, unmeasured, held back; two promoted
        assert (changed[one].promoted, changed[one].rule, changed[two].promoted, changed[two].rule) == \
            (False, "reward model", True, "admin")
        assert store.current_policy().id == two
    with sqlite3.connect(db) as conn:  # a row written before promotion existed: NULL, current as it was
        conn.execute("UPDATE policies SET promoted = NULL, promotion_override = NULL WHERE id = ?", (two,))
    with Store(db) as store:
        assert store.current_policy().id == two
        assert all(policy.id != two for policy, _ in refresh_promotions(store, EVIDENCE))  # never decided again


def rounds_where_people_vote(tmp_path, tiny_model_dir, choice: str):
    """Round 1 of the tiny model (its next pairs all versus pairs), people's `choice` on every versus pair, round 2."""
    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    settings = [s for s in tiny_settings(tmp_path) if not s.startswith("promotion.rule")]
    config = load_config(None, settings + ["round.min_new_pairs=2", "round.versus_share=1.0",
                                           "promotion.min_votes=3"])
    first = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    store = Store(db)
    cast = vote_on_versus_pairs(store, choice)
    votes_before = len(store.votes())
    second = run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    return store, first, second, cast, votes_before


def test_a_policy_people_prefer_less_is_kept_a_candidate_and_the_next_round_starts_from_the_one_before(
        tmp_path, tiny_model_dir):
    store, first, second, cast, votes_before = rounds_where_people_vote(tmp_path, tiny_model_dir, "b")
    base = store.first_policy()
    held_back = store.policy(first.policy_id)
    assert cast >= 3 and evidence_for(held_back, store.rounds(), store.versus_win_rates()).versus.losses == cast
    decision = PromotionDecision.from_json(held_back.promotion)
    assert (held_back.promoted, decision.rule, decision.numbers["win_rate"]) == (0, "people", 0.0)
    recorded = store.round(second.round_id).metrics
    assert recorded["round/actor_policy_id"] == base.id  # round 2 started from the base, not from round 1
    assert store.policy(second.policy_id).parent_id == base.id
    assert "policy 2 (round 1) stays a candidate: people's votes: 0%" in recorded["round/started_from"]
    assert len(store.votes()) == votes_before  # no vote lost; round 1's policy stays a row with its answers
    assert (tmp_path / "checkpoints").exists() and held_back.path and not held_back.pruned
    versus_of_two = [w for w in store.versus_win_rates() if w.policy_id == second.policy_id]
    assert versus_of_two == [] or versus_of_two[0].opponent_id == base.id  # its versus pairs set it against the base
    store.close()


def test_a_policy_people_prefer_is_promoted_and_the_next_round_starts_from_it(tmp_path, tiny_model_dir):
    store, first, second, cast, _ = rounds_where_people_vote(tmp_path, tiny_model_dir, "a")
    promoted = store.policy(first.policy_id)
    assert promoted.promoted == 1 and PromotionDecision.from_json(promoted.promotion).rule == "people"
    assert store.round(second.round_id).metrics["round/actor_policy_id"] == first.policy_id
    assert store.policy(second.policy_id).parent_id == first.policy_id
    store.close()


def test_the_terminal_lists_the_policies_and_an_admin_overrides_one(tmp_path, capsys):
    import app

    db = tmp_path / "p.db"
    with Store(db) as store:
        base = store.ensure_base_policy("base")
        one = store.add_policy(1, "one", parent_id=base.id, promoted=False)
    assert app.main(["--db", str(db), "--promotion", str(one), "promote"]) == 0
    assert f"Policy {one}: promoted (admin: an admin chose to promote it). The current policy is {one} (round 1)." \
        in capsys.readouterr().out
    assert app.main(["--db", str(db), "--policies"]) == 0
    listing = capsys.readouterr().out
    assert f"* policy {one}, round 1, from {base.id}: promoted (override: promote); admin:" in listing
    assert f"  policy {base.id}, round 0, from -: base" in listing
    assert app.main(["--db", str(db), "--promotion", str(one), "auto"]) == 0  # the evidence again: none, held back
    assert f"Policy {one}: a candidate (reward model: 0 of 16 votes" in capsys.readouterr().out
    for bad in ([str(base.id), "reject"], ["99", "reject"], [str(one), "maybe"]):
        assert app.main(["--db", str(db), "--promotion", *bad]) == 2
    assert "python app.py --policies lists" in capsys.readouterr().err


def test_the_dashboard_says_whether_the_newest_policy_is_promoted_taking_the_decision_on_the_votes_in(tmp_path):
    from annotate import dashboard_panels as panels
    from annotate.ui_dashboard import DashboardHandlers
    from annotate.ui_session import AppConfig

    with Store(tmp_path / "p.db") as store:
        assert panels.promotion_line(store.policies()) == ""
        base = store.ensure_base_policy("base")
        one = store.add_policy(1, "one", parent_id=base.id, promoted=False)
        store.set_promotion_override(one, "promote")  # recorded, not yet decided: the refresh takes the decision
        assert "stays the current one" in panels.promotion_line(store.policies())
        DashboardHandlers(store, AppConfig(promotion=EVIDENCE)).refresh(with_report=False)
        line = panels.promotion_line(store.policies())
        assert line.startswith(f"- Policy {one} (round 1) is **promoted: the current policy") and "(admin: " in line


def test_the_rounds_summary_says_whether_its_policy_was_promoted_and_why():
    from dataclasses import asdict

    from commands.round import summary_table

    held_back = decide(PromotionEvidence(None, rm_accuracy=0.56, rm_low=0.47, rm_n=60, kl=1.0), EVIDENCE)
    table = summary_table({"round/promotion": asdict(held_back), "ppo/kl": 1.0})
    assert "a candidate, not promoted (reward model: 0 of 16 votes on its versus pairs so far; the reward model's " \
           "held-out accuracy 56% (47% or more, n=60) cannot be told from chance)" in table
    assert "promoted: the current policy (always:" in summary_table(
        {"round/promotion": asdict(decide(PromotionEvidence(), PromotionConfig(rule="always")))})


def test_a_round_whose_reward_model_will_have_no_heads_is_refused_before_it_trains_when_ppo_needs_them(
        tmp_path, tiny_model_dir):
    from loop.checks import RoundRefused

    db = tmp_path / "loop.db"
    seed_votes(db, tiny_model_dir)
    config = load_config(None, tiny_settings(tmp_path) + ["votes.strategy=full", "ppo.reward_spread_penalty=0.5"])
    with pytest.raises(RoundRefused, match="ppo.reward_spread_penalty = 0.5 needs the reward model's bootstrap heads, "
                                           "and there are none: this round trains a 'full' reward model"):
        run_round(db, str(tiny_model_dir), config, log=lambda message: None)
    with Store(db) as store:
        assert store.rounds() == []  # refused before its row: nothing trained, nothing to resume
