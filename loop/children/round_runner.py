"""Training rounds started from the app: `python app.py --train-round` in a child process, its log kept for the page.

The round is the same command a cron job or a GPU box runs, so the app never trains in its own process: annotation
goes on while the round runs, and a crash of the round cannot take the app down, nor the app's end the round: the
child writes its output to a log file beside the database (which the runner reads as it grows) and runs in a session
of its own, so neither a closed pipe nor the Ctrl-C that stops the app reaches it. One round at a time: the runner
refuses while its own child runs or while another process holds the round lock (loop.round_lock).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Sequence

from annotate.records import Round
from annotate.store import Store
from loop.children.liveness import process_is_alive
from loop.round_lock import RoundLock

MAX_LOG_LINES = 2000
TAIL_POLL_S = 0.05
"""How often the runner looks for new output in the round's log file."""
LINE_END = re.compile(rb"\r\n|\r|\n")
"""What ends a line of the child's output: tqdm redraws its bar after a carriage return."""


def is_progress_bar(line: str) -> bool:
    """tqdm redraws its bar with carriage returns; each redraw arrives here as a line holding `%|`."""
    return "%|" in line


def bar_label(line: str) -> str:
    """The part of a tqdm line before its percentage: the same label means a redraw of the same bar."""
    return line.split("%|", 1)[0].rstrip("0123456789 ")


def new_round_log(db_path: str) -> Path:
    """A new empty file for a round's output: `<db>.round-<YYYYmmdd-HHMMSS>.log` beside the database (`-2`, `-3`...
    added for more rounds in the same second); a temporary file for an in-memory database."""
    if db_path == ":memory:":
        descriptor, name = tempfile.mkstemp(prefix="rlhf-loop-memory.round-", suffix=".log")
        os.close(descriptor)
        return Path(name)
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 1
    while True:
        path = Path(f"{db_path}.round-{stamp}{'' if n == 1 else f'-{n}'}.log")
        try:
            path.open("x").close()
            return path
        except FileExistsError:
            n += 1


def stale_round_test(store: Store) -> Callable[[int | None], bool]:
    """`Store.mark_stale_rounds_failed`'s test of whether a `running` round's process lives. With the round lock
    free no round runs, so none does, whatever process now has its pid (after a reboot, another one); held, or on an
    in-memory database (no lock file), the pid decides. The rows are read before the lock is probed, so that a round
    which takes the lock in between is not judged by the probe."""
    if store.memory:
        return process_is_alive
    seen = {r.pid for r in store.rounds() if r.status == "running"}
    if RoundLock(store.path).is_held():
        return process_is_alive
    return lambda pid: pid not in seen


class RoundRunner:
    """Starts rounds as child processes, one at a time, and keeps the latest lines of their output."""

    def __init__(self, store: Store, command: Sequence[str], cwd: str | Path | None = None,
                 auto_every: int = 0, max_log_lines: int = MAX_LOG_LINES):
        self.store = store
        self.command = list(command)
        self.cwd = str(cwd) if cwd is not None else None
        self.auto_every = max(0, int(auto_every))
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._log: deque[str] = deque(maxlen=max_log_lines)
        self.log_path: Path | None = None
        """The file the last round started from here writes its output to."""
        self._started_at: float | None = None
        self._started_by = ""
        # Votes (no skips) counted when the last round was started here; "every N new votes" counts from it. At
        # start-up the votes since the last finished round already count as new.
        self._votes_at_last_start = store.count_votes_since(None) - store.votes_since_last_round()

    def running(self) -> bool:
        """True while this runner's child process runs."""
        with self._lock:
            return self._process is not None and self._process.poll() is None

    def exit_code(self) -> int | None:
        """The last child's exit code once it ended; None while it runs or when none was started."""
        with self._lock:
            return None if self._process is None else self._process.poll()

    def set_auto_every(self, every: int) -> None:
        """Start a round automatically after `every` new votes; 0 turns it off."""
        if every < 0:
            raise ValueError(f"auto-start needs a number of votes of 0 (off) or more, not {every}")
        self.auto_every = int(every)

    def new_votes(self) -> int:
        """Votes (no skips) recorded since the last round started from here (or, before any, the last finished): what
        auto-start counts, so that a refused round (too few pairs) is not started again on the very next vote."""
        return self.store.count_votes_since(None) - self._votes_at_last_start

    def round_elsewhere(self) -> Round | None:
        """The store's `running` round when another process really runs it (stale_round_test), else None."""
        other = self.store.running_round()
        return other if other is not None and stale_round_test(self.store)(other.pid) else None

    def start(self, started_by: str) -> tuple[bool, str]:
        """Start a round; (started, message for the page)."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                return False, (f"A round is already running (started by {self._started_by}, "
                               f"process {self._process.pid}).")
            # A round whose process died (a crash, a reboot) would otherwise block every later start from here.
            self.store.mark_stale_rounds_failed(stale_round_test(self.store))
            other = self.store.running_round()
            if other is not None:
                return False, (f"Round {other.id} is already running (process {other.pid}, "
                               f"started {other.started_at}); one round at a time.")
            self._log.clear()
            self._log.append(f"$ {' '.join(self.command)}")
            try:
                log_path = new_round_log(self.store.path)
                process = self._spawn(log_path)
            except OSError as error:
                self._log.append(f"could not start the round: {error}")
                return False, f"Could not start the round: {error}"
            self._process, self.log_path = process, log_path
            self._started_at = time.monotonic()
            self._started_by = started_by
            self._votes_at_last_start = self.store.count_votes_since(None)
            self._reader = threading.Thread(target=self._read_output, args=(process, log_path), name="round-log",
                                            daemon=True)
            self._reader.start()
        return True, f"Round started by {started_by} (process {process.pid})."

    def _spawn(self, log_path: Path) -> subprocess.Popen:
        """The round's process: its output to `log_path`, no stdin, and a session of its own, so that it outlives the
        app (a Ctrl-C on the app's terminal goes to the app's process group, not to it)."""
        with open(log_path, "ab") as log:
            return subprocess.Popen(self.command, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                    start_new_session=True)

    def maybe_auto_start(self) -> bool:
        """Start a round when auto-start is on and enough new votes came in; True when one was started."""
        if self.auto_every <= 0 or self.running():
            return False
        if self.new_votes() < self.auto_every:
            return False
        started, _message = self.start(f"auto-start after {self.auto_every} new votes")
        return started

    def _read_output(self, process: subprocess.Popen, log_path: Path) -> None:
        """Follow the log file until the process ended and its last byte was read."""
        pending = b""
        with open(log_path, "rb") as log:
            while True:
                ended = process.poll() is not None
                chunk = log.read()
                if chunk:
                    *lines, pending = LINE_END.split(pending + chunk)
                    self._add_lines(lines)
                elif ended:
                    break
                else:
                    time.sleep(TAIL_POLL_S)
        self._add_lines([pending])
        if self.store.memory:
            log_path.unlink(missing_ok=True)  # a temporary file: nothing outlives an in-memory database
        code = process.wait()
        with self._lock:
            seconds = time.monotonic() - (self._started_at or time.monotonic())
            self._log.append(f"[round process exited with code {code} after {seconds:.0f} s]")

    def _add_lines(self, lines: Iterable[bytes]) -> None:
        with self._lock:
            for raw in lines:
                line = raw.decode("utf-8", errors="replace")
                if not line.strip():
                    continue
                # A redraw of the same progress bar replaces the previous line instead of flooding the log.
                if self._log and is_progress_bar(line) and is_progress_bar(self._log[-1]) \
                        and bar_label(line) == bar_label(self._log[-1]):
                    self._log[-1] = line
                else:
                    self._log.append(line)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the child and for its last line of output (tests, shutdown)."""
        with self._lock:
            process, reader = self._process, self._reader
        if process is None:
            return None
        code = process.wait(timeout)
        reader.join(timeout)
        return code

    def log_text(self) -> str:
        with self._lock:
            return "\n".join(self._log)

    def status_text(self) -> str:
        """One line for the admin page."""
        with self._lock:
            process, started_by, started_at = self._process, self._started_by, self._started_at
        # an in-memory database's log is a temporary file, removed once read: not worth naming
        log = "" if self.log_path is None or self.store.memory else f" (output in {self.log_path})"
        auto = f"auto-start every {self.auto_every} new votes" if self.auto_every else "auto-start off"
        if process is not None and process.poll() is None:
            return (f"A round is running (process {process.pid}, started by {started_by}, "
                    f"{time.monotonic() - (started_at or 0):.0f} s ago){log}. {auto}.")
        other = self.round_elsewhere()
        if other is not None:
            return f"Round {other.id} is running in another process ({other.pid}). {auto}."
        last = "" if process is None else f"Last round from here exited with code {process.poll()}{log}. "
        # Counted from the last *finished* round, whatever was started (and refused or failed) since.
        done = self.store.last_done_round()
        new = self.store.votes_since_last_round()
        since = f"{new} new votes since the last finished round (round {done.id})" if done else \
            f"{new} votes; no round has finished yet"
        still_needed = self.auto_every - self.new_votes()
        if self.auto_every and still_needed > 0:
            auto += f" (the next after {still_needed} more)"
        return f"No round running. {last}{since}; {auto}."
