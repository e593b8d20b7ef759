"""bench/people_threshold.py: people's promotion rules replayed against the judge, counted by hand."""

import json

import pytest

from annotate.promotion import PromotionDecision
from annotate.records import WinRate
from annotate.store import Store
from bench.people_threshold import PeopleDecision, main, read_decisions, rules, score_rule

# (wins, losses, judge's gap in points): 60% better, 48% better, 54% worse, 40% worse, 50 votes each
CASES = [(30, 20, 4.0), (24, 26, 6.0), (27, 23, -3.0), (20, 30, -8.0)]
LEVEL = PeopleDecision("run", 5, WinRate(6, 5, 10, 40), 0.0)  # a level gap: no rule errs on it


def decisions() -> list[PeopleDecision]:
    return [PeopleDecision("run", i + 1, WinRate(i + 2, i + 1, wins, losses), gap)
            for i, (wins, losses, gap) in enumerate(CASES)]


def test_each_rule_is_scored_on_the_judges_sign_worked_out_by_hand():
    named = rules([0.45, 0.5])
    # 50%: promotes 60% and 54%; holds back 48% (better, +6) and 40%; promotes 54% (worse, -3)
    assert score_rule(named["people >= 50%"], decisions()) == {
        "n": 4, "agree": 2, "worse_promoted": 1, "worse_points": -3.0, "better_held": 1, "better_points": 6.0}
    assert score_rule(named["people >= 50%"], decisions() + [LEVEL])["agree"] == 3
    # 45%: promotes all but 40%
    assert score_rule(named["people >= 45%"], decisions()) == {
        "n": 4, "agree": 3, "worse_promoted": 1, "worse_points": -3.0, "better_held": 0, "better_points": 0.0}
    # 40% of 50: Wilson interval 27.6%-53.8%, its top clears 50%, so "not shown worse" promotes all four
    assert score_rule(named["interval's top >= 50% (not shown worse)"], decisions())["worse_points"] == -11.0
    # 60% of 50: Wilson bottom 46.2%, so "shown better" promotes none and holds back both better ones
    assert score_rule(named["interval's bottom >= 50% (shown better)"], decisions()) == {
        "n": 4, "agree": 2, "worse_promoted": 0, "worse_points": 0.0, "better_held": 2, "better_points": 10.0}


def write_run(tmp_path):
    """A demo's log (progress, then its closing JSON line) and a database with policies' promotions: policy 2
    against the first (1), policy 3 against 2, policy 4 decided by the reward model (no people's numbers)."""
    summary = {"first_policy_id": 1, "rounds": [{"policy_id": 2, "win_rate": 0.62}, {"policy_id": 3, "win_rate": 0.55},
                                                {"policy_id": 4, "win_rate": 0.7}]}
    log = tmp_path / "run.log"
    log.write_text("Demo loop: 3 rounds\rround 1 ...\n{\"not\": \"the summary\"}\n" + json.dumps(summary) + "\n")
    people = {"wins": 30, "losses": 29, "ties": 2}
    db = tmp_path / "run.db"
    with Store(db) as store:
        first = store.add_policy(0, "base")
        two = store.add_policy(1, "two", parent_id=first, promoted=False)
        three = store.add_policy(2, "three", parent_id=two, promoted=False)
        four = store.add_policy(3, "four", parent_id=three, promoted=False)
        for policy, numbers in ((two, {**people, "against": first}), (three, {**people, "against": two}),
                                (four, {"rm_accuracy": 0.6})):
            store.set_promotion(policy, True, PromotionDecision(True, "people", "", numbers).to_json())
    return log, db


def test_decisions_come_from_the_demos_json_line_and_the_stored_promotions(tmp_path):
    log, db = write_run(tmp_path)
    found = read_decisions(log, db)
    assert [(d.round, d.versus.opponent_id, d.versus.win_rate) for d in found] == [(1, 1, 31 / 61), (2, 2, 31 / 61)]
    assert [d.judge_gap for d in found] == pytest.approx([12.0, -7.0])  # 62% - 50%, 55% - 62%


def test_the_command_prints_a_json_line_and_refuses_a_log_without_a_summary(tmp_path, capsys):
    log, db = write_run(tmp_path)
    summary = main([str(log), str(db), "--thresholds", "0.5", "--min-gap", "10"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == summary
    assert summary["rules"]["people >= 50%"]["clear"] == {
        "n": 1, "agree": 1, "worse_promoted": 0, "worse_points": 0.0, "better_held": 0, "better_points": 0.0}
    (tmp_path / "bad.log").write_text("crashed before the end\n")
    with pytest.raises(SystemExit, match="no closing JSON line"):
        main([str(tmp_path / "bad.log"), str(db)])
    with pytest.raises(SystemExit, match="no such database"):
        main([str(log), str(tmp_path / "missing.db")])
