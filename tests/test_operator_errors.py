"""An operator's mistake is a sentence and exit 2, never a traceback: a --db that is no database (a text file, a
folder, a damaged or newer one), one that cannot be written (read-only, a full disk), a mistyped --db for a command
that needs what is stored, an --export or --report --out that cannot be written; and a vote the database could not
store is said on the page, with the pair still there to vote on again."""

import os
import sqlite3
from contextlib import closing

import pytest

import app
from annotate.records import NewGeneration, NewPair
from annotate.store import Store, StoreOpenError
from annotate.store.sql import MIGRATIONS
from annotate.ui_annotate import AnnotateHandlers
from annotate.ui_session import AppConfig, Session
from loop.children.pair_job import GenerationJob
from test_ui import FakeGenerator, idle_runner, seed_pairs

NOT_AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions; the case is "
                                                         "covered by a stand-in SQLite error below")


def seeded_db(path):
    """A database with a few prompts and one voted pair: what a team's database looks like."""
    with Store(path) as store:
        store.add_prompts([f"Question {i}: " + "about tea " * 40 for i in range(200)])
        policy = store.add_policy(0, "base")
        prompt = store.prompts()[0]
        [pair_id] = store.add_pairs_bulk([NewPair(prompt.id, NewGeneration(policy, "hi", 1, "stop"),
                                                  NewGeneration(policy, "go away", 2, "stop"), "sample")])
        store.record_vote(pair_id, "ann", "a", a_on_left=True)
    return path


def refused(argv, capsys) -> str:
    """Run app.py with argv; it must exit 2 with one line on stderr, which is returned."""
    assert app.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# --db that is not a database ------------------------------------------------------------------------------------

def test_a_text_file_as_the_database_is_refused_in_words(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n", encoding="utf-8")
    err = refused(["--export", str(tmp_path / "prefs.jsonl"), "--db", str(notes)], capsys)
    assert f"cannot open the database {notes}" in err and "not an SQLite database" in err and "--db" in err
    assert notes.read_text(encoding="utf-8") == "my notes\n"


def test_a_folder_as_the_database_is_refused_in_words(tmp_path, capsys):
    err = refused(["--simulate", "longer", "--db", str(tmp_path)], capsys)
    assert f"{tmp_path}" in err and "it is a folder, not a database file" in err


def test_a_truncated_database_is_refused_as_damaged(tmp_path, capsys):
    db = seeded_db(tmp_path / "loop.db")
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    err = refused(["--export", str(tmp_path / "prefs.jsonl"), "--db", str(db)], capsys)
    assert f"cannot open the database {db}" in err and "damaged" in err and "restore a backup" in err


def test_a_database_newer_than_the_code_says_to_upgrade_and_is_left_alone(tmp_path, capsys):
    db = seeded_db(tmp_path / "x.db")
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 99")
    err = refused(["--export", str(tmp_path / "prefs.jsonl"), "--db", str(db)], capsys)
    known = len(MIGRATIONS)
    assert err == (f"app.py: {db} was written by a newer rlhf-loop (schema 99; this one knows up to {known}): upgrade "
                   "rlhf-loop, or restore a backup made with this version\n")
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 99
    with pytest.raises(StoreOpenError, match="written by a newer rlhf-loop"):
        Store(db)


# --db that cannot be written -------------------------------------------------------------------------------------

@NOT_AS_ROOT
def test_a_database_in_a_read_only_folder_is_refused_in_words(tmp_path, capsys):
    folder, prompts = tmp_path / "ro", tmp_path / "p.txt"
    folder.mkdir()
    prompts.write_text("one\n", encoding="utf-8")
    folder.chmod(0o555)
    try:
        err = refused(["--import-prompts", str(prompts), "--db", str(folder / "x.db")], capsys)
    finally:
        folder.chmod(0o755)
    assert f"cannot open the database {folder / 'x.db'}" in err and "cannot be written here" in err


@NOT_AS_ROOT
def test_a_read_only_database_file_is_refused_in_words(tmp_path, capsys):
    db = seeded_db(tmp_path / "x.db")
    db.chmod(0o444)
    try:
        err = refused(["--simulate", "longer", "--db", str(db)], capsys)
    finally:
        db.chmod(0o644)
    assert f"cannot open the database {db}" in err and "cannot be written here" in err


@pytest.mark.parametrize("said, why", [
    ("attempt to write a readonly database", "cannot be written here"),
    ("unable to open database file", "that you may write there"),
    ("database or disk is full", "free disk space"),
    ("disk I/O error", "free disk space"),
])
def test_sqlites_errors_on_opening_are_said_with_the_database_and_what_to_do(tmp_path, capsys, monkeypatch, said,
                                                                              why):
    db = seeded_db(tmp_path / "x.db")

    def fails(self):
        raise sqlite3.OperationalError(said)

    monkeypatch.setattr(Store, "_migrate", fails)
    err = refused(["--export", str(tmp_path / "prefs.jsonl"), "--db", str(db)], capsys)
    assert err.startswith(f"app.py: cannot open the database {db} ({said}): ") and why in err


# a mistyped --db ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["--export", "{dir}/prefs.jsonl"],
    ["--simulate", "longer"],
    ["--generate-pairs", "2"],
    ["--train-round", "--model", "org/not-here-model"],
    ["--sft"],
])
def test_a_command_that_needs_stored_data_refuses_a_database_that_does_not_exist(tmp_path, capsys, command):
    db = tmp_path / "data" / "rlhf-loop2.db"
    err = refused([arg.format(dir=tmp_path) for arg in command] + ["--db", str(db)], capsys)
    assert err == (f"app.py: {db} does not exist: check --db, or create it by starting the app (python app.py) or "
                   "with python app.py --import-prompts FILE\n")
    assert not db.parent.exists()  # nothing was made of the mistyped path


def test_importing_prompts_still_starts_a_new_database(tmp_path, capsys):
    prompts, db = tmp_path / "p.txt", tmp_path / "new" / "loop.db"
    prompts.write_text("one\ntwo\n", encoding="utf-8")
    assert app.main(["--import-prompts", str(prompts), "--db", str(db)]) == 0
    assert Store(db).count_prompts() == 2


# files that cannot be written ------------------------------------------------------------------------------------

def test_export_to_a_missing_folder_names_it(tmp_path, capsys):
    db = seeded_db(tmp_path / "x.db")
    err = refused(["--export", str(tmp_path / "nowhere" / "prefs.jsonl"), "--db", str(db)], capsys)
    assert err == f"error: cannot write prefs.jsonl: folder {tmp_path / 'nowhere'} does not exist\n"
    err = refused(["--export", str(db / "prefs.jsonl"), "--db", str(db)], capsys)
    assert err == f"error: cannot write prefs.jsonl: {db} is a file, not a folder\n"


@NOT_AS_ROOT
def test_export_to_a_read_only_folder_says_permission_denied(tmp_path, capsys):
    db, folder = seeded_db(tmp_path / "x.db"), tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        err = refused(["--export", str(folder / "prefs.jsonl"), "--db", str(db)], capsys)
    finally:
        folder.chmod(0o755)
    assert err == f"error: cannot write prefs.jsonl in {folder}: permission denied\n"


def test_export_that_the_system_refuses_says_why(tmp_path, capsys, monkeypatch):
    db = seeded_db(tmp_path / "x.db")

    def denied(self, path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Store, "export_jsonl", denied)
    err = refused(["--export", str(tmp_path / "prefs.jsonl"), "--db", str(db)], capsys)
    assert err == f"error: cannot write prefs.jsonl in {tmp_path}: permission denied\n"


def test_report_to_an_out_path_under_a_file_says_so(tmp_path, capsys, monkeypatch):
    import commands.report
    import loop.report

    db = seeded_db(tmp_path / "x.db")
    blocker = tmp_path / "afile"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setattr(commands.report, "kept_or_made_report", lambda store, round_id, config, log: "kept")
    monkeypatch.setattr(loop.report, "report_html", lambda report: "<html></html>")
    err = refused(["--report", "1", "--db", str(db), "--out", str(blocker / "report.html")], capsys)
    assert err == (f"error: cannot write report.html: {blocker} is a file, not a folder (the report is kept in {db}: "
                   "run --report again with another --out)\n")


# a vote the database cannot store --------------------------------------------------------------------------------

def test_a_vote_the_database_cannot_store_is_said_and_the_pair_stays(monkeypatch):
    with Store(":memory:") as store:
        seed_pairs(store, 2)
        handlers = AnnotateHandlers(store, AppConfig(), GenerationJob(FakeGenerator(store)), idle_runner(store))
        session, view, _ = handlers.sign_in("alice", Session())
        shown = session.showing

        def disk_full(*args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(store, "submit_vote", disk_full)
        session, view = handlers.vote("left", shown.pair_id, "A better answer.", session)
        assert "Your vote could not be saved" in view.status and "it was not counted" in view.status
        assert "disk is full" in view.status and "tell your admin" in view.status
        assert session.showing == shown and view.pair_id == shown.pair_id  # not moved on: the same pair to vote on
        assert not view.recorded and not view.earlier_vote_stands  # so the page keeps the better answer in its box
        monkeypatch.undo()
        assert store.votes() == []
        session, view = handlers.vote("left", shown.pair_id, "A better answer.", session)  # once the disk has room
        assert view.recorded and [vote.pair_id for vote in store.votes()] == [shown.pair_id]
