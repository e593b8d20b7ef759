"""One round at a time on a database, across processes: an exclusive lock file beside it that the OS frees when the
holding process dies."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from loop.checks import RoundRefused


class RoundBusy(RoundRefused):
    """Another round holds the lock."""


class RoundLock:
    """An exclusive lock file beside the database: one round at a time across processes, freed when a process dies."""

    def __init__(self, db_path: str | Path):
        self.path = Path(f"{db_path}.round.lock")
        self._file = None

    def acquire(self) -> "RoundLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RoundBusy(f"Another round is running on this database (lock {self.path}); "
                            "wait for it to finish: two rounds never run at once.") from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> "RoundLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
