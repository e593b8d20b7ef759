"""Pair generation in the background, so pages stay responsive and annotation starts with the first pairs.

The app holds one `GenerationJob`; the first start and the admin's "generate now" both go through it, so one batch
runs at a time and the model is used by one thread only.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

PROGRESS_PREFIX = "pairs-progress"
"""A line `pairs-progress DONE TOTAL` of the generating child (commands.pairs, --progress-lines)."""
WRITTEN_PREFIX = "pairs-written"
"""Its last line, `pairs-written N`: the pairs it stored."""


class PairGenerator(Protocol):
    """What the app needs from a generator: tests pass a fake, `annotate.serve` wraps the real model."""

    def generate(self, n_pairs: int, versus_share: float, progress: Callable[[int, int], None]) -> int:
        """Write up to n_pairs new pairs to the store batch by batch, calling progress(done, total) as it goes (in
        any unit, e.g. prompts answered); returns the number of pairs written."""
        ...


@dataclass(frozen=True)
class JobProgress:
    """A snapshot of the job for the pages."""

    running: bool
    done: int
    total: int
    started_by: str
    error: str | None
    seconds: float


class GenerationJob:
    """Runs one generation batch at a time in a daemon thread and keeps its progress."""

    def __init__(self, generator: PairGenerator):
        self.generator = generator
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = 0
        self._total = 0
        self._started_by = ""
        self._error: str | None = None
        self._started_at = 0.0
        self._finished_at: float | None = None

    def start(self, n_pairs: int, versus_share: float, started_by: str) -> tuple[bool, str]:
        """Start generating; (started, message for the page)."""
        if n_pairs < 1:
            return False, f"Ask for at least one pair, not {n_pairs}."
        if not 0.0 <= versus_share <= 1.0:
            return False, f"The versus share must be between 0 and 1, not {versus_share}."
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False, f"Pairs are already being generated ({self._done}/{self._total}, by {self._started_by})."
            self._done, self._total, self._started_by, self._error = 0, n_pairs, started_by, None
            self._started_at, self._finished_at = time.monotonic(), None
            self._thread = threading.Thread(
                target=self._run, args=(n_pairs, versus_share), name="generate-pairs", daemon=True
            )
            self._thread.start()
        return True, f"Generating {n_pairs} pairs (versus share {versus_share:.0%})."

    def _progress(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = int(done), int(total)

    def _run(self, n_pairs: int, versus_share: float) -> None:
        try:
            done = self.generator.generate(n_pairs, versus_share, self._progress)
            with self._lock:
                self._done = int(done)
        except Exception as error:  # the thread has no caller to raise to: the page shows the error instead
            traceback.print_exc()
            with self._lock:
                self._error = f"{type(error).__name__}: {error}"
        finally:
            with self._lock:
                self._finished_at = time.monotonic()

    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def progress(self) -> JobProgress:
        with self._lock:
            end = self._finished_at if self._finished_at is not None else time.monotonic()
            running = self._thread is not None and self._thread.is_alive()
            return JobProgress(running, self._done, self._total, self._started_by, self._error,
                               end - self._started_at if self._thread else 0.0)

    def wait(self, timeout: float | None = None) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def status_text(self) -> str:
        """One line for the pages ("" when no batch was ever started)."""
        job = self.progress()
        if job.total == 0 and not job.running:
            return ""
        if job.running:
            return f"Generating pairs: {job.done}/{job.total} done ({job.seconds:.0f} s, started by {job.started_by})."
        if job.error:
            return f"Generating pairs failed after {job.done}/{job.total}: {job.error}"
        return f"Generated {job.done} pairs in {job.seconds:.0f} s."


class ChildProcessPairGenerator:
    """Makes pairs in a child process (`python app.py --generate-pairs N --progress-lines ...`), so the web server never
    loads a model: a crash or a memory spike in generation cannot take the annotators' server down, and votes are
    answered without waiting for a decoding step. Progress comes from the child's `pairs-progress DONE TOTAL` lines."""

    def __init__(self, command: Callable[[int, float], list[str]], cwd: str | None = None, log_lines: int = 200):
        self.command = command
        """command(n_pairs, versus_share) -> the child's argv."""
        self.cwd = cwd
        self.log: deque[str] = deque(maxlen=log_lines)
        """The child's last lines of output (its error, when it fails)."""

    def generate(self, n_pairs: int, versus_share: float, progress: Callable[[int, int], None]) -> int:
        argv = self.command(n_pairs, versus_share)
        process = subprocess.Popen(argv, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        written = 0
        for raw in process.stdout:
            line = raw.rstrip("\n")
            words = line.split()
            if len(words) == 3 and words[0] == PROGRESS_PREFIX:
                progress(int(words[1]), int(words[2]))
            elif len(words) == 2 and words[0] == WRITTEN_PREFIX:
                written = int(words[1])
            elif line.strip():
                self.log.append(line)
        code = process.wait()
        if code != 0:
            last = next((line for line in reversed(self.log) if "error" in line.lower() or ": " in line), "")
            raise RuntimeError(f"pair generation exited with code {code}{': ' + last if last else ''}")
        return written
