"""The Admin tab's "People and gold pairs" (#30 item 5): an admin excludes or includes an annotator and marks a pair's
right answer from the browser, as --exclude, --include and --gold do in the terminal; anyone else is refused and
changes nothing. Handlers called as plain functions over a real Store on a file database."""

from __future__ import annotations

import sys

import pytest

from annotate.ui_admin import AdminHandlers
from annotate.ui_session import AppConfig, Session
from loop.children.pair_job import GenerationJob
from loop.children.round_runner import RoundRunner
from tests.test_browser import NoGenerator
from tests.test_exclusion import two_annotator_store

BOSS, CAREFUL = Session(name="boss"), Session(name="careful")
REFUSAL = "Only admins can do this: careful is an annotator."


@pytest.fixture
def team(tmp_path):
    """two_annotator_store (careful, careless, other; pairs 1-4) with boss as admin, and the admin handlers over it."""
    store, pairs = two_annotator_store(tmp_path / "team.db")
    store.set_role("boss", "admin")
    config = AppConfig(admins=("boss",), gold_share=0.1)
    yield store, AdminHandlers(store, config, GenerationJob(NoGenerator()),
                               RoundRunner(store, [sys.executable, "-c", "pass"]))
    store.close()


def test_an_admin_excludes_and_includes_an_annotator_and_is_told_how_many_votes(team):
    store, admin = team
    assert admin.set_excluded("careless", True, BOSS) == (
        "Excluded careless: their 4 votes stay in the database, left out of the next rounds and of promotion.")
    assert store.excluded_annotators() == ["careless"]
    assert ("careless (excluded)", "careless") in admin.annotator_choices(BOSS)
    assert admin.set_excluded("  careless ", True, BOSS).startswith(
        "Nothing changed: careless is already excluded (since 20")
    assert admin.set_excluded("careless", False, BOSS) == (
        "Included careless again: their 4 votes count again in the next rounds and in promotion.")
    assert store.excluded_annotators() == []
    assert admin.set_excluded("careless", False, BOSS) == (
        "Nothing changed: careless is not excluded; their 4 votes count.")


def test_an_unknown_or_empty_name_changes_nothing_and_says_what_to_do(team):
    store, admin = team
    assert admin.set_excluded("nobody", True, BOSS) == (
        "No annotator named nobody: choose a name from the list (everyone who has signed in is there).")
    assert admin.set_excluded("<b>x</b>", True, BOSS).startswith("No annotator named &#60;b&#62;x&#60;/b&#62;:")
    assert admin.set_excluded(None, True, BOSS) == admin.set_excluded("  ", True, BOSS) == "Choose an annotator first."
    assert store.excluded_annotators() == []
    assert [name for _label, name in admin.annotator_choices(BOSS)] == [a.name for a in store.annotators()]


def test_an_admin_marks_a_gold_pair_changes_its_answer_and_unmarks_it(team):
    store, admin = team
    assert admin.mark_gold(2, "a", BOSS) == (
        "Pair 2 (“Question 1?”) is a gold pair, answer a right (“a2”); 1 gold pairs in all; with [app] gold_share = "
        "0.1 that share of each annotator's next pairs are gold pairs they have not voted on.")
    assert store.gold_pair_ids() == [2] and store.pair(2).gold == "a"
    assert admin.mark_gold(2, "a", BOSS) == (
        "Pair 2 (“Question 1?”) is already a gold pair, answer a right: nothing changed.")
    assert admin.mark_gold(2.0, "b", BOSS).startswith("Pair 2 (“Question 1?”) is a gold pair, answer b right (“b2”)")
    assert store.pair(2).gold == "b"
    assert admin.mark_gold(2, "none", BOSS) == "Pair 2 (“Question 1?”) is an ordinary pair again; 0 gold pairs in all."
    assert store.gold_pair_ids() == []
    assert admin.mark_gold(3, "none", BOSS) == "Pair 3 (“Question 2?”) is not a gold pair: nothing changed."


def test_an_unknown_pair_or_a_missing_id_or_side_changes_nothing_and_says_what_to_do(team):
    store, admin = team
    assert admin.mark_gold(99, "a", BOSS) == (
        "No pair with id 99: this database holds pairs 1 to 4. Check the id and press Mark gold again.")
    assert admin.mark_gold(None, "a", BOSS) == admin.mark_gold(0, "a", BOSS) == admin.mark_gold(1.5, "a", BOSS) == (
        "Type a pair id first: a whole number from 1.")
    assert admin.mark_gold(1, None, BOSS) == "The right answer is one of a, b, none."
    assert store.gold_pair_ids() == []


def test_without_gold_share_the_admin_is_told_no_one_sees_gold_pairs_yet(team):
    store, admin = team
    admin.config = AppConfig()
    assert admin.mark_gold(1, "b", BOSS).endswith("[app] gold_share is 0, so no one is shown gold pairs yet.")


def test_an_annotator_or_nobody_is_refused_and_changes_nothing(team):
    store, admin = team
    store.set_excluded("other", True)
    assert admin.set_excluded("careless", True, CAREFUL).startswith(REFUSAL)
    assert admin.set_excluded("other", False, CAREFUL).startswith(REFUSAL)
    assert admin.mark_gold(1, "a", CAREFUL).startswith(REFUSAL)
    assert admin.annotator_choices(CAREFUL) == []
    for handler_call in (lambda s: admin.set_excluded("careless", True, s), lambda s: admin.mark_gold(1, "a", s)):
        assert handler_call(Session()) == "Sign in first (Annotate tab)."
    assert store.excluded_annotators() == ["other"] and store.gold_pair_ids() == []


def test_a_demoted_admin_is_refused_at_the_next_call(team):
    store, admin = team
    store.set_role("careful", "admin")
    assert admin.set_excluded("careless", True, CAREFUL).startswith("Excluded careless")
    store.set_role("careful", "annotator")
    assert admin.set_excluded("careless", False, CAREFUL).startswith(REFUSAL)
    assert store.excluded_annotators() == ["careless"]


def test_gold_proposals_are_pairs_careful_voters_agree_on_by_hand():
    from annotate.people import GoldProposal, gold_proposals
    from annotate.records import Vote

    def vote(pair_id, annotator, choice):
        return Vote(0, pair_id, annotator, choice, True, 3.0, "2026-12-02")

    votes = [vote(1, "x", "a"), vote(1, "y", "a"), vote(1, "z", "b"),  # z is not careful: x and y agree on a
             vote(2, "x", "a"), vote(2, "y", "b"),  # careful voters disagree
             vote(3, "x", "b"), vote(3, "y", "b"), vote(3, "w", "tie"),  # a tie is no side
             vote(4, "x", "a"),  # one careful voter
             vote(5, "x", "a"), vote(5, "y", "a"),  # already gold
             vote(6, "x", "a"), vote(6, "y", "a"), vote(6, "w", "a")]
    assert gold_proposals(votes, careful={"x", "y", "w"}, gold_ids={5}) == [
        GoldProposal(6, "a", 3), GoldProposal(1, "a", 2), GoldProposal(3, "b", 2)]
    assert gold_proposals(votes, careful={"x", "y", "w"}, gold_ids={5}, min_voters=3) == [GoldProposal(6, "a", 3)]


def test_an_admin_marks_the_pairs_careful_annotators_agree_on_as_gold(team):
    store, admin = team
    pairs = [1, 2, 3, 4]  # two_annotator_store's, in order
    store.record_vote(pairs[1], "other", "a", a_on_left=True)  # pair 2: careful a, other a, careless b
    assert admin.proposals_frame(BOSS).empty  # careless disagrees: not while their vote counts as careful
    assert admin.accept_proposals(BOSS).startswith("No pair to propose")
    store.set_excluded("careless", True)
    frame = admin.proposals_frame(BOSS)
    assert frame.values.tolist() == [[pairs[1], "Question 1?", "a", 2]]
    assert admin.accept_proposals(CAREFUL).startswith(REFUSAL) and store.gold_pair_ids() == []
    assert admin.accept_proposals(BOSS) == "Marked 1 proposed pairs gold; 1 gold pairs in all."
    assert store.gold_pair_ids() == [pairs[1]] and store.pair(pairs[1]).gold == "a"
    assert admin.proposals_frame(BOSS).empty and admin.proposals_frame(CAREFUL).empty
