"""The store on a file database: WAL, migrations of an older file, and many threads at once."""

import sqlite3
import threading
import time

import pytest

from annotate.records import NewGeneration, NewPair
from loop.children.liveness import process_is_alive
from annotate.store import Store, StoreOpenError
from annotate.store.sql import MIGRATIONS

V1_SCHEMA = """
CREATE TABLE prompts (id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE, source TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL);
CREATE TABLE policies (id INTEGER PRIMARY KEY, round INTEGER NOT NULL, path TEXT NOT NULL,
    parent_id INTEGER REFERENCES policies(id), created_at TEXT NOT NULL);
CREATE TABLE generations (id INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL REFERENCES prompts(id),
    policy_id INTEGER NOT NULL REFERENCES policies(id), text TEXT NOT NULL, n_tokens INTEGER NOT NULL,
    finish_reason TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE pairs (id INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL REFERENCES prompts(id),
    gen_a INTEGER NOT NULL REFERENCES generations(id), gen_b INTEGER NOT NULL REFERENCES generations(id),
    kind TEXT NOT NULL CHECK (kind IN ('sample', 'versus')), created_at TEXT NOT NULL);
CREATE TABLE votes (id INTEGER PRIMARY KEY, pair_id INTEGER NOT NULL REFERENCES pairs(id), annotator TEXT NOT NULL,
    choice TEXT NOT NULL CHECK (choice IN ('a', 'b', 'tie', 'both_bad', 'skip')), a_on_left INTEGER NOT NULL,
    seconds REAL, created_at TEXT NOT NULL, UNIQUE (pair_id, annotator));
CREATE TABLE demonstrations (id INTEGER PRIMARY KEY, prompt_id INTEGER NOT NULL REFERENCES prompts(id),
    annotator TEXT NOT NULL, text TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE rounds (id INTEGER PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    started_at TEXT NOT NULL, finished_at TEXT, metrics TEXT NOT NULL DEFAULT '{}', error TEXT);
CREATE TABLE annotators (name TEXT PRIMARY KEY, role TEXT NOT NULL CHECK (role IN ('annotator', 'admin')),
    created_at TEXT NOT NULL);
INSERT INTO prompts VALUES (1, 'Say hi.', 'old', '2024-01-01T00:00:00.000000Z');
INSERT INTO policies VALUES (1, 0, 'default', NULL, '2024-01-01T00:00:00.000000Z');
INSERT INTO generations VALUES (1, 1, 1, 'Hi!', 2, 'eos', '2024-01-01T00:00:00.000000Z');
INSERT INTO generations VALUES (2, 1, 1, 'Hello.', 2, 'eos', '2024-01-01T00:00:00.000000Z');
INSERT INTO pairs VALUES (1, 1, 1, 2, 'sample', '2024-01-01T00:00:00.000000Z');
INSERT INTO votes VALUES (1, 1, 'ann', 'a', 1, 2.5, '2024-01-01T00:00:01.000000Z');
INSERT INTO rounds VALUES (1, 'running', '2024-01-01T00:00:02.000000Z', NULL, '{"rm/accuracy": 0.7}', NULL);
INSERT INTO annotators VALUES ('ann', 'admin', '2024-01-01T00:00:00.000000Z');
PRAGMA user_version = 1;
"""


def test_an_older_database_file_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_SCHEMA)
    conn.close()
    with Store(path) as store:
        assert store.schema_version() == len(MIGRATIONS)  # every migration ran
        assert [(p.id, p.text, p.source) for p in store.prompts()] == [(1, "Say hi.", "old")]
        assert [(v.pair_id, v.annotator, v.choice, v.a_on_left, v.seconds) for v in store.votes()] == [(1, "ann", "a", True, 2.5)]
        assert store.is_admin("ann")
        assert store.pair(1).n_votes == 1  # counted from the votes already there
        assert store.pair(1).chosen_by is None  # how it was chosen is unknown: its vote counts as a random pair's
        assert [p.source for p in store.preferences()] == ["sample"]
        assert [(v.choice, v.strength) for v in store.votes()] == [("a", None)]  # an old vote is ungraded ...
        assert [p.strength for p in store.preferences()] == [1.0]  # ... and reads as slightly better
        assert store.record_vote(1, "bob", "b", a_on_left=False, strength=2) and store.pair(1).n_votes == 2
        assert [(v.annotator, v.strength) for v in store.votes()] == [("ann", None), ("bob", 2)]
        [old_round] = store.rounds()
        assert (old_round.status, old_round.metrics, old_round.pid) == ("running", {"rm/accuracy": 0.7}, None)
        assert store.mark_stale_rounds_failed(process_is_alive) == [1]  # no pid recorded: nobody can be running it
        assert store.start_round(pid=42) == 2 and store.round(2).pid == 42
    with Store(path) as reopened:  # a second open migrates nothing and keeps everything
        assert reopened.schema_version() == len(MIGRATIONS)
        assert [r.status for r in reopened.rounds()] == ["failed", "running"]


def test_an_older_database_links_its_better_answers_to_pairs_and_keeps_every_one(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_SCHEMA + """
            INSERT INTO demonstrations VALUES (1, 1, 'ann', 'Hello there!', '2024-01-01T00:00:01.500000Z');
            INSERT INTO demonstrations VALUES (2, 1, 'ann', 'Hello there!', '2024-01-01T00:00:01.600000Z');
            INSERT INTO demonstrations VALUES (3, 1, 'zed', 'Yo.', '2024-01-01T00:00:03.000000Z');""")
    conn.close()
    with Store(path) as store:
        # ann voted on pair 1 just before writing: the first copy is linked, the copy a parallel submit stored and
        # zed's answer (no vote) keep no pair; none is lost
        assert store.demonstrations() == [("Say hi.", "Hello there!"), ("Say hi.", "Hello there!"), ("Say hi.", "Yo.")]
        assert store.add_demonstration(1, "ann", "Another.", pair_id=1) is None
        assert store.add_demonstration(1, "zed", "Yo again.", pair_id=1) == 4
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, pair_id, annotator FROM demonstrations ORDER BY id").fetchall() == [
            (1, 1, "ann"), (2, None, "ann"), (3, None, "zed"), (4, 1, "zed")]
    conn.close()


def test_parallel_submits_of_one_vote_store_one_vote_and_one_better_answer(tmp_path):
    store = Store(tmp_path / "parallel.db")
    store.add_prompts(["Say hi."])
    policy = store.add_policy(0, "base")
    _seed_pairs(store, policy, 0, 1)
    barrier = threading.Barrier(10)
    outcomes, errors = [], []

    def submit(choice: str):
        try:
            barrier.wait()
            outcomes.append(store.submit_vote(1, "ann", choice, True, 1.0, better_answer="Hi, nice to meet you."))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=submit, args=("a" if i % 2 else "b",)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    [winner] = [o for o in outcomes if o.recorded]
    assert winner.demonstration_id == 1
    # every other call is told which choice stands, and wrote nothing
    assert sorted((o.recorded, o.choice, o.demonstration_id) for o in outcomes if not o.recorded) == [
        (False, winner.choice, None)] * 9
    assert [(v.pair_id, v.annotator, v.choice) for v in store.votes()] == [(1, "ann", winner.choice)]
    assert store.demonstrations() == [("Say hi.", "Hi, nice to meet you.")]
    store.close()


def test_a_database_newer_than_the_code_is_refused(tmp_path):
    path = tmp_path / "future.db"
    Store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreOpenError, match=r"written by a newer rlhf-loop \(schema 99; this one knows up to"):
        Store(path)


def test_a_file_database_uses_wal_and_keeps_data_across_opens(tmp_path):
    path = tmp_path / "nested" / "rlhf.db"
    with Store(path) as store:
        store.add_prompts(["one", "two"])
    with Store(path) as store:
        assert store.count_prompts() == 2
        with store._read() as db:
            assert db.journal_mode == "wal"
            assert db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000


def _seed_pairs(store: Store, policy_id: int, start: int, count: int) -> None:
    for number in range(start, start + count):
        store.add_pairs_bulk([NewPair(1, NewGeneration(policy_id, f"a{number}", 1, "eos"), NewGeneration(policy_id, f"b{number}", 1, "eos"))])


def test_threads_voting_while_another_writes_generations(tmp_path):
    path = tmp_path / "busy.db"
    store = Store(path)
    store.add_prompts(["Say hi."])
    policy = store.add_policy(0, "base")
    _seed_pairs(store, policy, 0, 30)
    annotators = [f"ann{i}" for i in range(4)]
    overlap = len(annotators) + 1  # every annotator votes on every pair, the twin's skips counting too
    writer_done = threading.Event()
    errors: list[BaseException] = []
    second_submits: list[bool] = []

    def writer():
        # A second Store on the same file stands for another process (the round writing fresh pairs).
        other = Store(path)
        try:
            _seed_pairs(other, policy, 30, 40)
            for number in range(20):
                other.add_generation(1, policy, f"loose{number}", 1, "eos")
        except BaseException as error:
            errors.append(error)
        finally:
            other.close()
            writer_done.set()

    def voter(name: str):
        try:
            while True:
                done_before = writer_done.is_set()
                showing = store.next_pair(name, overlap=overlap)
                if showing is None:
                    if done_before:
                        return
                    time.sleep(0.005)
                    continue
                assert store.record_vote(showing.pair_id, name, "a" if showing.a_on_left else "b", showing.a_on_left)
                second_submits.append(store.record_vote(showing.pair_id, name, "tie", showing.a_on_left))
        except BaseException as error:
            errors.append(error)

    def twin(name: str):
        # Two threads submitting the same annotator's votes on the same pairs: one row per pair, whoever wins.
        try:
            for pair_id in range(1, 31):
                store.record_vote(pair_id, name, "skip", True)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=voter, args=(n,)) for n in annotators]
    threads += [threading.Thread(target=twin, args=("twin",)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert store.count_pairs() == 70
    assert store.stats()["generations"] == 160
    votes = store.votes()
    assert len(votes) == 70 * len(annotators) + 30
    assert len({(v.pair_id, v.annotator) for v in votes}) == len(votes)
    assert {name: store.votes_by(name) for name in annotators + ["twin"]} == {**dict.fromkeys(annotators, 70), "twin": 30}
    assert second_submits == [False] * (70 * len(annotators))
    assert [store.pairs_waiting(name, overlap=overlap) for name in annotators] == [0] * len(annotators)
    assert store.pairs_waiting(overlap=overlap) == 40  # the twin skipped only pairs 1-30: the others lack a fifth vote
    store.close()
