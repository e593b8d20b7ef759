"""`python app.py --backup DIR` and `--restore DIR`: the database (--db) with every checkpoint folder it names, copied
into a new folder with a manifest (loop.backup), and put back at --db and round.checkpoints_dir (loop.restore)."""

from __future__ import annotations

import sys
from pathlib import Path

from commands.data import require_database
from commands.round import EXIT_BUSY
from loop.backup import BackupRefused, back_up
from loop.config import LoopConfig
from loop.restore import RestoreBusy, restore as restore_backup


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def backup(args, config: LoopConfig) -> int:
    """Back up --db into DIR while the app and rounds go on; print the summary. Exit 2: a DIR that exists and is not
    empty, no database at --db, or a write that failed (the partial DIR then has no manifest.json)."""
    db, directory = config.app.db, Path(args.backup)
    if db == ":memory:":
        return _fail("an in-memory database cannot be backed up: name the database file with --db PATH")
    require_database(db)
    try:
        result = back_up(db, directory, config.round.checkpoints_dir, log=_log)
    except BackupRefused as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"the backup into {directory} stopped: {error.strerror or error}. It is incomplete (it has no "
                     "manifest.json): remove it, fix the cause (free disk space?), and back up again")
    print(result.summary())
    return 0


def restore(args, config: LoopConfig) -> int:
    """Restore the backup in DIR to --db, its checkpoints under round.checkpoints_dir; print the summary. Exit 4 while
    the app or a round runs on --db; 2 for a refusal (no backup in DIR, a database at --db, checkpoint folders in the
    way), a copy that failed, or a restored database that names folders not there or fails its integrity check."""
    directory = Path(args.restore)
    try:
        result = restore_backup(directory, config.app.db, config.round.checkpoints_dir, log=_log)
    except RestoreBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BUSY
    except BackupRefused as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"the restore from {directory} stopped: {error.strerror or error}. Remove what it wrote (the "
                     f"folders listed above, and {config.app.db} if it is there), fix the cause, and restore again")
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    print(result.summary())
    if result.missing or result.integrity:
        problems = [*result.missing, *(f"integrity check: {line}" for line in result.integrity)]
        return _fail("the restored database is not whole:\n  " + "\n  ".join(problems))
    return 0
