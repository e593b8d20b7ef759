"""Simulated teams (annotate.team): the spec, each member's votes and seconds, `--simulate team` and the demo's team."""

import json
import random
import statistics
from collections import Counter
from types import SimpleNamespace

import pytest

from annotate.records import NewGeneration, NewPair
from annotate.store import Store
from annotate.team import TeamSpecError, build_team, parse_team, simulate_team_votes, team_judge

WARM = "Thank you for asking, I am glad to help: water it weekly."
PLAIN = "Water it every week and keep it in the light near a window."


def courtesy_pairs(store: Store, n_pairs: int, seed: int = 0) -> dict[int, bool]:
    """`n_pairs` pairs on four prompts, the courteous answer (WARM) as gen_a or gen_b at random; pair id -> whether
    gen_a is the courteous one."""
    rng = random.Random(seed)
    store.add_prompts([f"How do I keep plant {i} alive?" for i in range(4)], source="test")
    policy = store.add_policy(0, "base")
    warm_first = [rng.random() < 0.5 for _ in range(n_pairs)]
    pairs = [NewPair(1 + index % 4, NewGeneration(policy, WARM if first else PLAIN, 12, "stop"),
                     NewGeneration(policy, PLAIN if first else WARM, 12, "stop"), "sample")
             for index, first in enumerate(warm_first)]
    return dict(zip(store.add_pairs_bulk(pairs), warm_first))


def test_a_team_spec_names_each_member_and_shares_the_votes():
    team = parse_team("courteous*3,random,left")
    assert [(m.name, m.annotator) for m in team] == [
        ("sim:courteous-1", "courteous"), ("sim:courteous-2", "courteous"), ("sim:courteous-3", "courteous"),
        ("sim:random", "random"), ("sim:left", "left")]
    assert [m.share for m in team] == pytest.approx([0.2] * 5)
    assert [m.careful for m in team] == [True, True, True, False, False]
    # a group's share is split over its count; the members without one split what is left
    shares = [(m.name, m.share) for m in parse_team("courteous*3=0.6, random=0.3, left")]
    assert shares == [("sim:courteous-1", pytest.approx(0.2)), ("sim:courteous-2", pytest.approx(0.2)),
                      ("sim:courteous-3", pytest.approx(0.2)), ("sim:random", pytest.approx(0.3)),
                      ("sim:left", pytest.approx(0.1))]
    # numbered in the order written when a kind comes back; colons belong to the rule, the share takes "="
    assert [(m.name, m.share) for m in parse_team("courteous,contains:please=0.5,courteous")] == [
        ("sim:courteous-1", 0.25), ("sim:contains:please", 0.5), ("sim:courteous-2", 0.25)]
    assert team_judge(parse_team("random,longer,courteous")) == "longer"  # the first rule member, whatever it is
    assert team_judge(parse_team("random,hasty")) is None


@pytest.mark.parametrize("spec, complaint", [
    ("", "the team is empty"),
    ("courteous,,left", "cannot read team member ''"),
    ("courtous*3", "unknown team member 'courtous'"),
    ("courteous*0", "a count is at least 1"),
    ("random=x", "cannot read team member 'random=x'"),
    ("random=1.5", "at most 1"),
    ("random=0.0,left", "more than 0"),
    ("random=0.6,left=0.6", "add up to 1.2, more than all the votes"),
    ("random=0.5,left=0.4", "they must add up to 1"),
    ("random=1,left", "leave nothing for the members without one"),
])
def test_a_bad_team_spec_says_what_was_wrong_and_what_is_accepted(spec, complaint):
    with pytest.raises(TeamSpecError) as caught:
        parse_team(spec)
    assert complaint in str(caught.value)
    if "unknown" in complaint or "cannot read" in complaint or "empty" in complaint:
        assert "ANNOTATOR[*COUNT][=SHARE]" in str(caught.value) and "courteous" in str(caught.value)


def test_the_left_picker_takes_the_answer_shown_on_the_left_whichever_generation_it_is():
    store = Store(":memory:")
    courtesy_pairs(store, 20)
    result = simulate_team_votes(store, build_team(parse_team("left")), n_votes=20, seed=4)
    votes = store.votes(annotator="sim:left")
    assert result.votes == 20 and len(votes) == 20
    assert all(vote.choice == ("a" if vote.a_on_left else "b") for vote in votes)
    assert {vote.a_on_left for vote in votes} == {True, False}  # both sides were shown, so both generations won
    assert all(1.0 <= vote.seconds < 10 for vote in votes)  # quick, yet not under a second: that is the hasty one


def test_hasty_votes_in_under_a_second_and_careful_members_read_for_seconds():
    store = Store(":memory:")
    warm = courtesy_pairs(store, 200)
    simulate_team_votes(store, build_team(parse_team("hasty,courteous")), n_votes=200, seed=1)
    hasty = [vote.seconds for vote in store.votes(annotator="sim:hasty")]
    careful = [vote.seconds for vote in store.votes(annotator="sim:courteous")]
    assert len(hasty) > 70 and all(0.3 <= seconds <= 0.9 for seconds in hasty)
    assert len(careful) > 70 and all(2 <= seconds <= 120 for seconds in careful)
    assert 8 < statistics.median(careful) < 18  # lognormal, median 12 s
    assert all(vote.choice == ("a" if warm[vote.pair_id] else "b") for vote in store.votes(annotator="sim:courteous"))


def test_votes_land_under_each_members_name_in_proportion_and_repeat_with_the_seed():
    def cast(seed: int) -> list[tuple]:
        store = Store(":memory:")
        courtesy_pairs(store, 500)
        result = simulate_team_votes(store, build_team(parse_team("courteous*3,random=0.2,left=0.2")), 500, seed=seed)
        assert result.votes == 500 and not result.queue_empty
        return [(vote.pair_id, vote.annotator, vote.choice, vote.a_on_left, vote.seconds) for vote in store.votes()]

    votes = cast(seed=7)
    by_name = Counter(annotator for _pair, annotator, *_rest in votes)
    assert set(by_name) == {"sim:courteous-1", "sim:courteous-2", "sim:courteous-3", "sim:random", "sim:left"}
    assert all(abs(count - 100) <= 30 for count in by_name.values()), by_name  # 100 each, sd 9
    random_choices = Counter(choice for _pair, annotator, choice, *_rest in votes if annotator == "sim:random")
    assert random_choices["tie"] > 0 and min(random_choices["a"], random_choices["b"]) > 25
    assert cast(seed=7) == votes and cast(seed=8) != votes


def test_noise_flips_the_rule_members_only_and_overlap_spreads_a_pair_over_members():
    store = Store(":memory:")
    warm = courtesy_pairs(store, 30)
    result = simulate_team_votes(store, build_team(parse_team("courteous,left,hasty"), noise=1.0, seed=3),
                                 n_votes=90, overlap=3, seed=2)
    assert result.votes == 90 and result.queue_empty is False
    assert all(vote.choice == ("b" if warm[vote.pair_id] else "a") for vote in store.votes(annotator="sim:courteous"))
    assert all(vote.choice == ("a" if vote.a_on_left else "b") for vote in store.votes(annotator="sim:left"))
    by_pair = Counter(vote.pair_id for vote in store.votes())
    assert set(by_pair.values()) == {3}  # every pair voted on once by each of the three
    assert simulate_team_votes(store, build_team(parse_team("courteous,left,hasty")), 5, overlap=3).queue_empty


def test_the_team_setting_is_checked_with_the_spec_error():
    from loop.config import SimulateSettings
    from loop.config_files import ConfigError, load_config

    assert SimulateSettings(team="courteous*3,random,left").team == "courteous*3,random,left"
    with pytest.raises(ValueError, match="unknown team member 'nobody'"):
        SimulateSettings(team="nobody")
    with pytest.raises(ValueError, match="leave annotator_name unset"):
        SimulateSettings(team="courteous,left", annotator_name="ann")
    with pytest.raises(ConfigError, match=r"\[simulate\]: .*a count is at least 1"):
        load_config(None, ['simulate.team=courteous*0'], default_file=None)


def tiny_database(path) -> None:
    """Two prompts, a base policy and four pairs: the courteous answer gen_b on each."""
    with Store(path) as store:
        store.add_prompts(["p1", "p2"], source="t")
        policy = store.add_policy(0, "default")
        store.add_pairs_bulk([NewPair(1 + i % 2, NewGeneration(policy, PLAIN, 12, "stop"),
                                      NewGeneration(policy, WARM, 12, "stop"), "sample") for i in range(4)])


def test_simulate_team_votes_as_each_member_through_the_command(tmp_path, capsys):
    import app

    db = tmp_path / "team.db"
    tiny_database(db)
    assert app.main(["--simulate", "team", "--team", "courteous*2,left", "--votes", "8", "--overlap", "2",
                     "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "The team voted 8 times; 0 pairs still waiting." in out
    assert "sim:courteous-1 (33% of the votes) voted" in out and "sim:left (33% of the votes) voted" in out
    with Store(db) as store:
        votes = store.votes()
    assert len(votes) == 8 and set(Counter(vote.pair_id for vote in votes).values()) == {2}
    assert {vote.choice for vote in votes if vote.annotator.startswith("sim:courteous")} == {"b"}
    assert {vote.annotator for vote in votes} <= {"sim:courteous-1", "sim:courteous-2", "sim:left"}
    assert all(vote.seconds is not None for vote in votes)


@pytest.mark.parametrize("argv, complaint", [
    (["--simulate", "team"], "--simulate team votes as [simulate] team, which is empty"),
    (["--simulate", "courteous", "--team", "left"], "give --simulate team --team SPEC"),
    (["--simulate", "team", "--team", "courteous*0"], "[simulate]: 'courteous*0': a count is at least 1"),
    (["--simulate", "team", "--team", "nope"], "unknown team member 'nope'"),
])
def test_simulate_team_refuses_what_it_cannot_run_in_one_line(tmp_path, capsys, argv, complaint):
    import app

    db = tmp_path / "team.db"
    tiny_database(db)
    assert app.main([*argv, "--db", str(db)]) == 2
    assert complaint in capsys.readouterr().err
    with Store(db) as store:
        assert store.votes() == []


def test_the_demo_loop_casts_its_votes_with_the_team_and_judges_by_its_first_rule_member(tmp_path, capsys,
                                                                                         monkeypatch):
    """No model: the policies' answers, the round and its report are the demo's own, recorded or stubbed."""
    import app
    import loop.policies
    import loop.round
    from annotate.metrics import DEMO_ANNOTATOR, ROUND_ACTOR_POLICY_ID, ROUND_POLICY_ID
    from loop.config import SimulateSettings
    from loop.demo import DemoAnnotator, DemoSeeds, settings_problem
    from loop.config_files import load_config

    def run_round(db_path, base_model, config, log=print, **kwargs):
        with Store(db_path) as store:  # a finished round whose policy is the base: what the demo judges
            policy = store.ensure_base_policy(base_model)
            round_id = store.start_round()
            store.finish_round(round_id, {ROUND_POLICY_ID.name: policy.id, ROUND_ACTOR_POLICY_ID: policy.id})
        return SimpleNamespace(round_id=round_id, policy_id=policy.id, metrics={})

    monkeypatch.setattr(loop.round, "run_round", run_round)
    monkeypatch.setattr(loop.policies, "policy_answers",
                        lambda path, prompts, sampling, per_prompt, *args: [WARM] * (len(prompts) * per_prompt))
    db = tmp_path / "demo.db"
    tiny_database(db)
    assert app.main(["--demo-loop", "--team", "random,courteous*2,left", "--rounds", "1", "--votes", "4",
                     "--eval-prompts", "2", "--db", str(db)]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out.strip().splitlines()[-1])["rounds"][0]["win_rate"] == 0.5  # the same answers
    assert "team random,courteous*2,left judged by courteous" in printed.err
    with Store(db) as store:
        assert len(store.votes()) == 4
        assert {vote.annotator for vote in store.votes()} <= {"sim:random", "sim:courteous-1", "sim:courteous-2",
                                                              "sim:left"}
        assert store.rounds()[0].metrics[DEMO_ANNOTATOR] == "courteous"
    annotator = DemoAnnotator.from_settings(SimulateSettings(team="random,courteous*2,left"), DemoSeeds(0, 0))
    assert (annotator.spec, [member.name for member in annotator.team]) == (
        "courteous", ["sim:random", "sim:courteous-1", "sim:courteous-2", "sim:left"])
    careless = load_config(None, ['simulate.team=random,left'], default_file=None)
    assert "has no rule member to judge the demo's win rate" in settings_problem(careless)
