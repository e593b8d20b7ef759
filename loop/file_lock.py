"""One writer at a time across processes: an exclusive lock file (fcntl.flock) that the OS frees when the holding
process dies, holding a line that says who holds it. Rounds (loop.round_lock) and the annotation app (loop.app_server)
each take one beside the database."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(Exception):
    """Another process (or another handle of this one) holds the lock file."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder or 'another process'}")
        self.path = path
        self.holder = holder
        """What the holder wrote into the file ("" when it was still writing)."""


class FileLock:
    """An exclusive lock on the file `path`, taken without waiting; the file stays, the lock goes with the process."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = None

    def acquire(self, holder: str | None = None) -> "FileLock":
        """Take the lock and write `holder` (default: this process's id) into the file; LockHeld when it is taken."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise LockHeld(self.path, self.holder()) from None
        handle.truncate(0)
        handle.write(str(os.getpid()) if holder is None else holder)
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def is_held(self) -> bool:
        """Whether some process holds the lock now (this object's own hold counts): tried on a separate handle and
        let go at once. A missing file is a free lock, and the probe creates nothing."""
        try:
            handle = open(self.path)
        except FileNotFoundError:
            return False
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False

    def holder(self) -> str:
        """What the holder wrote into the file ("" for none, or a file not there)."""
        try:
            return self.path.read_text(encoding="utf-8").strip()
        except OSError:
            return ""

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class AppLock(FileLock):
    """`<db>.app.lock`: held by the annotation app while it serves the database (loop.app_server), holding its pid
    and port as JSON; rounds hold their own (loop.round_lock.RoundLock)."""

    def __init__(self, db_path: str | Path):
        super().__init__(f"{db_path}.app.lock")
