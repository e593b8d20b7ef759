"""The database's side of `--backup` and `--restore` (loop.backup copies the folders): SQLite's online backup of the
file, what a copy names read without upgrading it, its integrity check, and the one rewrite a restore makes.

The functions work on a file by its name, never through a Store, which would upgrade an older file in place: a backup
is taken as the database is (README: "take a backup before upgrading"). `BackupRecords.rewrite_paths`, mixed into
Store, is the restore's change: the folders the database names, moved to where the restore put them.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

from annotate.records import Policy, Round
from annotate.store.opening import open_failure

BUSY_WAIT_S = 30.0
"""How long the backup waits for a writer holding the database (a checkpoint of its WAL, a migration)."""


def copy_database(source: str | Path, target: str | Path) -> int:
    """Copy the database `source` into the new file `target` with SQLite's online backup API, in one step: a
    consistent snapshot of its last commit, taken while the app and a round go on writing (in WAL mode a reader
    blocks no writer). `target` is left as one file (journal mode DELETE, no -wal beside it); returns its schema
    version (PRAGMA user_version). StoreOpenError, in words, when `source` is missing, damaged or no database."""
    try:
        source_conn = sqlite3.connect(f"{Path(source).resolve().as_uri()}?mode=rw", uri=True, timeout=BUSY_WAIT_S)
    except sqlite3.Error as error:
        raise open_failure(str(source), error) from error
    try:
        target_conn = sqlite3.connect(target)
        try:
            source_conn.backup(target_conn)
            target_conn.execute("PRAGMA journal_mode = DELETE")
            return target_conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            target_conn.close()
    except sqlite3.DatabaseError as error:
        raise open_failure(str(source), error) from error
    finally:
        source_conn.close()


def _record(cls, row: sqlite3.Row, **values):
    """A record of `cls` from a row of any schema version: its fields the row has (a field it lacks takes None)."""
    names = row.keys()
    return cls(**{**{f.name: row[f.name] if f.name in names else None for f in dataclasses.fields(cls)}, **values})


def named_rows(path: str | Path) -> tuple[list[Policy], list[Round]]:
    """The policies and rounds of the database file `path`, read as it is (not upgraded): what names folders."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        policies = [_record(Policy, row) for row in conn.execute("SELECT * FROM policies ORDER BY id")]
        rounds = [_record(Round, row, metrics=json.loads(row["metrics"] or "{}"))
                  for row in conn.execute("SELECT * FROM rounds ORDER BY id")]
    finally:
        conn.close()
    return policies, rounds


def integrity_problems(path: str | Path) -> list[str]:
    """What `PRAGMA integrity_check` finds wrong in the database file `path`: [] when it answers "ok"."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=rw", uri=True, timeout=BUSY_WAIT_S)
    try:
        lines = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()
    return [] if lines == ["ok"] else lines


class BackupRecords:
    """The restore's one change to a database: the folders it names, moved. Mixed into Store (core.py)."""

    def rewrite_paths(self, moved: dict[str, str]) -> int:
        """Replace each folder name that `moved` maps (old -> new, exactly as recorded) in policies.path and in the
        top-level string values of every round's metrics (round/reward_model_path, round/policy_path, ...), all at
        once (a new name that is also an old one is not moved again) in one transaction; returns how many rows
        changed. Names not in `moved` stay as they are."""
        changed = 0
        with self._write() as db:
            for policy_id, path in db.conn.execute("SELECT id, path FROM policies").fetchall():
                if path in moved:
                    db.conn.execute("UPDATE policies SET path = ? WHERE id = ?", (moved[path], policy_id))
                    changed += 1
            for round_id, text in db.conn.execute("SELECT id, metrics FROM rounds").fetchall():
                metrics = json.loads(text or "{}")
                rewritten = {key: moved.get(value, value) if isinstance(value, str) else value
                             for key, value in metrics.items()}
                if rewritten != metrics:
                    db.conn.execute("UPDATE rounds SET metrics = ? WHERE id = ?", (json.dumps(rewritten), round_id))
                    changed += 1
        return changed
