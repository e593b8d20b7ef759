"""Store features on in-memory databases, compared with literal rows."""

import random
import sqlite3

import pytest

from annotate.records import NewGeneration, ImportResult, NewPair, Preference, Showing, Vote
from annotate.store import Store


@pytest.fixture
def store():
    with Store(":memory:") as s:
        yield s


@pytest.fixture
def paired(store):
    """Two prompts, a base policy and three pairs (ids 1, 2, 3): answers 'A1'/'B1', 'A2'/'B2', 'A3'/'B3'."""
    store.add_prompts(["Say hi.", "Name a colour."], source="test")
    policy = store.add_policy(0, "base")
    for number, prompt_id in ((1, 1), (2, 2), (3, 1)):
        store.add_pairs_bulk([NewPair(prompt_id, NewGeneration(policy, f"A{number}", 2, "eos"), NewGeneration(policy, f"B{number}", 2, "eos"))])
    return store


def test_add_prompts_strips_and_deduplicates_with_counts(store):
    assert store.add_prompts(["  Hello  ", "Hello", "World", "World\n"], source="typed") == ImportResult(added=2, skipped=2)
    assert store.add_prompts(["Hello", "New"]) == ImportResult(added=1, skipped=1)
    assert [(p.id, p.text, p.source) for p in store.prompts()] == [(1, "Hello", "typed"), (2, "World", "typed"), (3, "New", "")]
    assert store.count_prompts() == 3
    assert store.prompt(2).text == "World"


def test_add_prompts_rejects_empty_and_writes_nothing(store):
    with pytest.raises(ValueError, match="prompt 2 of 3 is empty"):
        store.add_prompts(["fine", "   ", "also fine"])
    assert store.count_prompts() == 0


def test_unknown_prompt_is_a_key_error(store):
    with pytest.raises(KeyError):
        store.prompt(7)


def test_policies_latest_and_first(store):
    assert store.latest_policy() is None and store.first_policy() is None
    base = store.add_policy(0, "default")
    sft = store.add_policy(0, "data/checkpoints/sft", parent_id=base)
    one = store.add_policy(1, "data/checkpoints/round-1", parent_id=sft)
    assert [(p.id, p.round, p.path, p.parent_id) for p in store.policies()] == [
        (1, 0, "default", None), (2, 0, "data/checkpoints/sft", 1), (3, 1, "data/checkpoints/round-1", 2),
    ]
    assert store.latest_policy().id == one
    assert store.first_policy().id == sft  # the SFT model recorded after the base model is the reference


def test_generation_and_pair_rows(store):
    store.add_prompts(["Say hi."])
    policy = store.add_policy(0, "base")
    gen_a = store.add_generation(1, policy, "Hi!", 3, "eos")
    gen_b = store.add_generation(1, policy, "Hello there, friend and", 6, "length")
    pair_id = store.add_pair(1, gen_a, gen_b, kind="sample")
    generation = store.generation(gen_b)
    assert (generation.prompt_id, generation.policy_id, generation.text, generation.n_tokens, generation.finish_reason) == (
        1, 1, "Hello there, friend and", 6, "length")
    pair = store.pair(pair_id)
    assert (pair.id, pair.prompt_id, pair.gen_a, pair.gen_b, pair.kind) == (1, 1, 1, 2, "sample")


def test_add_pair_validates_kind_and_generations(store):
    store.add_prompts(["Say hi.", "Other"])
    policy = store.add_policy(0, "base")
    gen_a = store.add_generation(1, policy, "Hi!", 3, "eos")
    gen_b = store.add_generation(1, policy, "Hey", 2, "eos")
    gen_other = store.add_generation(2, policy, "Other answer", 2, "eos")
    with pytest.raises(ValueError, match="kind must be one of sample, versus"):
        store.add_pair(1, gen_a, gen_b, kind="random")
    with pytest.raises(ValueError, match="answer prompt 1"):
        store.add_pair(1, gen_a, gen_other)
    with pytest.raises(ValueError, match="two different generations"):
        store.add_pair(1, gen_a, gen_a)
    assert store.count_pairs() == 0


def test_a_pair_records_how_its_answers_were_chosen_and_a_preference_its_source(store):
    store.add_prompts(["q1", "q2", "q3", "q4"])
    old, new = store.add_policy(0, "base"), store.add_policy(1, "round-1")

    def answers(prompt_id, a_policy=new):
        return NewGeneration(a_policy, f"a{prompt_id}", 1, "eos"), NewGeneration(new, f"b{prompt_id}", 1, "eos")

    ids = store.add_pairs_bulk([
        NewPair(1, *answers(1), chosen_by="random"), NewPair(2, *answers(2), chosen_by="uncertain"),
        NewPair(3, *answers(3)),  # not recorded (a pair stored before the column existed): read as random
        NewPair(4, *answers(4, old), kind="versus"),
    ])
    assert [(store.pair(i).kind, store.pair(i).chosen_by) for i in ids] == [
        ("sample", "random"), ("sample", "uncertain"), ("sample", None), ("versus", None)]
    for pair_id in ids:
        store.record_vote(pair_id, "ann", "b", True)
    assert [(p.prompt, p.chosen, p.kind, p.source) for p in store.preferences()] == [
        ("q1", "b1", "sample", "sample"), ("q2", "b2", "sample", "chosen"), ("q3", "b3", "sample", "sample"),
        ("q4", "b4", "versus", "versus")]
    gen_a, gen_b = store.add_generation(1, new, "x", 1, "eos"), store.add_generation(1, new, "y", 1, "eos")
    with pytest.raises(ValueError, match="chosen_by is one of random, uncertain for a sample pair"):
        store.add_pair(1, gen_a, gen_b, chosen_by="hard")
    with pytest.raises(ValueError, match="not 'random' for a versus pair"):
        store.add_pair(1, gen_a, gen_b, kind="versus", chosen_by="random")


def test_add_pairs_bulk_is_all_or_nothing(store):
    store.add_prompts(["Say hi."])
    policy = store.add_policy(0, "base")
    good = NewPair(1, NewGeneration(policy, "x", 1, "eos"), NewGeneration(policy, "y", 1, "eos"))
    bad = NewPair(1, NewGeneration(policy, "x", 1, "eos"), NewGeneration(policy, "y", 1, "eos"), kind="nope")
    with pytest.raises(ValueError):
        store.add_pairs_bulk([good, bad])
    assert store.stats()["generations"] == 0 and store.count_pairs() == 0
    assert store.add_pairs_bulk([good, good]) == [1, 2]


def test_next_pair_oldest_first_and_sides_drawn_per_showing(paired):
    showing = paired.next_pair("ann", rng=random.Random(0))
    assert showing == Showing(pair_id=1, prompt_id=1, prompt="Say hi.", text_a="A1", text_b="B1",
                              a_on_left=random.Random(0).random() < 0.5, kind="sample")
    sides = {paired.next_pair("ann", rng=random.Random(seed)).a_on_left for seed in range(20)}
    assert sides == {True, False}


def test_showing_translates_screen_sides_into_stored_choices():
    left_a = Showing(1, 1, "p", "A", "B", a_on_left=True, kind="sample")
    left_b = Showing(1, 1, "p", "A", "B", a_on_left=False, kind="sample")
    assert (left_a.left, left_a.right, left_b.left, left_b.right) == ("A", "B", "B", "A")
    assert [left_a.stored_choice(c) for c in ("left", "right", "tie")] == ["a", "b", "tie"]
    assert [left_b.stored_choice(c) for c in ("left", "right", "both_bad")] == ["b", "a", "both_bad"]
    with pytest.raises(ValueError):
        left_a.stored_choice("a")


def test_next_pair_never_shows_a_pair_twice_to_the_same_annotator_even_after_skip(paired):
    assert paired.record_vote(1, "ann", "skip", a_on_left=True)
    assert paired.next_pair("ann", overlap=3).pair_id == 2
    assert paired.record_vote(2, "ann", "a", a_on_left=False)
    assert paired.record_vote(3, "ann", "b", a_on_left=True)
    assert paired.next_pair("ann", overlap=3) is None
    assert paired.next_pair("bob", overlap=3).pair_id == 1


def test_next_pair_done_after_overlap_votes(paired):
    paired.record_vote(1, "ann", "a", True)
    assert paired.next_pair("bob", overlap=1).pair_id == 2  # pair 1 has its one vote
    assert paired.next_pair("bob", overlap=2).pair_id == 1  # with overlap 2 it wants a second
    paired.record_vote(1, "bob", "a", True)
    assert paired.next_pair("cid", overlap=2).pair_id == 2


def test_next_pair_spreads_concurrent_annotators_with_reservations(paired):
    assert paired.next_pair("ann").pair_id == 1
    assert paired.next_pair("bob").pair_id == 2  # pair 1 is reserved for ann
    assert paired.next_pair("ann").pair_id == 1  # a reload gives ann her pair again
    assert paired.next_pair("cid").pair_id == 3
    assert paired.next_pair("dan").pair_id == 1  # everything reserved: share the oldest rather than leave dan idle
    paired.record_vote(1, "ann", "a", True)
    assert paired.next_pair("eve").pair_id == 2  # still reserved for bob... but shared as nothing else is open


def test_reservations_expire(paired):
    paired.reserve_seconds = 0.0
    assert paired.next_pair("ann").pair_id == 1
    assert paired.next_pair("bob").pair_id == 1


def test_next_pair_on_an_empty_queue_is_none(store):
    assert store.next_pair("ann") is None
    assert store.pairs_waiting() == 0


def test_record_vote_rows_and_idempotent_double_submit(paired):
    assert paired.record_vote(2, "ann", "b", a_on_left=False, seconds=4.5) is True
    assert paired.record_vote(2, "ann", "a", a_on_left=True, seconds=1.0) is False  # the first vote stands
    [vote] = paired.votes()
    assert vote == Vote(id=1, pair_id=2, annotator="ann", choice="b", a_on_left=False, seconds=4.5, created_at=vote.created_at)
    assert paired.votes_by("ann") == 1
    assert [(a.name, a.role, a.votes) for a in paired.annotators()] == [("ann", "annotator", 1)]


def test_record_vote_rejects_bad_choice_unknown_pair_and_empty_name(paired):
    with pytest.raises(ValueError, match="choice must be one of a, b, tie, both_bad, skip, not 'left'"):
        paired.record_vote(1, "ann", "left", True)
    with pytest.raises(ValueError, match="no pair with id 99"):
        paired.record_vote(99, "ann", "a", True)
    with pytest.raises(ValueError, match="annotator name"):
        paired.record_vote(1, "  ", "a", True)
    assert paired.votes() == []


def test_the_schema_refuses_a_second_vote_row_for_the_same_pair_and_annotator(paired):
    paired.record_vote(1, "ann", "a", True)
    with pytest.raises(sqlite3.IntegrityError):
        with paired._write() as db:
            db.conn.execute("INSERT INTO votes (pair_id, annotator, choice, a_on_left, created_at) VALUES (1, 'ann', 'b', 1, 'x')")


def test_pairs_waiting_overall_and_per_annotator(paired):
    paired.record_vote(1, "ann", "a", True)
    assert paired.pairs_waiting() == 2
    assert paired.pairs_waiting(overlap=2) == 3
    assert paired.pairs_waiting("ann", overlap=2) == 2
    assert paired.pairs_waiting("bob", overlap=2) == 3


def test_preferences_take_the_strict_majority_of_a_b_votes(paired):
    for name, choice in (("ann", "a"), ("bob", "a"), ("cid", "b"), ("dan", "tie")):
        paired.record_vote(1, name, choice, True)  # 2 a against 1 b: a wins
    for name, choice in (("ann", "b"), ("bob", "a")):
        paired.record_vote(2, name, choice, True)  # 1 against 1: no majority
    for name, choice in (("ann", "b"), ("bob", "both_bad"), ("cid", "skip")):
        paired.record_vote(3, name, choice, True)  # one b vote: b wins
    assert paired.preferences() == [
        Preference(pair_id=1, prompt="Say hi.", chosen="A1", rejected="B1", votes=3, kind="sample"),
        Preference(pair_id=3, prompt="Say hi.", chosen="B3", rejected="A3", votes=1, kind="sample"),
    ]


def test_graded_votes_store_their_strength_and_a_preference_the_mean_of_its_majority(paired):
    assert paired.record_vote(1, "ann", "a", True, strength=2)
    assert not paired.record_vote(1, "ann", "a", True, strength=1)  # a repeat writes nothing: the first stands
    paired.record_vote(1, "bob", "a", False, strength=1)
    paired.record_vote(1, "cid", "b", True, strength=2)  # the minority's strength does not count
    paired.record_vote(3, "ann", "b", True)  # ungraded: read as slightly better
    paired.record_vote(2, "ann", "tie", True)
    assert [(v.pair_id, v.annotator, v.choice, v.strength) for v in paired.votes()] == [
        (1, "ann", "a", 2), (1, "bob", "a", 1), (1, "cid", "b", 2), (3, "ann", "b", None), (2, "ann", "tie", None)]
    assert [(p.pair_id, p.chosen, p.votes, p.strength) for p in paired.preferences()] == [
        (1, "A1", 3, 1.5), (3, "B3", 1, 1.0)]  # pair 1: (2 + 1) / 2 from ann and bob
    for choice, strength in (("tie", 1), ("a", 3), ("skip", 2)):
        with pytest.raises(ValueError, match="strength is 1"):
            paired.record_vote(2, "dan", choice, True, strength=strength)


def test_export_dataset_jsonl_and_parquet(paired, tmp_path):
    import datasets
    import json

    paired.record_vote(2, "ann", "b", True, strength=2)
    dataset = paired.export_dataset()
    assert dataset.column_names == ["prompt", "chosen", "rejected", "strength"]
    assert dataset.to_list() == [{"prompt": "Name a colour.", "chosen": "B2", "rejected": "A2", "strength": 2.0}]
    assert paired.export_jsonl(tmp_path / "prefs.jsonl") == 1
    assert [json.loads(line) for line in (tmp_path / "prefs.jsonl").read_text().splitlines()] == dataset.to_list()
    assert paired.export_parquet(tmp_path / "prefs.parquet") == 1
    assert datasets.Dataset.from_parquet(str(tmp_path / "prefs.parquet")).to_list() == dataset.to_list()


def test_export_dataset_when_empty_keeps_string_columns(store):
    dataset = store.export_dataset()
    assert len(dataset) == 0 and dataset.features["chosen"].dtype == "string"


def test_annotators_and_roles(store):
    assert store.add_annotator("lead", role="admin") is True
    assert store.add_annotator("lead") is False  # idempotent, role kept
    assert store.role_of("lead") == "admin" and store.is_admin("lead")
    store.set_role("ann", "annotator")
    assert store.role_of("ann") == "annotator" and not store.is_admin("ann")
    store.set_role("lead", "annotator")
    assert not store.is_admin("lead")
    assert store.role_of("nobody") is None and not store.is_admin("nobody")
    with pytest.raises(ValueError, match="role must be one of annotator, admin"):
        store.set_role("ann", "owner")
    assert [(a.name, a.role) for a in store.annotators()] == [("ann", "annotator"), ("lead", "annotator")]


def test_rounds_lifecycle_and_metrics_merge(store):
    first = store.start_round(pid=123)
    assert store.running_round().id == first
    store.update_round_metrics(first, {"step": "reward", "rm/accuracy": 0.5})
    store.update_round_metrics(first, {"step": "ppo"})
    store.finish_round(first, {"ppo/kl": 0.02})
    second = store.start_round(pid=456)
    store.fail_round(second, "out of memory")
    rows = [(r.id, r.status, r.metrics, r.error, r.pid, r.finished_at is not None) for r in store.rounds()]
    assert rows == [
        (1, "done", {"step": "ppo", "rm/accuracy": 0.5, "ppo/kl": 0.02}, None, 123, True),
        (2, "failed", {}, "out of memory", 456, True),
    ]
    assert store.running_round() is None
    assert store.last_done_round().id == first
    with pytest.raises(KeyError):
        store.finish_round(9, {})


def test_stale_running_rounds_are_marked_failed(store):
    alive = store.start_round(pid=10)
    dead = store.start_round(pid=20)
    assert store.mark_stale_rounds_failed(is_alive=lambda pid: pid == 10) == [dead]
    assert [(r.id, r.status) for r in store.rounds()] == [(alive, "running"), (dead, "failed")]
    assert "process 20" in store.round(dead).error


def test_stale_round_detection_uses_real_processes(store):
    import os
    import subprocess
    import sys

    from loop.children.liveness import process_is_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    mine = store.start_round()  # this process: alive
    gone = store.start_round(pid=child.pid)
    assert store.round(mine).pid == os.getpid()
    assert store.mark_stale_rounds_failed(process_is_alive) == [gone]


def test_demonstrations(paired):
    paired.add_demonstration(2, "ann", "  Blue.  ")
    paired.add_demonstration(1, "bob", "Hi there!")
    assert paired.demonstrations() == [("Name a colour.", "Blue."), ("Say hi.", "Hi there!")]
    with pytest.raises(ValueError, match="no prompt with id 9"):
        paired.add_demonstration(9, "ann", "text")
    with pytest.raises(ValueError, match="must not be empty"):
        paired.add_demonstration(1, "ann", " ")


def test_a_better_answer_is_stored_with_the_first_vote_only(paired):
    first = paired.submit_vote(1, "ann", "a", True, 2.0, better_answer="  Hello!  ")
    again = paired.submit_vote(1, "ann", "b", False, 1.0, better_answer="Hi!")  # a second tab, another choice
    plain = paired.submit_vote(2, "ann", "tie", True, better_answer="   ")
    assert (first.recorded, first.choice, first.demonstration_id) == (True, "a", 1)
    assert (again.recorded, again.choice, again.demonstration_id) == (False, "a", None)
    assert (plain.recorded, plain.choice, plain.demonstration_id) == (True, "tie", None)
    assert [(v.pair_id, v.choice, v.a_on_left) for v in paired.votes(annotator="ann")] == [(1, "a", True), (2, "tie", True)]
    assert paired.demonstrations() == [("Say hi.", "Hello!")]
    assert paired.add_demonstration(1, "ann", "Hey.", pair_id=1) is None  # one per (pair, annotator)
    with pytest.raises(ValueError, match="pair 2 does not exist or does not show prompt 1"):
        paired.add_demonstration(1, "ann", "Hey.", pair_id=2)


def test_stats_counts(paired):
    paired.record_vote(1, "ann", "a", True)
    paired.record_vote(2, "ann", "skip", True)
    paired.record_vote(1, "bob", "tie", False)
    assert paired.stats() == {
        "prompts": 2, "policies": 1, "generations": 6, "pairs": 3, "pairs_waiting": 1, "votes": 3,
        "votes_by_choice": {"a": 1, "b": 0, "tie": 1, "both_bad": 0, "skip": 1},
        "votes_by_annotator": {"ann": 2, "bob": 1}, "preferences": 1, "demonstrations": 0,
    }


def test_agreement_over_pairs_with_two_or_more_votes(paired):
    # pair 1: ann a, bob a (agree); pair 2: ann a, bob b (disagree); pair 3: only ann, and cid's skip is no label
    for pair_id, name, choice in ((1, "ann", "a"), (1, "bob", "a"), (2, "ann", "a"), (2, "bob", "b"),
                                  (3, "ann", "b"), (3, "cid", "skip")):
        paired.record_vote(pair_id, name, choice, True)
    report = paired.agreement()
    # ann = [a, a], bob = [a, b]: p_o = 1/2; p_e = (2/2 * 1/2) + (0 * 1/2) = 1/2; kappa = (1/2 - 1/2) / (1 - 1/2) = 0
    assert (report.items, report.rating_pairs, report.percent, report.kappa) == (2, 2, 0.5, 0.0)
    assert [(p.annotator_1, p.annotator_2, p.items, p.percent, p.kappa) for p in report.by_pair] == [("ann", "bob", 2, 0.5, 0.0)]


def test_versus_win_rates_count_gen_a_as_the_newer_policy(store):
    store.add_prompts(["q1", "q2", "q3"])
    old, new = store.add_policy(0, "base"), store.add_policy(1, "round-1")
    ids = store.add_pairs_bulk(
        [NewPair(p, NewGeneration(new, f"new{p}", 1, "eos"), NewGeneration(old, f"old{p}", 1, "eos"), kind="versus") for p in (1, 2, 3)]
        + [NewPair(1, NewGeneration(new, "s1", 1, "eos"), NewGeneration(new, "s2", 1, "eos"))]
    )
    for pair_id, name, choice in ((ids[0], "ann", "a"), (ids[0], "bob", "a"), (ids[1], "ann", "b"),
                                  (ids[2], "ann", "tie"), (ids[2], "bob", "both_bad"), (ids[3], "ann", "b")):
        store.record_vote(pair_id, name, choice, True)
    [rate] = store.versus_win_rates()
    # wins 2, losses 1, ties 1: (2 + 0.5) / 4 = 0.625; both_bad is no judgement of either side
    assert (rate.policy_id, rate.opponent_id, rate.wins, rate.losses, rate.ties, rate.both_bad, rate.win_rate) == (
        new, old, 2, 1, 1, 1, 0.625)


def test_votes_since_a_timestamp_and_since_the_last_round(paired):
    paired.record_vote(1, "ann", "a", True)
    round_id = paired.start_round()
    paired.finish_round(round_id, {})
    paired.record_vote(2, "ann", "b", True)
    paired.record_vote(3, "ann", "skip", True)
    assert paired.count_votes_since(None) == 2
    assert paired.count_votes_since(None, include_skips=True) == 3
    assert paired.votes_since_last_round() == 1


def test_prompts_needing_pairs_prefers_prompts_with_fewest_pairs(paired):
    paired.add_prompts(["Fresh one."])
    # prompt 1 has pairs 1 and 3, prompt 2 has pair 2, prompt 3 none
    assert [p.id for p in paired.prompts_needing_pairs(3)] == [3, 2, 1]
    # a prompt kept for evaluation is never offered, and the others fill its place
    kept = frozenset({paired.prompt(3).text})
    assert [p.id for p in paired.prompts_needing_pairs(2, exclude=kept)] == [2, 1]
    assert [p.id for p in paired.prompts_needing_pairs(3, exclude=kept)] == [2, 1]  # all there are


def test_a_rounds_report_is_kept_as_json_and_a_new_one_replaces_it(store):
    first, second = store.start_round(pid=1), store.start_round(pid=2)
    assert store.round_report(first) is None
    store.save_round_report(first, {"round_id": first, "answers": [{"prompt": "Hi <b>", "before": "a", "after": "b"}]})
    store.save_round_report(second, {"round_id": second, "answers": []})
    store.save_round_report(first, {"round_id": first, "answers": [], "figures": [{"value": 0.5}]})
    assert store.round_report(first) == {"round_id": first, "answers": [], "figures": [{"value": 0.5}]}
    assert store.round_report(second) == {"round_id": second, "answers": []}
    rows = store._rows("SELECT round_id, report FROM round_reports ORDER BY round_id")
    assert rows == [{"round_id": 1, "report": '{"round_id": 1, "answers": [], "figures": [{"value": 0.5}]}'},
                    {"round_id": 2, "report": '{"round_id": 2, "answers": []}'}]
    with pytest.raises(KeyError):
        store.save_round_report(9, {})
    assert store.round_report(9) is None


def test_an_older_database_gains_the_round_reports_table_and_keeps_its_rounds(tmp_path):
    from contextlib import closing

    from tests.test_store_concurrency import V1_SCHEMA

    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as conn:  # schema version 1, a round in it
        conn.executescript(V1_SCHEMA)
    with Store(path) as store:
        assert store.round(1).metrics == {"rm/accuracy": 0.7} and store.round_report(1) is None
        store.save_round_report(1, {"round_id": 1})
    with Store(path) as reopened:
        assert reopened.round_report(1) == {"round_id": 1}
