"""One round at a time on a database, across processes: a lock file beside it (loop.file_lock) that the OS frees when
the holding process dies."""

from __future__ import annotations

from pathlib import Path

from loop.checks import RoundRefused
from loop.file_lock import FileLock, LockHeld


class RoundBusy(RoundRefused):
    """Another round holds the lock."""


class RoundLock(FileLock):
    """`<db>.round.lock`, holding the pid of the process that runs the round: held for the whole of a round. Free, it
    means no round runs on the database, whatever the store's `running` rows say."""

    def __init__(self, db_path: str | Path):
        super().__init__(f"{db_path}.round.lock")

    def acquire(self, holder: str | None = None) -> "RoundLock":
        try:
            super().acquire(holder)
        except LockHeld:
            raise RoundBusy(f"Another round is running on this database (lock {self.path}); "
                            "wait for it to finish: two rounds never run at once.") from None
        return self
