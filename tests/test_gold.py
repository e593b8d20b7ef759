"""Gold pairs (#30 item 3): an admin marks a pair's right answer; [app] gold_share mixes the gold pairs an annotator has
not voted on into their queue, shown as any other pair; each annotator's gold accuracy with its interval; a gold
pair trains once, on its gold side."""

from __future__ import annotations

import random

import pytest

import app
from annotate.people import people, people_rows
from annotate.statistics import wilson_interval
from annotate.store import Store
from annotate.team import build_team, parse_team, simulate_team_votes
from tests.test_reliability import team_store


def store_with_pairs(db, n: int = 4) -> tuple[Store, list[int]]:
    store = Store(db)
    store.add_prompts([f"Question {i}?" for i in range(n)], source="test")
    base = store.ensure_base_policy("base")
    pairs = []
    for prompt in range(1, n + 1):
        gen_a, gen_b = (store.add_generation(prompt, base.id, f"{side}{prompt}", 2, "eos") for side in "ab")
        pairs.append(store.add_pair(prompt, gen_a, gen_b))
    return store, pairs


def test_gold_pairs_come_first_at_gold_share_one_then_the_queue_and_look_like_any_pair(tmp_path):
    store, pairs = store_with_pairs(tmp_path / "g.db")
    store.set_gold(pairs[2], "b")
    store.set_gold(pairs[3], "a")
    assert store.gold_pair_ids() == pairs[2:]
    for name in ("ann", "bob"):
        store.add_annotator(name)
    shown = []
    for _ in range(4):
        showing = store.next_pair("ann", gold_share=1.0, rng=random.Random(0))
        shown.append(showing.pair_id)
        store.record_vote(showing.pair_id, "ann", "a", showing.a_on_left)
    assert shown == [pairs[2], pairs[3], pairs[0], pairs[1]]  # the gold ones first, then the oldest open ones
    assert not hasattr(showing, "gold")  # nothing on the page tells a gold pair apart
    # bob gets the gold pairs though each already has ann's vote (overlap 1): every annotator is measured on them
    assert store.next_pair("bob", gold_share=1.0).pair_id == pairs[2]
    assert store.next_pair("bob", gold_share=0.0) is None  # at overlap 1 the queue itself has nothing left for bob
    with pytest.raises(ValueError):
        store.set_gold(pairs[0], "c")
    with pytest.raises(KeyError):
        store.set_gold(999, "a")
    store.close()


def test_a_gold_pair_trains_once_on_its_gold_side_and_measures_each_annotators_gold_accuracy(tmp_path):
    store, pairs = store_with_pairs(tmp_path / "g.db", n=2)
    store.set_gold(pairs[0], "a")
    for name, choice in (("ann", "a"), ("bob", "b"), ("cat", "b")):
        store.add_annotator(name)
        store.record_vote(pairs[0], name, choice, a_on_left=True)
    (gold,) = [p for p in store.preferences() if p.pair_id == pairs[0]]  # 1 a against 2 b: still a, and once
    assert (gold.chosen, gold.rejected, gold.votes) == ("a1", "b1", 3)
    store.set_gold(pairs[0], None)
    assert [p.chosen for p in store.preferences()] == ["b1"]  # an ordinary pair again: the majority
    store.set_gold(pairs[0], "a")
    assert store.gold_results() == {"ann": (1, 1), "bob": (0, 1), "cat": (0, 1)}
    rows = {row[0]: row for row in people_rows(people(store.votes(), store.agreement(), store.gold_results()))}
    low, high = wilson_interval(1.0, 1)
    assert rows["ann"][8] == f"100% ({low:.0%}-{high:.0%}, n=1)" and rows["bob"][8].startswith("0% (0%-")
    store.close()


def test_on_gold_pairs_a_random_clicker_scores_near_half_and_careful_members_clearly_above():
    pooled = {"random": [0, 0], "careful": [0, 0]}
    for seed in range(4):
        store = team_store(400, seed=seed)
        for pair in (store.pair(i) for i in range(1, 101)):  # an admin marked the courteous side of 100 pairs
            store.set_gold(pair.id, "a" if store.generation(pair.gen_a).text.startswith("Thank") else "b")
        team = build_team(parse_team("courteous*3,random"), 0.25, seed)
        simulate_team_votes(store, team, 400, seed=seed, gold_share=0.5)  # 25% flips: careful ones near 75%
        results = store.gold_results()
        for name, (right, judged) in results.items():
            kind = pooled["random" if name == "sim:random" else "careful"]
            kind[0], kind[1] = kind[0] + right, kind[1] + judged
        flags = {row[0]: row[-1] for row in people_rows(people(store.votes(), store.agreement(), results))}
        assert not any(flags[f"sim:courteous-{i}"] for i in (1, 2, 3)), (seed, flags)  # no careful one flagged
        store.close()
    (random_right, random_judged), (careful_right, careful_judged) = pooled["random"], pooled["careful"]
    assert random_judged >= 200 and abs(random_right / random_judged - 0.5) < 0.08, pooled
    assert wilson_interval(careful_right / careful_judged, careful_judged)[0] > 0.65, pooled


def test_a_gold_accuracy_whose_interval_stays_below_60_percent_is_flagged():
    from annotate.people import Person, careless_reason

    def on_gold(right: int, judged: int) -> str:
        return careless_reason(Person("ann", judged, judged, judged // 2, 1.0, 0, None, 10.0, None, right, judged))

    # 3 of 20: Wilson 95% high 0.36 < 0.6; 9 of 20: high 0.66; 2 of 9: too few gold votes to say
    assert on_gold(3, 20) == "right on 15% of 20 gold pairs (at most 36%)"
    assert on_gold(9, 20) == "" and on_gold(2, 9) == ""


def test_gold_from_the_terminal(tmp_path, capsys):
    db = tmp_path / "g.db"
    store, pairs = store_with_pairs(db)
    store.close()
    assert app.main(["--db", str(db), "--gold", str(pairs[1]), "b"]) == 0
    assert f"Pair {pairs[1]} is a gold pair, answer b right; 1 gold pairs in all." in capsys.readouterr().out
    assert app.main(["--db", str(db), "--gold", str(pairs[1]), "none"]) == 0
    assert "an ordinary pair again; 0 gold pairs" in capsys.readouterr().out
    assert app.main(["--db", str(db), "--gold", "999", "a"]) == 2
    assert app.main(["--db", str(db), "--gold", str(pairs[1]), "left"]) == 2
