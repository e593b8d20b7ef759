"""What the pages need from the work that runs beside them: a batch of pairs being made and training rounds.

The app's objects live in `loop.children` (a thread watching a pair-making child process, a round runner starting
`app.py --train-round`); the pages only call these methods, so they import neither and tests hand them fakes.
"""

from __future__ import annotations

from typing import Protocol


class JobCounts(Protocol):
    """How far a batch of pairs is."""

    done: int
    """Pairs (prompts) done so far."""
    total: int
    """Pairs asked for."""


class PairJob(Protocol):
    """One batch of pairs at a time, made in the background."""

    def start(self, n_pairs: int, versus_share: float, started_by: str) -> tuple[bool, str]:
        """Start making `n_pairs` pairs, a share `versus_share` of them versus pairs; (started, message for the
        page)."""

    def running(self) -> bool:
        """Whether a batch is being made now."""

    def progress(self) -> JobCounts:
        """Where the batch is."""

    def status_text(self) -> str:
        """One line for the pages ("" when no batch was ever started)."""


class RoundStarter(Protocol):
    """Training rounds started from the app, one at a time, and automatically after every N new votes."""

    auto_every: int
    """Start a round after this many new votes (0: off)."""

    def start(self, started_by: str) -> tuple[bool, str]:
        """Start a round; (started, message for the page)."""

    def maybe_auto_start(self) -> bool:
        """Start a round when auto-start is on and enough new votes came in; True when one was started."""

    def set_auto_every(self, every: int) -> None:
        """Start a round automatically after `every` new votes; 0 turns it off."""

    def status_text(self) -> str:
        """One line for the Admin page."""

    def log_text(self) -> str:
        """The latest lines of the round's output."""
