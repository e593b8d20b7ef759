"""An admin's exclusion of an annotator (#30 item 4, its first half): the votes stay in the database, unused by the
preferences the reward model trains on and by the versus tallies promotion reads, until included again; the round
records who was excluded; `--exclude`, `--include` and `--annotators` in the terminal."""

from __future__ import annotations

import pytest

import app
from annotate.store import Store
from loop.config_files import load_config
from loop.round_plan import plan_round


def two_annotator_store(db) -> tuple[Store, list[int]]:
    """Three sample pairs and one versus pair; `careful` votes a on all, `careless` b on all and a second vote."""
    store = Store(db)
    store.add_prompts([f"Question {i}?" for i in range(4)], source="test")
    base = store.ensure_base_policy("base")
    newer = store.add_policy(1, "newer", parent_id=base.id)
    pairs = []
    for prompt in range(1, 4):
        gen_a, gen_b = (store.add_generation(prompt, base.id, f"{side}{prompt}", 2, "eos") for side in "ab")
        pairs.append(store.add_pair(prompt, gen_a, gen_b, kind="sample"))
    versus_a = store.add_generation(4, newer, "new", 1, "eos")
    pairs.append(store.add_pair(4, versus_a, store.add_generation(4, base.id, "old", 1, "eos"), kind="versus"))
    for name in ("careful", "careless", "other"):
        store.add_annotator(name)
    for pair in pairs:
        store.record_vote(pair, "careful", "a", a_on_left=True)
        store.record_vote(pair, "careless", "b", a_on_left=False)
    store.record_vote(pairs[0], "other", "b", a_on_left=True)  # pair 1: a 1, b 2 with everyone
    return store, pairs


def test_an_excluded_annotators_votes_stay_but_train_and_promote_nothing_until_included(tmp_path):
    store, pairs = two_annotator_store(tmp_path / "x.db")
    assert [p.chosen for p in store.preferences()] == ["b1"]  # 1-1 ties on pairs 2-4 give no preference
    assert store.versus_win_rates()[0].judged == 2
    store.set_excluded("careless", True)
    first_time = store.annotators()[1].excluded_at
    store.set_excluded("careless", True)  # again: the first time stays
    assert [a.excluded_at for a in store.annotators() if a.name == "careless"] == [first_time]
    # without careless: pair 1 is a 1 - b 1 (no preference), pairs 2-4 are careful's a
    assert [(p.pair_id, p.chosen) for p in store.preferences()] == [(pairs[1], "a2"), (pairs[2], "a3"),
                                                                     (pairs[3], "new")]
    (versus,) = store.versus_win_rates()
    assert (versus.wins, versus.losses) == (1, 0)
    assert len(store.votes()) == 9 and store.excluded_annotators() == ["careless"]  # nothing deleted
    store.set_excluded("careless", False)
    assert [p.chosen for p in store.preferences()] == ["b1"] and store.excluded_annotators() == []
    with pytest.raises(KeyError):
        store.set_excluded("nobody", True)
    store.close()


def test_the_round_records_who_was_excluded_when_it_read_the_votes(tmp_path):
    store, _ = two_annotator_store(tmp_path / "x.db")
    store.set_excluded("careless", True)
    config = load_config(None, ["round.min_new_pairs=1", f"round.checkpoints_dir={tmp_path / 'checkpoints'}",
                                "promotion.rule=always"])
    plan = plan_round(store, "base", config, log=lambda message: None)
    assert len(plan.preferences) == 3
    assert store.round(plan.round_id).metrics["round/excluded_annotators"] == ["careless"]
    store.close()


def test_exclude_include_and_the_people_table_in_the_terminal(tmp_path, capsys):
    db = tmp_path / "x.db"
    two_annotator_store(db)[0].close()
    assert app.main(["--db", str(db), "--exclude", "careless"]) == 0
    assert "careless is excluded: their 4 votes stay in the database" in capsys.readouterr().out
    assert app.main(["--db", str(db), "--annotators"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["annotator", "votes"] and table[0].rstrip().endswith("excluded")
    careless = next(line for line in table if line.startswith("careless"))
    assert "since 20" in careless and "since" not in next(line for line in table if line.startswith("careful"))
    assert app.main(["--db", str(db), "--include", "careless"]) == 0
    assert "careless is included again: their 4 votes count again." in capsys.readouterr().out
    assert app.main(["--db", str(db), "--exclude", "nobody"]) == 2
    assert "no annotator named 'nobody'; python app.py --annotators lists who voted." in capsys.readouterr().err


def test_the_terminal_table_lists_the_proposed_gold_pairs(tmp_path, capsys):
    db = tmp_path / "x.db"
    store, pairs = two_annotator_store(db)
    store.record_vote(pairs[2], "other", "a", a_on_left=True)  # pair 3: careful a, other a (careless b)
    store.set_excluded("careless", True)
    store.close()
    assert app.main(["--db", str(db), "--annotators"]) == 0
    out = capsys.readouterr().out
    assert f"picked the same answer: {pairs[2]} (a, 2 voters) (1 in all)" in out and "--gold PAIR SIDE" in out
