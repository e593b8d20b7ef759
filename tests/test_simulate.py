import random

import pytest

from annotate.annotators import (
    concision,
    concreteness,
    formality,
    score_scale,
    structure,
)
from annotate.records import NewGeneration, NewPair
from annotate.simulate import (
    COURTESY_WORDS,
    AnnotatorSpecError,
    graded,
    noisy,
    politeness,
    resolve_judge,
    resolve_score,
    simulate_votes,
    word_share,
)
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


def test_an_annotator_with_a_score_grades_its_votes_and_a_flipped_vote_keeps_its_strength():
    # "longer" scores by words: gaps of 1 word (2 vs 3) are slightly better, 6 words (2 vs 8) much better at scale 4
    store = seeded_store([("two words", "three words here")] * 3 + [("two words", "eight words " * 3 + "in all")] * 3)
    result = simulate_votes(store, resolve_judge("longer"), "sim", n_votes=6, seed=1, score=resolve_score("longer"),
                            scale=4.0)
    assert sorted((v.pair_id, v.choice, v.strength) for v in store.votes(annotator="sim")) == [
        (1, "b", 1), (2, "b", 1), (3, "b", 1), (4, "b", 2), (5, "b", 2), (6, "b", 2)]
    assert result.much_better == 3
    flipped = seeded_store([("two words", "eight words " * 3 + "in all")] * 4)
    simulate_votes(flipped, noisy(resolve_judge("longer"), 1.0, random.Random(0)), "sim", n_votes=4,
                   score=resolve_score("longer"), scale=4.0)
    assert {(v.choice, v.strength) for v in flipped.votes()} == {("a", 2)}  # every side flipped, every strength kept
    # without a scale the store's answers give one: score_scale of {2, 8} word counts = 6, so 6 words is "much"
    default = seeded_store([("two words", "eight words " * 3 + "in all")])
    simulate_votes(default, resolve_judge("longer"), "sim", n_votes=1, score=resolve_score("longer"))
    assert [(v.choice, v.strength) for v in default.votes()] == [("b", 2)]
    ungraded = seeded_store([("two words", "three words here")])
    simulate_votes(ungraded, resolve_judge("longer"), "sim", n_votes=1)
    assert [(v.choice, v.strength) for v in ungraded.votes()] == [("b", None)]  # no score: no grade


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


def test_new_rules_are_registered_with_scores_and_split_into_tuning_and_held_out():
    from annotate.simulate import (
        BUILT_IN_RULES,
        HELD_OUT_RULES,
        RULE_SCORES,
        TUNING_RULES,
    )

    for name in ("structured", "example", "formal", "concise"):
        assert resolve_judge(name) is BUILT_IN_RULES[name]
        assert resolve_score(name) is RULE_SCORES[name]
    assert set(TUNING_RULES) <= set(BUILT_IN_RULES) and set(HELD_OUT_RULES) <= set(BUILT_IN_RULES)
    assert not set(TUNING_RULES) & set(HELD_OUT_RULES)


def test_simulate_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, annotate.simulate; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0


def test_structure_counts_list_heading_and_labelled_lines_plus_short_lines():
    # 3 lines, all structural (a label, two numbered items) -> 1; 7 words in 3 chunks: min(1, 8 / (7/3)) = 1 -> +0.2
    assert structure("Steps:\n1. Mix flour.\n2. Bake it.") == pytest.approx(1.2)
    # one plain line of 14 words: 0 + 0.2 * 8/14
    assert structure("Sleep well by keeping a regular schedule and a dark quiet room every night.") == \
        pytest.approx(0.2 * 8 / 14)
    # chunks are cut at sentence ends: 11 + 8 = 19 words in 2 chunks -> 0.2 * 8 / 9.5, whatever the total length
    assert structure("Keep a regular schedule and a dark quiet room every night. Avoid screens before bed and "
                     "caffeine after noon.") == pytest.approx(0.2 * 8 / 9.5)
    # "## Tips" heading, two "-" items: 3 of 3; "**Why:** ..." a bold label, "Tips for sleep" is not one
    assert structure("## Tips\n- Water weekly\n- Keep warm") == pytest.approx(1.2)
    assert structure("Tips for sleep\n**Why:** it helps\nKeep the room cool and dark at night.") == \
        pytest.approx(1 / 3 + 0.2 * min(1, 8 / (14 / 3)))
    judge = resolve_judge("structured")
    listed = "Here is how:\n\n1. Preheat the oven.\n2. Mix the batter.\n3. Bake for twenty minutes."
    prose = "Preheat the oven, then mix the batter and bake it for twenty minutes until it is golden."
    assert judge("p", listed, prose) == "a" and judge("p", prose, listed) == "b"
    assert structure("") == 0.0
    assert structure("The Thunderbolios: The Power of the World") == pytest.approx(0.2)  # one line is no layout


def test_concreteness_weighs_example_markers_by_what_follows_then_specifics():
    # marker anchored by "25" -> 1; specifics: one number in 7 words, x10 -> min(1, 10/7) = 1; one comma: 0.25 * 5/7
    assert concreteness("Use a timer, for example 25 minutes.") == pytest.approx(1 + 1 + 0.25 * 5 / 7)
    assert concreteness("Try fruits such as apples or pears.") == pytest.approx(0.5)  # an enumeration, nothing else
    assert concreteness("Try things such as these.") == pytest.approx(0.25)  # a bare marker
    # a code span anchors the marker (1) and is a specific: 1 in 5 words, x10 -> 1
    assert concreteness("Use tools such as `grep`.") == pytest.approx(2.0)
    # list numbering is not a number; a name in prose ("visit Lisbon") is a specific: 10/5 -> 1
    assert concreteness("1. Plan ahead\n2. Pack light") == 0.0
    assert concreteness("We could visit Lisbon together.") == pytest.approx(1.0)
    judge = resolve_judge("example")
    with_example = "Save a fixed share of your income. For example, put aside 50 dollars on every payday."
    without = "Save a fixed share of your income and try to keep doing it over time."
    assert judge("p", with_example, without) == "a"


def test_formality_combines_word_and_sentence_length_with_contractions_slang_and_exclamations():
    # "It's great!": 2 words, letters 3 + 5 -> 4/8 = 0.5; 2 words a sentence -> 2/30; one contraction -> -3 * 1/2;
    # one "!" in one sentence -> -1
    assert formality("It's great!") == pytest.approx(0.5 + 2 / 30 - 1.5 - 1)
    # letters 3 + 7 + 3 + 12 = 25 -> 6.25/8; 4 words in one sentence -> 4/30
    assert formality("The results are satisfactory.") == pytest.approx(6.25 / 8 + 4 / 30)
    judge = resolve_judge("formal")
    assert judge("p", "Yeah, just do it, it's really cool!", "The procedure is straightforward and reliable.") == "b"
    assert judge("p", "The committee's report is available.", "The report is available.") == "a"  # possessive 's


def test_concision_is_distinct_content_words_per_word_with_penalties_for_empty_and_repeated():
    # water, the, plant, weekly: 3 distinct content words of 4 -> 3/4 x min(1, 3/8) x (1 - 0)
    assert concision("Water the plant weekly.") == pytest.approx(3 / 4 * 3 / 8)
    # 6 words, 2 distinct content words; trigrams: 4, 3 distinct -> 1/4 repeated: 2/6 x 2/8 x 3/4
    assert concision("Water the plant. Water the plant.") == pytest.approx(2 / 6 * 2 / 8 * 3 / 4)
    judge = resolve_judge("concise")
    tight = "Water succulents every two weeks, in bright indirect light, with well-draining soil."
    padded = ("Well, it is really the case that you should water them, and you should water them, and it is the "
              "case that they need some light and some soil.")
    assert judge("p", tight, padded) == "a"
    assert judge("p", "Yes.", tight) == "b"  # too short to say anything
    assert concision("") == 0.0


def test_a_modules_score_is_the_annotators_score_when_it_defines_one():
    from examples.custom_annotator import score

    # "The cat sat.": 3 words, 1 sentence, 1 syllable each: (206.835 - 1.015 * 3 - 84.6 * 1) / 100
    assert score("The cat sat.") == pytest.approx(1.1919)
    assert resolve_score("examples.custom_annotator:judge") is score
    judge = resolve_judge("examples.custom_annotator:judge")
    assert judge("p", "The cat sat.", "Photosynthesis is fascinating.") == "a"
    assert resolve_score("annotate.simulate:shorter") is None  # its module has no score
    assert resolve_score("no_such_module_xyz:f") is None


def test_graded_says_how_much_better_by_the_score_difference_against_a_scale():
    def words(text):
        return float(len(text.split()))

    assert graded(words, "p", "a b c d", "a", scale=2) == ("a", 2)  # 4 - 1 = 3 >= 2: much better
    assert graded(words, "p", "a b", "a", scale=2) == ("a", 1)  # 1 < 2: slightly
    assert graded(words, "p", "a", "a b c", scale=2) == ("b", 2)  # exactly the scale counts as much
    assert graded(words, "p", "a b", "c d", scale=2) == ("tie", 0)
    with pytest.raises(ValueError):
        graded(words, "p", "a", "b", scale=0)
    # scores 1, 2, 4: pair gaps 1, 3, 2 -> median 2 (identical scores are left out)
    assert score_scale(words, ["a", "a b", "a b c d", "x"]) == pytest.approx(2)
    assert score_scale(words, ["a", "b"]) == 0.0
