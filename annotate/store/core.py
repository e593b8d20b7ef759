"""The Store: connections, transactions, and the prompts, generations, pairs and annotators it keeps (its policies:
annotate/store/policies.py; its votes and demonstrations: annotate/store/votes.py; its rounds:
annotate/store/rounds.py; statistics and exports: annotate/store/reports.py).

Threads: Gradio runs handlers in threads. A file database gets one connection per thread (WAL lets readers run
beside a writer) and this process's writers take turns on a lock, so they never sleep in SQLite's busy handler;
other processes (a round, a simulator) are waited for by the 30 s busy timeout. `Store(":memory:")` has one shared
connection behind the same lock, since every connection to ":memory:" would be a separate database.
Every write is one `BEGIN IMMEDIATE` transaction: all of it lands or none of it.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import sqlite_utils

from annotate.identity import clean_name
from annotate.store import sql as queries
from annotate.store.backup import BackupRecords
from annotate.store.opening import newer_schema, open_failure
from annotate.store.policies import PolicyRecords
from annotate.store.reports import Reports
from annotate.store.rounds import RoundRecords
from annotate.store.votes import VoteRecords
from annotate.store.sql import now
from annotate.importers import read_prompts
from annotate.text_limits import MAX_PROMPT_CHARS, prompt_problem
from annotate.records import (
    CHOSEN_BY, PAIR_KINDS, ROLES, Annotator, NameClash, NewGeneration, Generation, ImportResult, NewPair, Pair, Prompt,
    Showing,
)

BUSY_TIMEOUT_S = 30.0
RESERVE_SECONDS = 180.0


def _name(annotator: str) -> str:
    """The one string that is this person everywhere in the store (annotate.identity.clean_name)."""
    name, problem = clean_name(annotator)
    if name is None:
        raise ValueError(f"annotator name {annotator!r} is not acceptable: {problem}")
    return name


class Store(PolicyRecords, VoteRecords, RoundRecords, Reports, BackupRecords):
    """Prompts, policies, generations, pairs, votes, demonstrations, rounds and annotators in one SQLite file."""

    def __init__(self, path: str | Path = ":memory:", reserve_seconds: float = RESERVE_SECONDS):
        self.path = str(path)
        self.memory = self.path == ":memory:"
        self.reserve_seconds = reserve_seconds
        self._lock = threading.RLock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        # annotator -> (pair_id, expiry on time.monotonic()): the pair last handed to them. With overlap 1 two people
        # asking at once would otherwise get the same pair; a reserved pair is passed over for others until it is
        # voted on or expires. Per process only: another process (a simulator) does not see these reservations.
        self._reservations: dict[str, tuple[int, float]] = {}
        self._reserve_lock = threading.Lock()
        self._rng = random.Random()
        self._shared = None
        try:
            self._open_and_migrate()
        except BaseException as error:
            self.close()  # a Store that was not made leaves no connection open
            if isinstance(error, (sqlite3.Error, OSError)):  # a mistyped --db, a full disk, a damaged file: in words
                raise open_failure(self.path, error) from error
            raise

    # connections and transactions ------------------------------------------------------------------------------

    def _open(self) -> sqlite_utils.Database:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")  # safe with WAL: a power cut can lose the last commits, not corrupt
        with self._lock:
            self._connections.append(conn)
        return sqlite_utils.Database(conn)

    def _db(self) -> sqlite_utils.Database:
        if self._shared is not None:
            return self._shared
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._open()
        return db

    @contextmanager
    def _read(self) -> Iterator[sqlite_utils.Database]:
        if self.memory:
            with self._lock:
                yield self._shared
        else:
            yield self._db()

    @contextmanager
    def _write(self) -> Iterator[sqlite_utils.Database]:
        with self._lock:
            db = self._db()
            db.conn.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.rollback()
                raise
            db.conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()
        self._shared = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open_and_migrate(self) -> None:
        """Create the folder, connect (in WAL mode for a file), bring the schema up to date."""
        if not self.memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._shared = self._open() if self.memory else None
        if not self.memory:
            self._db().enable_wal()
        self._migrate()

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(queries.MIGRATIONS):
                raise newer_schema(self.path, version, len(queries.MIGRATIONS))
            for number, migration in enumerate(queries.MIGRATIONS, start=1):
                if number > version:
                    migration(db)
            db.conn.execute(f"PRAGMA user_version = {len(queries.MIGRATIONS)}")

    def schema_version(self) -> int:
        with self._read() as db:
            return db.conn.execute("PRAGMA user_version").fetchone()[0]

    def _rows(self, sql: str, params: dict | tuple = ()) -> list[dict]:
        with self._read() as db:
            return list(db.query(sql, params))

    def _scalar(self, sql: str, params: dict | tuple = ()):
        with self._read() as db:
            return db.conn.execute(sql, params).fetchone()[0]

    # prompts -----------------------------------------------------------------------------------------------------

    def add_prompts(self, texts: Iterable[str], source: str = "",
                    max_prompt_chars: int = MAX_PROMPT_CHARS) -> ImportResult:
        """Add prompts, stripped and deduplicated on text; one that is empty, too long or holds control characters
        (annotate.text_limits) raises ValueError and nothing is written."""
        texts = list(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"prompt {index + 1} of {len(texts)} is empty or not text: {text!r}")
            if problem := prompt_problem(text, max_prompt_chars):
                raise ValueError(f"prompt {index + 1} of {len(texts)}: {problem}")
        stripped = [text.strip() for text in texts]
        created = now()
        with self._write() as db:
            before = db.conn.total_changes
            db.conn.executemany(queries.INSERT_PROMPT, [(text, source, created) for text in stripped])
            added = db.conn.total_changes - before
        return ImportResult(added=added, skipped=len(stripped) - added)

    def import_prompts(self, path: str | Path, source: str | None = None,
                       max_prompt_chars: int = MAX_PROMPT_CHARS) -> ImportResult:
        """Read a prompt file (see annotate.importers) then add everything in one transaction, or nothing; a prompt
        over `max_prompt_chars` characters is an error of the file (PromptImportError)."""
        texts = read_prompts(path, max_prompt_chars)
        return self.add_prompts(texts, source if source is not None else Path(path).name, max_prompt_chars)

    def prompts(self, limit: int | None = None) -> list[Prompt]:
        return [Prompt(**row) for row in self._rows(queries.SELECT_PROMPTS, {"limit": -1 if limit is None else limit})]

    def prompt(self, prompt_id: int) -> Prompt:
        rows = self._rows("SELECT id, text, source, created_at FROM prompts WHERE id = ?", (prompt_id,))
        if not rows:
            raise KeyError(f"no prompt with id {prompt_id}")
        return Prompt(**rows[0])

    def count_prompts(self) -> int:
        return self._scalar("SELECT COUNT(*) FROM prompts")

    def prompts_needing_pairs(self, n: int, exclude: frozenset[str] = frozenset()) -> list[Prompt]:
        """The n prompts with the fewest pairs so far (oldest first among equals): what to generate pairs for next;
        none whose text is in `exclude` (the demo's evaluation prompts)."""
        rows = self._rows(queries.SELECT_PROMPTS_NEEDING_PAIRS, {"limit": n + len(exclude)})
        return [Prompt(**row) for row in rows if row["text"] not in exclude][:n]

    # generations ------------------------------------------------------------------------------------------------

    def add_generation(self, prompt_id: int, policy_id: int, text: str, n_tokens: int, finish_reason: str) -> int:
        with self._write() as db:
            return self._insert_generation(db, prompt_id, NewGeneration(policy_id, text, n_tokens, finish_reason))

    def _insert_generation(self, db: sqlite_utils.Database, prompt_id: int, answer: NewGeneration) -> int:
        return db["generations"].insert({
            "prompt_id": prompt_id, "policy_id": answer.policy_id, "text": answer.text,
            "n_tokens": answer.n_tokens, "finish_reason": answer.finish_reason, "created_at": now(),
        }).last_pk

    def generation(self, generation_id: int) -> Generation:
        rows = self._rows("SELECT * FROM generations WHERE id = ?", (generation_id,))
        if not rows:
            raise KeyError(f"no generation with id {generation_id}")
        return Generation(**rows[0])

    def latest_answer_texts(self, limit: int) -> list[str]:
        """The texts of the `limit` most recent generations, newest first (what a simulated annotator grades by)."""
        return [row["text"] for row in self._rows(queries.SELECT_LATEST_ANSWER_TEXTS, {"limit": limit})]

    # pairs -------------------------------------------------------------------------------------------------------

    def add_pair(self, prompt_id: int, gen_a: int, gen_b: int, kind: str = "sample",
                 chosen_by: str | None = None) -> int:
        """Record a pair of generations of one prompt.

        kind `sample`: two samples of the current policy, `chosen_by` "random" or "uncertain" (picked for the reward
        model's disagreement; None: not known, read as random). kind `versus`: gen_a is always the newer policy's
        answer and gen_b the earlier policy's, so a vote `a` is a win of the newer policy (see versus_win_rates).
        """
        with self._write() as db:
            return self._insert_pair(db, prompt_id, gen_a, gen_b, kind, chosen_by)

    def _insert_pair(self, db: sqlite_utils.Database, prompt_id: int, gen_a: int, gen_b: int, kind: str,
                     chosen_by: str | None = None) -> int:
        if kind not in PAIR_KINDS:
            raise ValueError(f"pair kind must be one of {', '.join(PAIR_KINDS)}, not {kind!r}")
        if chosen_by is not None and (kind != "sample" or chosen_by not in CHOSEN_BY):
            raise ValueError(f"chosen_by is one of {', '.join(CHOSEN_BY)} for a sample pair (None for versus), "
                             f"not {chosen_by!r} for a {kind} pair")
        if gen_a == gen_b:
            raise ValueError(f"a pair needs two different generations, got {gen_a} twice")
        found = db.conn.execute("SELECT id, prompt_id FROM generations WHERE id IN (?, ?)", (gen_a, gen_b)).fetchall()
        if len(found) != 2 or any(row[1] != prompt_id for row in found):
            raise ValueError(f"generations {gen_a} and {gen_b} must both exist and answer prompt {prompt_id}")
        return db["pairs"].insert(
            {"prompt_id": prompt_id, "gen_a": gen_a, "gen_b": gen_b, "kind": kind, "chosen_by": chosen_by,
             "created_at": now()}
        ).last_pk

    def add_pairs_bulk(self, new_pairs: Iterable[NewPair]) -> list[int]:
        """Store both answers and the pair for each item, all in one transaction; returns the pair ids."""
        with self._write() as db:
            return [
                self._insert_pair(
                    db, item.prompt_id, self._insert_generation(db, item.prompt_id, item.a),
                    self._insert_generation(db, item.prompt_id, item.b), item.kind, item.chosen_by,
                )
                for item in new_pairs
            ]

    def pair(self, pair_id: int) -> Pair:
        rows = self._rows("SELECT * FROM pairs WHERE id = ?", (pair_id,))
        if not rows:
            raise KeyError(f"no pair with id {pair_id}")
        return Pair(**rows[0])

    def count_pairs(self) -> int:
        return self._scalar("SELECT COUNT(*) FROM pairs")

    def next_pair(self, annotator: str, overlap: int = 1, rng: random.Random | None = None,
                  gold_share: float = 0.0) -> Showing | None:
        """The oldest pair this annotator has not voted on (skips included) with fewer than `overlap` votes; with
        chance `gold_share`, a gold pair they have not voted on instead (shown as any other pair), when there is one.

        Pairs reserved for other annotators (handed out within `reserve_seconds` and not yet voted on) are passed
        over while others are left; when only reserved ones are left, one is shared rather than leaving this
        annotator without work. The side of gen_a is drawn for this showing.
        """
        annotator = _name(annotator)
        if overlap < 1:
            raise ValueError(f"overlap must be at least 1, got {overlap}")
        rng = rng or self._rng
        wants_gold = gold_share > 0 and rng.random() < gold_share  # no draw without gold: seeded queues as before
        with self._reserve_lock:
            clock = time.monotonic()
            self._reservations = {name: held for name, held in self._reservations.items() if held[1] > clock}
            with self._read() as db:
                pair_id = self._gold_pair(db, annotator) if wants_gold else None
                pair_id = pair_id or self._open_pair(db, annotator, overlap)
                if pair_id is None:
                    self._reservations.pop(annotator, None)
                    return None
                row = next(db.query(queries.SELECT_SHOWING, (pair_id,)))
            self._reservations[annotator] = (pair_id, clock + self.reserve_seconds)
        return Showing(a_on_left=rng.random() < 0.5, **row)

    def _open_pair(self, db: sqlite_utils.Database, annotator: str, overlap: int) -> int | None:
        """The pair next_pair hands out from the queue (the reservation lock held); None when none is open."""
        held_by_others = Counter(pid for name, (pid, _) in self._reservations.items() if name != annotator)
        params = {"annotator": annotator, "overlap": overlap, "limit": len(held_by_others) + 1}
        candidates = db.conn.execute(queries.SELECT_OPEN_PAIRS, params).fetchall()
        if not candidates:
            return None
        return next((pid for pid, votes in candidates if votes + held_by_others[pid] < overlap), candidates[0][0])

    @staticmethod
    def _gold_pair(db: sqlite_utils.Database, annotator: str) -> int | None:
        """The oldest gold pair this annotator has not voted on; None when they have voted on every one."""
        row = db.conn.execute(queries.SELECT_OPEN_GOLD, {"annotator": annotator}).fetchone()
        return None if row is None else row[0]

    def set_gold(self, pair_id: int, side: str | None) -> None:
        """Mark a pair's right answer ("a": gen_a, "b": gen_b), or None to make it an ordinary pair again; KeyError for
        an unknown pair, ValueError for another side."""
        if side not in (None, "a", "b"):
            raise ValueError(f"a gold pair's right answer is 'a' or 'b' (or None: not gold), got {side!r}")
        with self._write() as db:
            if db.conn.execute(queries.SET_PAIR_GOLD, (side, pair_id)).rowcount == 0:
                raise KeyError(f"no pair with id {pair_id}")

    def _release_reservation(self, annotator: str, pair_id: int) -> None:
        """The annotator voted on the pair held for them: others may now get it."""
        with self._reserve_lock:
            if self._reservations.get(annotator, (None,))[0] == pair_id:
                del self._reservations[annotator]

    @staticmethod
    def _checked_name(annotator: str) -> str:
        return _name(annotator)

    def pairs_waiting(self, annotator: str | None = None, overlap: int = 1) -> int:
        """Pairs with fewer than `overlap` votes (and, given an annotator, none of theirs)."""
        params = {"overlap": overlap, "annotator": _name(annotator) if annotator is not None else None}
        return self._scalar(queries.COUNT_WAITING_PAIRS, params)

    # annotators --------------------------------------------------------------------------------------------------

    def add_annotator(self, name: str, role: str = "annotator") -> bool:
        """Create an annotator; True when new. An existing one keeps their role (use set_role to change it)."""
        self._check_role(role)
        with self._write() as db:
            return db.conn.execute(queries.INSERT_ANNOTATOR, (_name(name), role, now())).rowcount == 1

    def set_role(self, name: str, role: str) -> None:
        """Give someone a role, creating them when unknown."""
        self._check_role(role)
        with self._write() as db:
            db.conn.execute(queries.UPSERT_ANNOTATOR_ROLE, (_name(name), role, now()))

    @staticmethod
    def _check_role(role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")

    def role_of(self, name: str) -> str | None:
        rows = self._rows("SELECT role FROM annotators WHERE name = ?", (clean_name(name)[0],))
        return rows[0]["role"] if rows else None

    def is_admin(self, name: str) -> bool:
        return self.role_of(name) == "admin"

    def annotators(self) -> list[Annotator]:
        return [Annotator(**row) for row in self._rows(queries.SELECT_ANNOTATORS)]

    def set_excluded(self, annotator: str, excluded: bool) -> None:
        """Exclude an annotator (their votes stay, unused by preferences and versus tallies) or include them again;
        KeyError for a name the store does not know. Excluding again keeps the first time."""
        name = _name(annotator)
        with self._write() as db:
            row = db.conn.execute("SELECT excluded_at FROM annotators WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise KeyError(f"no annotator named {name!r}")
            if excluded != (row[0] is not None):
                db.conn.execute(queries.SET_ANNOTATOR_EXCLUDED, (now() if excluded else None, name))

    def excluded_annotators(self) -> list[str]:
        """The names whose votes are left out, in order."""
        return [a.name for a in self.annotators() if a.excluded_at is not None]

    def name_clashes(self) -> list[NameClash]:
        """Names kept apart when names were first normalised, because merging them would have given one person
        two votes on a pair (see sql.migration_5_one_name_per_person)."""
        return [NameClash(**{**row, "pairs": tuple(json.loads(row["pairs"]))})
                for row in self._rows(queries.SELECT_NAME_CLASHES)]
