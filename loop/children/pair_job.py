"""Pair generation in the background, so pages stay responsive and annotation starts with the first pairs.

The app holds one `GenerationJob`; the first start and the admin's "generate now" both go through it, so one batch
runs at a time. Its generator is a child process in the app (`loop.children.pair_child`) and a fake in tests.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Protocol

class JobReporter(Protocol):
    """What a generator reports to: progress(done, total) counts pairs (prompts done); stage and answers say more."""

    def __call__(self, done: int, total: int) -> None: ...

    def stage(self, text: str) -> None:
        """What the generator does now, for the pages ("loading the model", "generating")."""

    def answers(self, done: int, planned: int) -> None:
        """Answers finished so far: they move long before the first pair is complete."""

    def steps(self, step: int, most: int, seconds_per_step: float) -> None:
        """The batch being decoded is at token `step` of at most `most`: it ends, with its pairs, within
        (most - step) * seconds_per_step."""


class PairGenerator(Protocol):
    """What the app needs from a generator: tests pass a fake, the app a child process (pair_child)."""

    def generate(self, n_pairs: int, versus_share: float, progress: JobReporter) -> int:
        """Write up to n_pairs new pairs to the store pair by pair, calling progress(done, total) as it goes (in
        any unit, e.g. prompts answered) and, where it knows them, progress.stage(text) and
        progress.answers(done, planned); returns the number of pairs written."""
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
    stage: str = ""
    """What the generator said it does now ("" before it said anything)."""
    answers_done: int = 0
    answers_planned: int = 0
    seconds_left: float | None = None
    """Estimated from the rate of answers (else pairs) since generation began; None before the first one."""
    step: tuple[int, int] | None = None
    """(token, at most) of the batch being decoded, when the generator says."""
    batch_ends_within: float | None = None
    """Seconds until the batch being decoded ends at the latest (every answer stops at max_new_tokens)."""


def duration_text(seconds: float) -> str:
    """"40 s", "3 min": a duration as people read it."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class _Reporter:
    """The JobReporter a GenerationJob hands its generator."""

    def __init__(self, job: GenerationJob):
        self.job = job

    def __call__(self, done: int, total: int) -> None:
        self.job._progress(done, total)

    def stage(self, text: str) -> None:
        self.job._stage_changed(text)

    def answers(self, done: int, planned: int) -> None:
        self.job._answers_changed(done, planned)

    def steps(self, step: int, most: int, seconds_per_step: float) -> None:
        self.job._step_changed(step, most, seconds_per_step)


class GenerationJob:
    """Runs one generation batch at a time in a daemon thread and keeps its progress."""

    def __init__(self, generator: PairGenerator, clock: Callable[[], float] = time.monotonic):
        self.generator = generator
        self.clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = 0
        self._total = 0
        self._started_by = ""
        self._error: str | None = None
        self._started_at = 0.0
        self._finished_at: float | None = None
        self._stage = ""
        self._answers = (0, 0)
        self._generating_since: float | None = None
        self._step: tuple[int, int, float, float] | None = None  # step, most, seconds per step, when said
        self._estimate: tuple[float, float] | None = None  # seconds left at the last count, when counted

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
            self._started_at, self._finished_at = self.clock(), None
            self._stage, self._answers, self._generating_since, self._step = "starting", (0, 0), None, None
            self._estimate = None
            self._thread = threading.Thread(
                target=self._run, args=(n_pairs, versus_share), name="generate-pairs", daemon=True
            )
            self._thread.start()
        return True, f"Generating {n_pairs} pairs (versus share {versus_share:.0%})."

    def _progress(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = int(done), int(total)
            self._generating()
            self._counted()

    def _answers_changed(self, done: int, planned: int) -> None:
        with self._lock:
            self._answers = (int(done), int(planned))
            self._generating()
            self._counted()

    def _step_changed(self, step: int, most: int, seconds_per_step: float) -> None:
        with self._lock:
            self._step = (int(step), int(most), float(seconds_per_step), self.clock())
            self._generating()

    def _stage_changed(self, text: str) -> None:
        with self._lock:
            self._stage = text.strip()
            if self._stage.startswith("generating"):
                self._generating()

    def _generating(self) -> None:
        """(under the lock) Answers are being written: the estimate's clock starts now, or at the start for a generator
        that said nothing before its first count."""
        if self._generating_since is None:
            self._generating_since = self.clock() if self._stage != "starting" else self._started_at
            self._stage = "generating"

    def _run(self, n_pairs: int, versus_share: float) -> None:
        try:
            done = self.generator.generate(n_pairs, versus_share, _Reporter(self))
            with self._lock:
                self._done = int(done)
        except Exception as error:  # the thread has no caller to raise to: the page shows the error instead
            traceback.print_exc()
            with self._lock:
                self._error = f"{type(error).__name__}: {error}"
        finally:
            with self._lock:
                self._finished_at = self.clock()

    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def progress(self) -> JobProgress:
        with self._lock:
            now = self.clock()
            end = self._finished_at if self._finished_at is not None else now
            running = self._thread is not None and self._thread.is_alive()
            step = ends = None
            if running and self._step is not None:
                token, most, seconds_per_step, said = self._step
                step, ends = (token, most), max(0.0, (most - token) * seconds_per_step - (now - said))
            return JobProgress(running, self._done, self._total, self._started_by, self._error,
                               end - self._started_at if self._thread else 0.0, self._stage, *self._answers,
                               self._seconds_left(now) if running else None, step, ends)

    def _rate_estimate(self, now: float) -> float | None:
        """(under the lock) Time left at the rate of answers (else pairs) since generation began."""
        done, planned = self._answers if self._answers[1] else (self._done, self._total)
        if self._generating_since is None or done <= 0 or planned <= 0:
            return None
        return max(0.0, (now - self._generating_since) / done * (planned - done))

    def _counted(self) -> None:
        """(under the lock) A new count: the estimate is taken now and counts down until the next one."""
        now = self.clock()
        estimate = self._rate_estimate(now)
        self._estimate = None if estimate is None else (estimate, now)

    def _seconds_left(self, now: float) -> float | None:
        """(under the lock) The estimate of the last count, counted down; once that has run out with work left, the
        rate estimate as of now (which grows while nothing new ends)."""
        if self._estimate is None:
            return None
        estimate, at = self._estimate
        left = estimate - (now - at)
        return left if left > 0 or estimate == 0 else self._rate_estimate(now)

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
            return f"{self._running_text(job)} (started by {job.started_by})."
        if job.error:
            return f"Generating pairs failed after {job.done}/{job.total}: {job.error}"
        return f"Generated {job.done} pairs in {job.seconds:.0f} s."

    @staticmethod
    def _running_text(job: JobProgress) -> str:
        if job.stage != "generating":  # starting the process, loading or converting the model
            return f"Preparing {job.total} pairs: {job.stage or 'starting'}, {duration_text(job.seconds)} so far"
        answers = f", {job.answers_done}/{job.answers_planned} answers" if job.answers_planned else ""
        if job.done == 0 and job.step is not None and job.batch_ends_within is not None:
            # Before the first pair the rate of answers says little; the batch's pace bounds the wait instead.
            return (f"Generating pairs: 0/{job.total} ready{answers}, writing the first answers (token {job.step[0]} "
                    f"of at most {job.step[1]}): the first pairs within {duration_text(job.batch_ends_within)}")
        if job.seconds_left is None:
            return (f"Generating pairs: {job.done}/{job.total} ready{answers}, writing the first answers, "
                    f"{duration_text(job.seconds)} so far")
        if job.seconds_left == 0:
            return f"Generating pairs: {job.done}/{job.total} ready{answers}, finishing"
        return f"Generating pairs: {job.done}/{job.total} ready{answers}, about {duration_text(job.seconds_left)} left"
