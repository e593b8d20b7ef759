import pytest

from annotate.records import NewGeneration, NewPair
from annotate.simulate import (COURTESY_WORDS, AnnotatorSpecError, noisy, politeness, resolve_judge,
                               simulate_votes, word_share)
from annotate.store import Store


def seeded_store(answers: list[tuple[str, str]]) -> Store:
    store = Store(":memory:")
    store.add_prompts([f"prompt {i}" for i in range(len(answers))], source="test")
    policy = store.add_policy(0, "base")
    pairs = [
        NewPair(prompt.id, NewGeneration(policy, a, len(a.split()), "stop"), NewGeneration(policy, b, len(b.split()), "stop"), "sample")
        for prompt, (a, b) in zip(store.prompts(), answers)
    ]
    store.add_pairs_bulk(pairs)
    return store


def test_rule_votes_are_recorded_about_gen_a_and_gen_b_whatever_side_was_shown():
    store = seeded_store([("short", "a much longer answer here")] * 6)
    result = simulate_votes(store, resolve_judge("longer"), "sim", n_votes=6, seed=3)
    votes = store.votes(annotator="sim")
    assert result.votes == 6
    assert {vote.choice for vote in votes} == {"b"}  # gen_b is the longer one on every pair
    assert {vote.a_on_left for vote in votes} == {True, False}  # both sides were shown


def test_simulation_stops_when_the_queue_runs_dry():
    store = seeded_store([("yes", "no")] * 2)
    result = simulate_votes(store, resolve_judge("shorter"), "sim", n_votes=5)
    assert (result.votes, result.queue_empty) == (2, True)
    assert result.choices == {"tie": 2}


def test_contains_rule_and_module_function_spec():
    assert resolve_judge("contains:please")("p", "please help", "help") == "a"
    assert resolve_judge("contains:please")("p", "x", "y") == "tie"
    judge = resolve_judge("annotate.simulate:shorter")
    assert judge("p", "one two", "one") == "b"


def test_politeness_counts_warm_words_not_length():
    assert politeness("Thank you, I am glad to help!") == pytest.approx(2 / 7)
    assert resolve_judge("polite")("p", "Sure, happy to help.", "Do it yourself and stop asking me things.") == "a"


def test_courteous_counts_only_courtesy_words_as_a_share():
    # "good" and "sure" are polite words but not courtesy words: 2 of 7 words against 1 of 3
    assert word_share("Thank you, I am glad to help!", COURTESY_WORDS) == pytest.approx(2 / 7)
    courteous = resolve_judge("courteous")
    assert courteous("p", "Sure, that is good.", "Good, sure, fine.") == "tie"  # polite would not tie these
    assert resolve_judge("polite")("p", "Sure, that is good.", "Good, sure, fine.") == "b"
    assert courteous("p", "Thank you, I am glad to help!", "Happy to help.") == "b"  # 2/7 < 1/3: a share, not a count


def test_noise_flips_about_the_requested_share_of_votes():
    import random

    judge = noisy(resolve_judge("longer"), 0.25, random.Random(0))
    votes = [judge("p", "a b c", "a") for _ in range(2000)]
    assert 0.22 < votes.count("b") / len(votes) < 0.28


@pytest.mark.parametrize("spec", ["nonsense", "contains:", "no_such_module_xyz:f"])
def test_bad_annotator_specs_are_refused_with_a_clear_error(spec):
    with pytest.raises(AnnotatorSpecError):
        resolve_judge(spec)


def test_simulate_command_votes_into_the_database(tmp_path, capsys):
    import app

    db = tmp_path / "votes.db"
    store = Store(db)
    store.add_prompts(["p1", "p2"], source="t")
    policy = store.add_policy(0, "base")
    for prompt in store.prompts():
        store.add_pairs_bulk([NewPair(prompt.id, NewGeneration(policy, "hi", 1, "stop"),
                                      NewGeneration(policy, "hello there", 2, "stop"), "sample")])
    store.close()
    assert app.main(["--simulate", "longer", "--votes", "5", "--db", str(db)]) == 0
    assert "sim:longer voted 2 times" in capsys.readouterr().out
    assert [vote.choice for vote in Store(db).votes()] == ["b", "b"]
