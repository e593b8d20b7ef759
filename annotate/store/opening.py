"""Why a database could not be opened, in words whoever chose the path can act on: `StoreOpenError` and the sentence
for each way SQLite (or creating the database's folder) fails when the Store opens and upgrades its file."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path


class StoreOpenError(ValueError):
    """The store could not open its database, or bring it to this code's schema; the message names the file and says
    what to do."""


def newer_schema(path: str, version: int, known: int) -> StoreOpenError:
    """A database a later rlhf-loop upgraded: this code would misread it, so nothing is written to it."""
    return StoreOpenError(f"{path} was written by a newer rlhf-loop (schema {version}; this one knows up to {known}): "
                          "upgrade rlhf-loop, or restore a backup made with this version")


def open_failure(path: str, error: sqlite3.Error | OSError) -> StoreOpenError:
    """The sentence for the error that opening `path` (creating its folder, connecting, WAL, the migrations) raised."""
    said = str(error) if isinstance(error, sqlite3.Error) else (error.strerror or str(error))
    said_lower = said.lower()
    if Path(path).is_dir():
        why = "it is a folder, not a database file: check --db"
    elif "not a database" in said_lower:
        why = "it is not an SQLite database (a text file?): check --db, which should name the .db file the app made"
    elif "malformed" in said_lower:
        why = ("it is damaged, perhaps cut short by a copy or a full disk: restore a backup, or name another "
               "database with --db")
    elif "full" in said_lower or "disk i/o" in said_lower or getattr(error, "errno", None) == errno.ENOSPC:
        why = "the disk is full or failing: free disk space, then try again"
    elif "readonly" in said_lower or isinstance(error, PermissionError) or not _writable(Path(path)):
        why = ("it cannot be written here (read-only, or no permission): rlhf-loop writes to its database, so give "
               "write permission on the file and its folder, or copy it somewhere writable and pass that with --db")
    elif "locked" in said_lower or "busy" in said_lower:
        why = "another program kept it locked too long: try again once it is done"
    else:
        why = "check --db, that its folder exists, and that you may write there"
    return StoreOpenError(f"cannot open the database {path} ({said}): {why}")


def _writable(path: Path) -> bool:
    """The file when it exists, else the nearest folder above it that exists, may be written by this process."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return os.access(path, os.W_OK)
