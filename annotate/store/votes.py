"""Votes and the better answers (demonstrations) written with them: one of each at most per (pair, annotator).

Mixed into `Store` (annotate/store/core.py), whose `_write` / `_rows` / `_scalar` transactions, name check and pair
reservations these methods use.
"""

from __future__ import annotations

from dataclasses import replace

import sqlite_utils

from annotate.records import CHOICES, STRENGTHS, Vote, VoteOutcome
from annotate.store import sql as queries
from annotate.store.sql import now
from annotate.text_limits import MAX_ANSWER_CHARS, answer_problem


class VoteRecords:
    """Votes about a pair's gen_a / gen_b, and demonstrations; the first vote of a person on a pair stands."""

    def record_vote(
        self, pair_id: int, annotator: str, choice: str, a_on_left: bool, seconds: float | None = None,
        strength: int | None = None,
    ) -> bool:
        """Record a vote about gen_a/gen_b; True when a new row was written.

        A repeated submit for the same pair and annotator writes nothing and returns False (the first vote stands).
        """
        return self.submit_vote(pair_id, annotator, choice, a_on_left, seconds, strength=strength).recorded

    def submit_vote(self, pair_id: int, annotator: str, choice: str, a_on_left: bool, seconds: float | None = None,
                    better_answer: str | None = None, strength: int | None = None,
                    max_answer_chars: int = MAX_ANSWER_CHARS) -> VoteOutcome:
        """Record a vote and the better answer written with it, in one transaction: both land or neither.

        The first vote of an annotator on a pair stands: a repeat (a double click, a retried request, a second tab)
        writes nothing, not even its better answer, and the outcome carries the choice that stands. UNIQUE keys on
        votes and demonstrations keep this true under parallel calls from threads and processes. `strength` grades an
        a/b vote: 1 slightly, 2 much better (STRENGTHS); None leaves it ungraded. A better answer over
        `max_answer_chars` characters or holding control characters raises ValueError, and nothing is written.
        """
        annotator = self._checked_name(annotator)
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {', '.join(CHOICES)}, not {choice!r}")
        if strength is not None and (choice not in ("a", "b") or strength not in STRENGTHS):
            raise ValueError(f"strength is 1 (slightly) or 2 (much better) for an a or b vote, not {strength!r} "
                             f"for {choice!r}")
        if problem := answer_problem(better_answer or "", max_answer_chars):
            raise ValueError(problem)
        better_answer = (better_answer or "").strip()
        created = now()
        with self._write() as db:
            if db.conn.execute("SELECT 1 FROM pairs WHERE id = ?", (pair_id,)).fetchone() is None:
                raise ValueError(f"no pair with id {pair_id}")
            db.conn.execute(queries.INSERT_ANNOTATOR, (annotator, "annotator", created))
            cursor = db.conn.execute(
                queries.INSERT_VOTE, (pair_id, annotator, choice, int(bool(a_on_left)), seconds, created, strength)
            )
            if cursor.rowcount == 1:
                outcome = VoteOutcome(recorded=True, choice=choice, strength=strength)
                if better_answer:
                    outcome = replace(outcome, demonstration_id=self._insert_pair_demonstration(
                        db, pair_id, annotator, better_answer, created))
            else:
                standing, standing_strength = db.conn.execute(queries.SELECT_VOTE_CHOICE,
                                                              (pair_id, annotator)).fetchone()
                outcome = VoteOutcome(recorded=False, choice=standing, strength=standing_strength)
        self._release_reservation(annotator, pair_id)
        return outcome

    def votes(self, annotator: str | None = None, pair_id: int | None = None) -> list[Vote]:
        rows = self._rows(queries.SELECT_VOTES, {"annotator": annotator, "pair_id": pair_id})
        return [Vote(**{**row, "a_on_left": bool(row["a_on_left"])}) for row in rows]

    def votes_by(self, annotator: str) -> int:
        return self._scalar("SELECT COUNT(*) FROM votes WHERE annotator = ?", (self._checked_name(annotator),))

    def count_votes_since(self, since: str | None = None, include_skips: bool = False) -> int:
        """Votes recorded after the timestamp `since` (all when None); skips are left out unless asked for."""
        return self._scalar(queries.COUNT_VOTES_SINCE, {"since": since or "", "skips": int(include_skips)})

    def votes_since_last_round(self) -> int:
        """Votes (no skips) recorded after the start of the last finished round: what a new round would add."""
        last = self.last_done_round()
        return self.count_votes_since(last.started_at if last else None)

    def add_demonstration(self, prompt_id: int, annotator: str, text: str, pair_id: int | None = None,
                          max_answer_chars: int = MAX_ANSWER_CHARS) -> int | None:
        """Store a better answer someone wrote (SFT data); returns its id.

        Given the pair it was written for, at most one per (pair, annotator): a second one writes nothing and
        returns None. The pair must show this prompt. An empty one, one over `max_answer_chars` characters or one
        holding control characters raises ValueError.
        """
        annotator, text = self._checked_name(annotator), text or ""
        if not text.strip():
            raise ValueError("a demonstration must not be empty")
        if problem := answer_problem(text, max_answer_chars):
            raise ValueError(problem)
        text = text.strip()
        created = now()
        with self._write() as db:
            if db.conn.execute("SELECT 1 FROM prompts WHERE id = ?", (prompt_id,)).fetchone() is None:
                raise ValueError(f"no prompt with id {prompt_id}")
            if pair_id is None:
                return db["demonstrations"].insert(
                    {"prompt_id": prompt_id, "annotator": annotator, "text": text, "created_at": created}
                ).last_pk
            shown = db.conn.execute("SELECT prompt_id FROM pairs WHERE id = ?", (pair_id,)).fetchone()
            if shown is None or shown[0] != prompt_id:
                raise ValueError(f"pair {pair_id} does not exist or does not show prompt {prompt_id}")
            return self._insert_pair_demonstration(db, pair_id, annotator, text, created)

    @staticmethod
    def _insert_pair_demonstration(db: sqlite_utils.Database, pair_id: int, annotator: str, text: str,
                                   created: str) -> int | None:
        cursor = db.conn.execute(queries.INSERT_PAIR_DEMONSTRATION,
                                 {"pair_id": pair_id, "annotator": annotator, "text": text, "created_at": created})
        return cursor.lastrowid if cursor.rowcount == 1 else None

    def demonstrations(self) -> list[tuple[str, str]]:
        """(prompt, response) for every demonstration, oldest first."""
        return [(row["prompt"], row["response"]) for row in self._rows(queries.SELECT_DEMONSTRATIONS)]
