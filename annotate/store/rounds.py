"""The rounds table: a round's status, live metrics and error, and the stale rounds of processes that died (the
caller says which processes live: the store never looks at processes); and each round's report, kept as JSON.

Mixed into `Store` (annotate/store/core.py), whose `_write` / `_rows` transactions these methods use.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from annotate.records import Round
from annotate.store import sql as queries
from annotate.store.sql import now


class RoundRecords:
    """Rounds: started by the process that runs them, finished or failed by it, marked failed when it died."""

    def start_round(self, pid: int | None = None) -> int:
        """Record a running round owned by process `pid` (this process by default)."""
        with self._write() as db:
            return db["rounds"].insert({
                "status": "running", "started_at": now(), "metrics": "{}", "pid": pid or os.getpid(),
            }).last_pk

    def _update_round(self, round_id: int, metrics: dict | None, **columns) -> None:
        with self._write() as db:
            row = db.conn.execute("SELECT metrics FROM rounds WHERE id = ?", (round_id,)).fetchone()
            if row is None:
                raise KeyError(f"no round with id {round_id}")
            merged = {**json.loads(row[0] or "{}"), **(metrics or {})}
            db["rounds"].update(round_id, {**columns, "metrics": json.dumps(merged)})

    def update_round_metrics(self, round_id: int, metrics: dict) -> None:
        """Merge metrics into the round's (live progress); keys given replace earlier values."""
        self._update_round(round_id, metrics)

    def finish_round(self, round_id: int, metrics: dict | None = None) -> None:
        self._update_round(round_id, metrics, status="done", finished_at=now())

    def fail_round(self, round_id: int, error: str) -> None:
        self._update_round(round_id, None, status="failed", finished_at=now(), error=error)

    def rounds(self) -> list[Round]:
        return [self._round(row) for row in self._rows("SELECT * FROM rounds ORDER BY id")]

    def round(self, round_id: int) -> Round:
        rows = self._rows("SELECT * FROM rounds WHERE id = ?", (round_id,))
        if not rows:
            raise KeyError(f"no round with id {round_id}")
        return self._round(rows[0])

    @staticmethod
    def _round(row: dict) -> Round:
        return Round(**{**row, "metrics": json.loads(row["metrics"] or "{}")})

    def running_round(self) -> Round | None:
        rows = self._rows("SELECT * FROM rounds WHERE status = 'running' ORDER BY id DESC LIMIT 1")
        return self._round(rows[0]) if rows else None

    def last_done_round(self) -> Round | None:
        rows = self._rows("SELECT * FROM rounds WHERE status = 'done' ORDER BY id DESC LIMIT 1")
        return self._round(rows[0]) if rows else None

    def mark_stale_rounds_failed(self, is_alive: Callable[[int | None], bool]) -> list[int]:
        """Mark `running` rounds whose process is gone (`is_alive(pid)` false: loop.children.liveness) as failed;
        returns their ids."""
        stale = [r for r in self.rounds() if r.status == "running" and not is_alive(r.pid)]
        for stale_round in stale:
            self.fail_round(stale_round.id, f"stale: its process {stale_round.pid} ended without finishing the round")
        return [r.id for r in stale]

    def save_round_report(self, round_id: int, report: dict) -> None:
        """Keep the round's report (annotate.round_report.RoundReport.to_dict()), replacing an earlier one; KeyError
        for an unknown round."""
        text = json.dumps(report)
        with self._write() as db:
            if db.conn.execute("SELECT 1 FROM rounds WHERE id = ?", (round_id,)).fetchone() is None:
                raise KeyError(f"no round with id {round_id}")
            db.conn.execute(queries.UPSERT_ROUND_REPORT, (round_id, now(), text))

    def round_report_ids(self) -> list[int]:
        """The rounds that have a report, oldest first."""
        return [row["round_id"] for row in self._rows(queries.SELECT_ROUND_REPORT_IDS)]

    def round_report(self, round_id: int) -> dict | None:
        """The report kept for the round, as it was saved; None when it has none (or there is no such round)."""
        rows = self._rows(queries.SELECT_ROUND_REPORT, (round_id,))
        return json.loads(rows[0]["report"]) if rows else None
