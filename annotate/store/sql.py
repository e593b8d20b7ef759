"""The store's schema, migrations and queries: SQL text used only by the annotate/store package.

Migrations are numbered by their position in MIGRATIONS and recorded in `PRAGMA user_version`; an older database
file runs the ones it lacks, in order, inside one transaction, so it is upgraded in place and never rebuilt.
Never edit a shipped migration: append a new one.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Callable

import sqlite_utils

from annotate.identity import migrated_name

SCHEMA_V1 = [
    """CREATE TABLE prompts (
        id INTEGER PRIMARY KEY,
        text TEXT NOT NULL UNIQUE,
        source TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL)""",
    """CREATE TABLE policies (
        id INTEGER PRIMARY KEY,
        round INTEGER NOT NULL,
        path TEXT NOT NULL,
        parent_id INTEGER REFERENCES policies(id),
        created_at TEXT NOT NULL)""",
    """CREATE TABLE generations (
        id INTEGER PRIMARY KEY,
        prompt_id INTEGER NOT NULL REFERENCES prompts(id),
        policy_id INTEGER NOT NULL REFERENCES policies(id),
        text TEXT NOT NULL,
        n_tokens INTEGER NOT NULL,
        finish_reason TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    """CREATE TABLE pairs (
        id INTEGER PRIMARY KEY,
        prompt_id INTEGER NOT NULL REFERENCES prompts(id),
        gen_a INTEGER NOT NULL REFERENCES generations(id),
        gen_b INTEGER NOT NULL REFERENCES generations(id),
        kind TEXT NOT NULL CHECK (kind IN ('sample', 'versus')),
        created_at TEXT NOT NULL)""",
    """CREATE TABLE votes (
        id INTEGER PRIMARY KEY,
        pair_id INTEGER NOT NULL REFERENCES pairs(id),
        annotator TEXT NOT NULL,
        choice TEXT NOT NULL CHECK (choice IN ('a', 'b', 'tie', 'both_bad', 'skip')),
        a_on_left INTEGER NOT NULL,
        seconds REAL,
        created_at TEXT NOT NULL,
        UNIQUE (pair_id, annotator))""",
    """CREATE TABLE demonstrations (
        id INTEGER PRIMARY KEY,
        prompt_id INTEGER NOT NULL REFERENCES prompts(id),
        annotator TEXT NOT NULL,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    """CREATE TABLE rounds (
        id INTEGER PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
        started_at TEXT NOT NULL,
        finished_at TEXT,
        metrics TEXT NOT NULL DEFAULT '{}',
        error TEXT)""",
    """CREATE TABLE annotators (
        name TEXT PRIMARY KEY,
        role TEXT NOT NULL CHECK (role IN ('annotator', 'admin')),
        created_at TEXT NOT NULL)""",
    "CREATE INDEX generations_prompt ON generations (prompt_id)",
    "CREATE INDEX pairs_prompt ON pairs (prompt_id)",
    "CREATE INDEX votes_annotator ON votes (annotator)",
]


def migration_1_initial_schema(db: sqlite_utils.Database) -> None:
    for statement in SCHEMA_V1:
        db.conn.execute(statement)


def migration_2_round_pid(db: sqlite_utils.Database) -> None:
    """The process that runs a round, so that a crashed one can be told from a live one; votes by time."""
    db["rounds"].add_column("pid", int)
    db.conn.execute("CREATE INDEX votes_created_at ON votes (created_at)")


def migration_3_pair_vote_counts(db: sqlite_utils.Database) -> None:
    """Each pair's vote count, kept by triggers, so picking the next open pair never scans the finished ones."""
    db["pairs"].add_column("n_votes", int, not_null_default=0)
    db.conn.execute("UPDATE pairs SET n_votes = (SELECT COUNT(*) FROM votes WHERE votes.pair_id = pairs.id)")
    db.conn.execute(
        "CREATE TRIGGER votes_count_insert AFTER INSERT ON votes BEGIN "
        "UPDATE pairs SET n_votes = n_votes + 1 WHERE id = NEW.pair_id; END"
    )
    db.conn.execute(
        "CREATE TRIGGER votes_count_delete AFTER DELETE ON votes BEGIN "
        "UPDATE pairs SET n_votes = n_votes - 1 WHERE id = OLD.pair_id; END"
    )
    db.conn.execute("CREATE INDEX pairs_open ON pairs (n_votes, id)")


def migration_4_one_demonstration_per_pair(db: sqlite_utils.Database) -> None:
    """A better answer belongs to the pair it was written for: at most one per (pair, annotator), kept by a UNIQUE
    index so that parallel submits of one vote cannot store it twice.

    Older rows are linked to the pair of their writer's last vote on that prompt before writing (the app saved both
    in one request). A later copy for the same pair (parallel submits stored some twice), or a row with no such vote,
    keeps pair_id NULL: every row is kept, and NULLs never clash in a UNIQUE index.
    """
    db.conn.execute("ALTER TABLE demonstrations ADD COLUMN pair_id INTEGER REFERENCES pairs(id)")
    db.conn.execute("""
        UPDATE demonstrations SET pair_id = (
            SELECT v.pair_id FROM votes v JOIN pairs p ON p.id = v.pair_id
            WHERE v.annotator = demonstrations.annotator AND p.prompt_id = demonstrations.prompt_id
              AND v.created_at <= demonstrations.created_at
            ORDER BY v.created_at DESC, v.id DESC LIMIT 1)""")
    db.conn.execute("""
        UPDATE demonstrations SET pair_id = NULL
        WHERE id > (SELECT MIN(d.id) FROM demonstrations d
                    WHERE d.pair_id = demonstrations.pair_id AND d.annotator = demonstrations.annotator)""")
    db.conn.execute("CREATE UNIQUE INDEX demonstrations_pair_annotator ON demonstrations (pair_id, annotator)")


def _pairs_of(db: sqlite_utils.Database, name: str, demonstrations_have_pairs: bool) -> set[int]:
    pairs = {row[0] for row in db.conn.execute("SELECT pair_id FROM votes WHERE annotator = ?", (name,))}
    if demonstrations_have_pairs:
        pairs |= {row[0] for row in db.conn.execute(
            "SELECT pair_id FROM demonstrations WHERE annotator = ? AND pair_id IS NOT NULL", (name,))}
    return pairs


def _merge_names(db: sqlite_utils.Database, names: list[str], into: str) -> None:
    marks = ", ".join("?" for _ in names)
    roles = db.conn.execute(f"SELECT role, created_at FROM annotators WHERE name IN ({marks})", names).fetchall()
    for table in ("votes", "demonstrations"):
        db.conn.execute(f"UPDATE {table} SET annotator = ? WHERE annotator IN ({marks})", [into, *names])
    db.conn.execute(f"DELETE FROM annotators WHERE name IN ({marks})", names)
    if roles:
        role = "admin" if any(role == "admin" for role, _created in roles) else "annotator"
        db.conn.execute("INSERT INTO annotators (name, role, created_at) VALUES (?, ?, ?)",
                        (into, role, min(created for _role, created in roles)))


def migration_5_one_name_per_person(db: sqlite_utils.Database) -> None:
    """Names written before they were normalised (annotate.identity) merge into their normalised form: votes,
    better answers and roles move to it (an admin among the spellings makes the person admin).

    A spelling whose votes or better answers share a pair with one merged before it (the normalised spelling first,
    then the others in order) would give one person two votes on a pair: it is kept apart as it was and listed in
    name_clashes for an admin to settle. No vote is lost or changed. A name with nothing acceptable left once its
    invisible characters are dropped is kept as it is.
    """
    db.conn.execute("""CREATE TABLE name_clashes (
        name TEXT PRIMARY KEY,
        normalised TEXT NOT NULL,
        pairs TEXT NOT NULL,
        found_at TEXT NOT NULL)""")
    demonstrations_have_pairs = "pair_id" in db["demonstrations"].columns_dict
    spellings: dict[str, list[str]] = {}
    for (name,) in db.conn.execute("SELECT name FROM annotators UNION SELECT annotator FROM votes "
                                   "UNION SELECT annotator FROM demonstrations ORDER BY 1").fetchall():
        normalised = migrated_name(name)
        if normalised is not None:
            spellings.setdefault(normalised, []).append(name)
    for normalised, names in sorted(spellings.items()):
        if names == [normalised]:
            continue
        names.sort(key=lambda name: (name != normalised, name))
        merged, taken = [], set()
        for name in names:
            pairs = _pairs_of(db, name, demonstrations_have_pairs)
            if pairs & taken:
                db.conn.execute("INSERT INTO name_clashes (name, normalised, pairs, found_at) VALUES (?, ?, ?, ?)",
                                (name, normalised, json.dumps(sorted(pairs & taken)), now()))
            else:
                taken |= pairs
                merged.append(name)
        if merged != [normalised]:
            _merge_names(db, merged, normalised)


def migration_6_pair_chosen_by(db: sqlite_utils.Database) -> None:
    """How a sample pair's answers were picked: 'random' or 'uncertain' (for the reward model's disagreement), so
    held-out accuracy can be reported on random pairs alone. Older rows keep NULL (unknown), read as random."""
    db.conn.execute("ALTER TABLE pairs ADD COLUMN chosen_by TEXT CHECK (chosen_by IN ('random', 'uncertain'))")


def migration_7_vote_strength(db: sqlite_utils.Database) -> None:
    """How much better the chosen answer is, for an a/b vote: 1 slightly, 2 much (graded votes, as Llama 2 asked).
    Older votes, ties, both-bad and skips keep NULL, read as slightly better (the strength of an ungraded vote)."""
    db.conn.execute("ALTER TABLE votes ADD COLUMN strength INTEGER CHECK (strength IN (1, 2))")


def migration_8_round_reports(db: sqlite_utils.Database) -> None:
    """A round's report (annotate.round_report, as JSON): made once, at the end of the round or by `--report`, then
    read back by the Dashboard and `--report` without loading a model again. One a round: a new one replaces it."""
    db.conn.execute("""CREATE TABLE round_reports (
        round_id INTEGER PRIMARY KEY REFERENCES rounds(id),
        created_at TEXT NOT NULL,
        report TEXT NOT NULL)""")


def migration_9_policy_pruned_at(db: sqlite_utils.Database) -> None:
    """When a policy's folder was deleted to bound the disk (loop.retention, round.keep_policies): the row stays, since
    its answers, pairs and votes name it, but nothing loads it again. Older rows keep NULL: not pruned."""
    db.conn.execute("ALTER TABLE policies ADD COLUMN pruned_at TEXT")


def migration_10_policy_promotion(db: sqlite_utils.Database) -> None:
    """Promotion by evidence (loop.promotion): whether a policy became current (1) or stays a candidate (0), the
    decision's rule and numbers as JSON, and an admin's override ("promote" or "reject"). Older rows keep NULL: they
    were current when they were made, as every policy was then."""
    db.conn.execute("ALTER TABLE policies ADD COLUMN promoted INTEGER CHECK (promoted IN (0, 1))")
    db.conn.execute("ALTER TABLE policies ADD COLUMN promotion TEXT")
    db.conn.execute("ALTER TABLE policies ADD COLUMN promotion_override TEXT "
                    "CHECK (promotion_override IN ('promote', 'reject'))")


def migration_11_annotator_excluded(db: sqlite_utils.Database) -> None:
    """When an admin excluded an annotator: their votes stay, unused by preferences and versus tallies, until they are
    included again (NULL: included)."""
    db.conn.execute("ALTER TABLE annotators ADD COLUMN excluded_at TEXT")


def migration_12_pair_gold(db: sqlite_utils.Database) -> None:
    """A pair's right answer as an admin marked it (gold: "a" for gen_a, "b" for gen_b): mixed into every annotator's
    queue ([votes] gold_share) to measure each one's gold accuracy; its preference is the gold side, once."""
    db.conn.execute("ALTER TABLE pairs ADD COLUMN gold TEXT CHECK (gold IN ('a', 'b'))")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    migration_1_initial_schema,
    migration_2_round_pid,
    migration_3_pair_vote_counts,
    migration_4_one_demonstration_per_pair,
    migration_5_one_name_per_person,
    migration_6_pair_chosen_by,
    migration_7_vote_strength,
    migration_8_round_reports,
    migration_9_policy_pruned_at,
    migration_10_policy_promotion,
    migration_11_annotator_excluded,
    migration_12_pair_gold,
]

INSERT_PROMPT = "INSERT INTO prompts (text, source, created_at) VALUES (?, ?, ?) ON CONFLICT (text) DO NOTHING"
SELECT_PROMPTS = "SELECT id, text, source, created_at FROM prompts ORDER BY id LIMIT :limit"
SELECT_PROMPTS_NEEDING_PAIRS = """
    SELECT p.id, p.text, p.source, p.created_at FROM prompts p
    ORDER BY (SELECT COUNT(*) FROM pairs WHERE pairs.prompt_id = p.id), p.id LIMIT :limit"""

SELECT_LATEST_ANSWER_TEXTS = "SELECT text FROM generations ORDER BY id DESC LIMIT :limit"

SELECT_OPEN_PAIRS = """
    SELECT p.id, p.n_votes FROM pairs p
    WHERE p.n_votes < :overlap
      AND NOT EXISTS (SELECT 1 FROM votes v WHERE v.pair_id = p.id AND v.annotator = :annotator)
    ORDER BY p.id LIMIT :limit"""
SELECT_OPEN_GOLD = """
    SELECT p.id FROM pairs p
    WHERE p.gold IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM votes v WHERE v.pair_id = p.id AND v.annotator = :annotator)
    ORDER BY p.id LIMIT 1"""
SET_PAIR_GOLD = "UPDATE pairs SET gold = ? WHERE id = ?"
SELECT_GOLD_VOTES = """
    SELECT v.annotator, v.choice, p.gold FROM votes v JOIN pairs p ON p.id = v.pair_id
    WHERE p.gold IS NOT NULL AND v.choice IN ('a', 'b') ORDER BY v.id"""
SELECT_SHOWING = """
    SELECT p.id AS pair_id, p.prompt_id, pr.text AS prompt, ga.text AS text_a, gb.text AS text_b, p.kind
    FROM pairs p JOIN prompts pr ON pr.id = p.prompt_id
    JOIN generations ga ON ga.id = p.gen_a JOIN generations gb ON gb.id = p.gen_b
    WHERE p.id = ?"""
COUNT_WAITING_PAIRS = """
    SELECT COUNT(*) FROM pairs p
    WHERE p.n_votes < :overlap
      AND (:annotator IS NULL
           OR NOT EXISTS (SELECT 1 FROM votes v WHERE v.pair_id = p.id AND v.annotator = :annotator))"""

INSERT_ANNOTATOR = "INSERT INTO annotators (name, role, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING"
UPSERT_ANNOTATOR_ROLE = """
    INSERT INTO annotators (name, role, created_at) VALUES (?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET role = excluded.role"""
SELECT_NAME_CLASHES = "SELECT name, normalised, pairs, found_at FROM name_clashes ORDER BY normalised, name"
SELECT_ANNOTATORS = """
    SELECT a.name, a.role, a.created_at, (SELECT COUNT(*) FROM votes v WHERE v.annotator = a.name) AS votes,
           a.excluded_at
    FROM annotators a ORDER BY a.name"""
SET_ANNOTATOR_EXCLUDED = "UPDATE annotators SET excluded_at = ? WHERE name = ?"
COUNTED_VOTE = "v.annotator NOT IN (SELECT name FROM annotators WHERE excluded_at IS NOT NULL)"
"""A vote that counts: its annotator is not excluded (their votes stay in the database, unused)."""

INSERT_VOTE = """
    INSERT INTO votes (pair_id, annotator, choice, a_on_left, seconds, created_at, strength)
    VALUES (?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (pair_id, annotator) DO NOTHING"""
SELECT_VOTE_CHOICE = "SELECT choice, strength FROM votes WHERE pair_id = ? AND annotator = ?"
SELECT_VOTES = """
    SELECT id, pair_id, annotator, choice, a_on_left, seconds, created_at, strength FROM votes
    WHERE (:annotator IS NULL OR annotator = :annotator) AND (:pair_id IS NULL OR pair_id = :pair_id)
    ORDER BY id"""
COUNT_VOTES_SINCE = "SELECT COUNT(*) FROM votes WHERE created_at > :since AND (:skips OR choice != 'skip')"
COUNT_VOTES_BY_CHOICE = "SELECT choice, COUNT(*) AS n FROM votes GROUP BY choice"
COUNT_VOTES_BY_ANNOTATOR = "SELECT annotator, COUNT(*) AS n FROM votes GROUP BY annotator ORDER BY annotator"

# The pair's prompt is looked up here, so a better answer always belongs to the prompt of the pair voted on.
INSERT_PAIR_DEMONSTRATION = """
    INSERT INTO demonstrations (prompt_id, pair_id, annotator, text, created_at)
    SELECT prompt_id, id, :annotator, :text, :created_at FROM pairs WHERE id = :pair_id
    ON CONFLICT (pair_id, annotator) DO NOTHING"""
SELECT_DEMONSTRATIONS = """
    SELECT pr.text AS prompt, d.text AS response FROM demonstrations d JOIN prompts pr ON pr.id = d.prompt_id
    ORDER BY d.id"""

SELECT_PAIR_TALLIES = f"""
    SELECT p.id, p.kind, p.chosen_by, p.gold, pr.text AS prompt, ga.text AS text_a, gb.text AS text_b,
           SUM(v.choice = 'a') AS n_a, SUM(v.choice = 'b') AS n_b,
           SUM(CASE WHEN v.choice = 'a' THEN COALESCE(v.strength, 1) ELSE 0 END) AS strength_a,
           SUM(CASE WHEN v.choice = 'b' THEN COALESCE(v.strength, 1) ELSE 0 END) AS strength_b
    FROM pairs p JOIN prompts pr ON pr.id = p.prompt_id
    JOIN generations ga ON ga.id = p.gen_a JOIN generations gb ON gb.id = p.gen_b
    JOIN votes v ON v.pair_id = p.id
    WHERE {COUNTED_VOTE}
    GROUP BY p.id ORDER BY p.id"""
SELECT_AB_VOTE_TEXTS = """
    SELECT v.annotator, p.id AS pair_id, pr.text AS prompt,
           CASE WHEN v.choice = 'a' THEN ga.text ELSE gb.text END AS chosen,
           CASE WHEN v.choice = 'a' THEN gb.text ELSE ga.text END AS rejected
    FROM votes v JOIN pairs p ON p.id = v.pair_id JOIN prompts pr ON pr.id = p.prompt_id
    JOIN generations ga ON ga.id = p.gen_a JOIN generations gb ON gb.id = p.gen_b
    WHERE v.choice IN ('a', 'b') ORDER BY v.id"""
SELECT_VERSUS_TALLIES = f"""
    SELECT ga.policy_id AS policy_id, gb.policy_id AS opponent_id,
           SUM(v.choice = 'a') AS wins, SUM(v.choice = 'b') AS losses,
           SUM(v.choice = 'tie') AS ties, SUM(v.choice = 'both_bad') AS both_bad
    FROM pairs p JOIN generations ga ON ga.id = p.gen_a JOIN generations gb ON gb.id = p.gen_b
    JOIN votes v ON v.pair_id = p.id
    WHERE p.kind = 'versus' AND {COUNTED_VOTE}
    GROUP BY ga.policy_id, gb.policy_id ORDER BY ga.policy_id, gb.policy_id"""

SELECT_VERSUS_VOTES = f"""
    SELECT ga.policy_id AS policy_id, gb.policy_id AS opponent_id, v.annotator AS annotator, v.choice AS choice
    FROM pairs p JOIN generations ga ON ga.id = p.gen_a JOIN generations gb ON gb.id = p.gen_b
    JOIN votes v ON v.pair_id = p.id
    WHERE p.kind = 'versus' AND {COUNTED_VOTE}
    ORDER BY ga.policy_id, gb.policy_id, v.id"""

MARK_POLICY_PRUNED = "UPDATE policies SET pruned_at = ? WHERE id = ? AND pruned_at IS NULL"
SET_POLICY_PROMOTION = "UPDATE policies SET promoted = ?, promotion = ? WHERE id = ?"
SET_PROMOTION_OVERRIDE = "UPDATE policies SET promotion_override = ? WHERE id = ?"

UPSERT_ROUND_REPORT = """
    INSERT INTO round_reports (round_id, created_at, report) VALUES (?, ?, ?)
    ON CONFLICT (round_id) DO UPDATE SET created_at = excluded.created_at, report = excluded.report"""
SELECT_ROUND_REPORT = "SELECT report FROM round_reports WHERE round_id = ?"
SELECT_ROUND_REPORT_IDS = "SELECT round_id FROM round_reports ORDER BY round_id"


def now() -> str:
    """UTC timestamp with microseconds; the fixed format sorts as text in time order."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
