"""One person, one name: the normalisation used by sign-in, roles, the auth file and the store; the migration of
databases written before it (merged, or kept apart and listed, never a vote lost); signed session tokens."""

import os
import sqlite3
import stat

import pytest
import sqlite_utils

from annotate.identity import SessionTokens, clean_name, migrated_name
from annotate.records import NameClash
from annotate.store import Store
from annotate.store.sql import MIGRATIONS

ZWSP, RLM = "\u200b", "\u200f"


@pytest.mark.parametrize("typed, stored", [
    ("carol  smith", "carol smith"),
    ("  carol\tsmith\n", "carol smith"),
    ("ALICE", "alice"),
    ("Ada Lovelace", "ada lovelace"),
    ("ａｌｉｃｅ", "alice"),  # full-width letters (NFKC)
    ("alice\u00a0b", "alice b"),  # a no-break space
    ("Straße", "strasse"),  # case folding, not lower()
    ("sim:rule", "sim:rule"),
])
def test_names_are_normalised_in_one_place(typed, stored):
    assert clean_name(typed) == (stored, "")


@pytest.mark.parametrize("typed, problem", [
    ("", "Type your name to sign in."),
    ("   ", "Type your name to sign in."),
    (f"ali{ZWSP}ce", "Names cannot hold invisible or control characters (found U+200B ZERO WIDTH SPACE)."),
    (f"{RLM}alice", "Names cannot hold invisible or control characters (found U+200F RIGHT-TO-LEFT MARK)."),
    ("ali\x00ce", "Names cannot hold invisible or control characters (found NUL)."),
    ("a" * 65, "Please use a shorter name (at most 64 characters)."),
])
def test_names_with_invisible_characters_are_refused_with_the_reason(typed, problem):
    assert clean_name(typed) == (None, problem)


def test_the_migration_drops_invisible_characters_that_sign_in_refuses():
    assert [migrated_name(name) for name in (f"ali{ZWSP}ce", f"{RLM}alice", "ALICE ", ZWSP)] == \
        ["alice", "alice", "alice", None]


def test_the_store_keeps_one_name_and_one_vote_per_person(tmp_path):
    with Store(":memory:") as store:
        store.add_prompts(["p"])
        policy = store.add_policy(0, "base")
        pair = store.add_pair(1, store.add_generation(1, policy, "x", 1, "eos"),
                              store.add_generation(1, policy, "y", 1, "eos"))
        assert store.record_vote(pair, "ALICE", "a", True) is True
        assert store.record_vote(pair, " alice ", "b", True) is False  # the same person: the first vote stands
        store.set_role("Carol  Smith", "admin")
        assert store.role_of("carol smith") == "admin" and store.is_admin("CAROL SMITH")
        assert [(v.pair_id, v.annotator, v.choice) for v in store.votes()] == [(1, "alice", "a")]
        assert [(a.name, a.role, a.votes) for a in store.annotators()] == [("alice", "annotator", 1),
                                                                           ("carol smith", "admin", 0)]
        with pytest.raises(ValueError, match=r"annotator name 'ali\\u200bce' is not acceptable: Names cannot hold"):
            store.record_vote(pair, f"ali{ZWSP}ce", "a", True)


def old_database(path, votes, annotators, demonstrations=()):
    """A database as the code before the names migration left it (schema version 4), holding these rows."""
    db = sqlite_utils.Database(path)
    for migration in MIGRATIONS[:4]:
        migration(db)
    db.conn.execute("PRAGMA user_version = 4")
    db["prompts"].insert_all([{"text": f"prompt {i}", "created_at": "t"} for i in (1, 2, 3)])
    db["policies"].insert({"round": 0, "path": "base", "created_at": "t"})
    for i in (1, 2, 3):
        db["generations"].insert_all([{"prompt_id": i, "policy_id": 1, "text": t, "n_tokens": 1,
                                       "finish_reason": "eos", "created_at": "t"} for t in ("a", "b")])
        db["pairs"].insert({"prompt_id": i, "gen_a": 2 * i - 1, "gen_b": 2 * i, "kind": "sample", "created_at": "t"})
    for pair_id, name, choice in votes:
        db.conn.execute("INSERT INTO votes (pair_id, annotator, choice, a_on_left, created_at) "
                        "VALUES (?, ?, ?, 1, 't')", (pair_id, name, choice))
    db["annotators"].insert_all([{"name": name, "role": role, "created_at": created}
                                 for name, role, created in annotators])
    for pair_id, name, text in demonstrations:
        db["demonstrations"].insert({"prompt_id": pair_id, "pair_id": pair_id, "annotator": name, "text": text,
                                     "created_at": "t"})
    db.conn.commit()
    db.conn.close()


def test_an_old_database_merges_spellings_and_keeps_clashing_ones_apart(tmp_path):
    path = tmp_path / "old.db"
    old_database(
        path,
        votes=[(1, "carol  smith", "a"), (2, "carol smith", "b"),  # two spaces: one person, different pairs
               (1, "alice", "a"), (1, "ALICE", "b"),  # both voted on pair 1: merging would double a vote
               (2, f"ali{ZWSP}ce", "tie"),  # a zero-width space: the same alice, another pair
               (1, f"{RLM}alice", "skip"), (3, f"{RLM}alice", "a"),  # a right-to-left mark, pair 1 again
               (3, "bob", "a")],
        annotators=[("carol  smith", "admin", "2024-01-02"), ("carol smith", "annotator", "2024-01-01"),
                    ("alice", "annotator", "2024-01-03"), ("ALICE", "admin", "2024-01-04"),
                    (f"ali{ZWSP}ce", "annotator", "2024-01-05"), (f"{RLM}alice", "annotator", "2024-01-06"),
                    ("bob", "annotator", "2024-01-07")],
        demonstrations=[(1, "carol  smith", "a better one")],
    )
    with Store(path) as store:
        assert store.schema_version() == len(MIGRATIONS)
        votes = [(v.pair_id, v.annotator, v.choice) for v in store.votes()]
        assert votes == [(1, "carol smith", "a"), (2, "carol smith", "b"), (1, "alice", "a"), (1, "ALICE", "b"),
                         (2, "alice", "tie"), (1, f"{RLM}alice", "skip"), (3, f"{RLM}alice", "a"), (3, "bob", "a")]
        assert [(a.name, a.role, a.created_at, a.votes) for a in store.annotators()] == [
            ("ALICE", "admin", "2024-01-04", 1), ("alice", "annotator", "2024-01-03", 2),
            ("bob", "annotator", "2024-01-07", 1), ("carol smith", "admin", "2024-01-01", 2),
            (f"{RLM}alice", "annotator", "2024-01-06", 2)]
        assert [(c.name, c.normalised, c.pairs) for c in store.name_clashes()] == [
            ("ALICE", "alice", (1,)), (f"{RLM}alice", "alice", (1,))]
        assert all(isinstance(c, NameClash) for c in store.name_clashes())
        assert store.demonstrations() == [("prompt 1", "a better one")]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT annotator FROM demonstrations").fetchall() == [("carol smith",)]
        assert conn.execute("SELECT id, n_votes FROM pairs ORDER BY id").fetchall() == [(1, 4), (2, 2), (3, 2)]  # untouched


def test_the_migration_leaves_a_database_of_clean_names_as_it_was(tmp_path):
    path = tmp_path / "clean.db"
    old_database(path, votes=[(1, "ann", "a"), (1, "bob", "b")],
                 annotators=[("ann", "admin", "t1"), ("bob", "annotator", "t2")])
    with Store(path) as store:
        assert [(v.annotator, v.choice) for v in store.votes()] == [("ann", "a"), ("bob", "b")]
        assert [(a.name, a.role) for a in store.annotators()] == [("ann", "admin"), ("bob", "annotator")]
        assert store.name_clashes() == []


# session tokens -----------------------------------------------------------------------------------------------------

class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_session_token_names_its_person_until_it_expires():
    clock = Clock()
    tokens = SessionTokens(b"k" * 32, lifetime_s=14 * 86400, clock=clock)
    token = tokens.issue("carol smith")
    assert tokens.verify(token) == ("carol smith", "")
    clock.now += 14 * 86400 - 1
    assert tokens.verify(token) == ("carol smith", "")
    clock.now += 1
    assert tokens.verify(token) == (None, "Your session ended (sessions last 14 days); sign in again.")


def test_a_forged_or_foreign_token_signs_nobody_in():
    tokens = SessionTokens(b"k" * 32)
    version, name, expiry, mac = tokens.issue("bob").split(".")
    ended = "Your session ended (the app's sign-in key changed); sign in again."
    forged_name = SessionTokens(b"x" * 32).issue("admin").split(".")[1]
    assert tokens.verify(f"{version}.{forged_name}.{expiry}.{mac}") == (None, ended)
    assert tokens.verify(f"{version}.{name}.{int(expiry) + 10**6}.{mac}") == (None, ended)  # a longer life
    assert tokens.verify(SessionTokens(b"x" * 32).issue("bob")) == (None, ended)  # another secret
    assert tokens.verify("garbage") == (None, ended) and tokens.verify("v1.%%%.1.2") == (None, ended)
    assert tokens.from_request(None) == (None, "")


def test_the_secret_lives_beside_the_database_with_mode_0600_and_survives_a_restart(tmp_path):
    first = SessionTokens.beside(tmp_path / "app.db")
    key = tmp_path / "app.db.session-key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    token = first.issue("alice")
    again = SessionTokens.beside(tmp_path / "app.db")  # a server restart
    assert again.cookie_name == first.cookie_name and again.verify(token) == ("alice", "")
    assert again.cookie(token) == f"{again.cookie_name}={token}; Max-Age=1209600; Path=/; SameSite=Strict"
    assert SessionTokens.beside(tmp_path / "other.db").cookie_name != first.cookie_name
    key.unlink()  # a new secret: every session ends
    assert SessionTokens.beside(tmp_path / "app.db").verify(token)[0] is None
