"""The pair child and its parent: `app.py --generate-pairs N --progress-lines` prints what it does as lines, the app's
`ChildProcessPairGenerator` starts it and reads them back. Both ends of that protocol live here, so a line's format is
written once (`ChildLines` prints it, `read_line` parses it).

The lines, one a line on the child's stdout:
- `pairs-stage TEXT`: what the child does now ("loading the model", "generating");
- `pairs-progress DONE TOTAL`: prompts done (each gives at most one pair);
- `pairs-answers DONE PLANNED`: answers finished so far (a pair takes two);
- `pairs-step STEP MOST SECONDS_PER_STEP`: the batch being decoded is at token STEP of at most MOST, at that pace
  (printed about once a second);
- `pairs-written N`, its last: the pairs it stored.
Any other line is the child's log (kept for its error when it fails).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import deque
from typing import Callable

from loop.children.pair_job import JobReporter
from loop.pair_request import PairProgress

PROGRESS_PREFIX = "pairs-progress"
ANSWERS_PREFIX = "pairs-answers"
STEP_PREFIX = "pairs-step"
STAGE_PREFIX = "pairs-stage"
WRITTEN_PREFIX = "pairs-written"


class ChildLines(PairProgress):
    """The child's end: prints the protocol's lines (flushed at once, so the parent reads them as they come).

    `step` prints about once every `every_s` seconds the batch's token and its pace since the batch began, from which
    the app bounds the wait for the first pair before any answer has ended.
    """

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic, out=None):
        self.every_s, self.clock, self.out = every_s, clock, out
        self.batch_began = self.last_printed = None
        self.first_step = 1

    def _print(self, line: str) -> None:
        print(line, flush=True, file=self.out)

    def stage(self, text: str) -> None:
        self._print(f"{STAGE_PREFIX} {text}")

    def pairs(self, done: int, total: int, written: int = 0) -> None:
        self._print(f"{PROGRESS_PREFIX} {int(done)} {int(total)}")

    def answers(self, done: int, planned: int) -> None:
        self._print(f"{ANSWERS_PREFIX} {int(done)} {int(planned)}")

    def written(self, n_pairs: int) -> None:
        self._print(f"{WRITTEN_PREFIX} {int(n_pairs)}")

    def step(self, step: int, most: int) -> None:
        now = self.clock()
        if step == 1 or self.batch_began is None:  # a new batch
            self.batch_began, self.first_step = now, step
            return
        if self.last_printed is None or now - self.last_printed >= self.every_s:
            self.last_printed = now
            seconds_per_step = (now - self.batch_began) / max(step - self.first_step, 1)
            self._print(f"{STEP_PREFIX} {step} {most} {seconds_per_step:.4f}")


def read_line(line: str, reporter: JobReporter) -> int | str | None:
    """The parent's end: hand one line of the child to `reporter` (a plain progress(done, total) function will do: the
    other lines then go unreported). Returns the pairs written for the last line, the line itself when it is none of
    the protocol's (the child's log), and None otherwise."""
    words = line.split()
    stage, answers, steps = (getattr(reporter, name, None) for name in ("stage", "answers", "steps"))
    if len(words) == 3 and words[0] == PROGRESS_PREFIX:
        reporter(int(words[1]), int(words[2]))
    elif len(words) == 3 and words[0] == ANSWERS_PREFIX:
        if answers is not None:
            answers(int(words[1]), int(words[2]))
    elif len(words) == 4 and words[0] == STEP_PREFIX:
        if steps is not None:
            steps(int(words[1]), int(words[2]), float(words[3]))
    elif len(words) > 1 and words[0] == STAGE_PREFIX:
        if stage is not None:
            stage(line.split(None, 1)[1])
    elif len(words) == 2 and words[0] == WRITTEN_PREFIX:
        return int(words[1])
    elif line.strip():
        return line
    return None


class ChildProcessPairGenerator:
    """Makes pairs in a child process (`python app.py --generate-pairs N --progress-lines ...`), so the web server never
    loads a model: a crash or a memory spike in generation cannot take the annotators' server down, and votes are
    answered without waiting for a decoding step. Progress comes from the child's lines (`read_line`)."""

    def __init__(self, command: Callable[[int, float], list[str]], cwd: str | None = None, log_lines: int = 200):
        self.command = command
        """command(n_pairs, versus_share) -> the child's argv."""
        self.cwd = cwd
        self.log: deque[str] = deque(maxlen=log_lines)
        """The child's last lines of output (its error, when it fails)."""

    def generate(self, n_pairs: int, versus_share: float, progress: JobReporter) -> int:
        argv = self.command(n_pairs, versus_share)
        process = subprocess.Popen(argv, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        written = 0
        for raw in process.stdout:
            outcome = read_line(raw.rstrip("\n"), progress)
            if isinstance(outcome, int):
                written = outcome
            elif isinstance(outcome, str):
                self.log.append(outcome)
        code = process.wait()
        if code != 0:
            last = next((line for line in reversed(self.log) if "error" in line.lower() or ": " in line), "")
            raise RuntimeError(f"pair generation exited with code {code}{': ' + last if last else ''}")
        return written
