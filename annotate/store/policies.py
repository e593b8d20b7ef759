"""The policies table: each actor checkpoint, its parent, whether its folder was pruned (loop.retention), and whether
it was promoted to be the current policy (loop.promotion decides; the store keeps the decision).

Mixed into `Store` (annotate/store/core.py), whose `_write` / `_rows` transactions these methods use.
"""

from __future__ import annotations

from pathlib import Path

from annotate.records import Policy, current_policy_of
from annotate.store import sql as queries
from annotate.store.sql import now


class PolicyRecords:
    """Policies: recorded by the round (or SFT) that made them, promoted or kept as candidates, pruned from disk."""

    def add_policy(self, round: int, path: str | Path, parent_id: int | None = None, promoted: bool = True) -> int:
        """A new policy row; `promoted` False records a round's candidate, current only once loop.promotion says so."""
        with self._write() as db:
            return db["policies"].insert(
                {"round": round, "path": str(path), "parent_id": parent_id, "created_at": now(),
                 "promoted": int(promoted)}
            ).last_pk

    def policies(self) -> list[Policy]:
        return [Policy(**row) for row in self._rows("SELECT * FROM policies ORDER BY id")]

    def mark_policy_pruned(self, policy_id: int) -> None:
        """Record that the policy's folder is deleted (loop.retention), so that nothing loads it again; KeyError for an
        unknown policy. A policy marked before keeps its first time."""
        with self._write() as db:
            if db.conn.execute("SELECT 1 FROM policies WHERE id = ?", (policy_id,)).fetchone() is None:
                raise KeyError(f"no policy with id {policy_id}")
            db.conn.execute(queries.MARK_POLICY_PRUNED, (now(), policy_id))

    def policy(self, policy_id: int) -> Policy:
        rows = self._rows("SELECT * FROM policies WHERE id = ?", (policy_id,))
        if not rows:
            raise KeyError(f"no policy with id {policy_id}")
        return Policy(**rows[0])

    def set_promotion(self, policy_id: int, promoted: bool, decision: str) -> None:
        """Record a promotion decision (loop.promotion): whether the policy is promoted and the decision as JSON."""
        self._update_policy(queries.SET_POLICY_PROMOTION, (int(promoted), decision, policy_id))

    def set_promotion_override(self, policy_id: int, override: str | None) -> None:
        """An admin's "promote" or "reject" of a policy, or None to let the evidence decide again."""
        if override not in (None, "promote", "reject"):
            raise ValueError(f"a promotion override is 'promote', 'reject' or None, got {override!r}")
        self._update_policy(queries.SET_PROMOTION_OVERRIDE, (override, policy_id))

    def _update_policy(self, sql: str, params: tuple) -> None:
        """Run an UPDATE of one policy (its id the last parameter); KeyError for an unknown policy."""
        with self._write() as db:
            if db.conn.execute(sql, params).rowcount == 0:
                raise KeyError(f"no policy with id {params[-1]}")

    def latest_policy(self) -> Policy | None:
        """The policy of the highest round (the last recorded among equals): the newest, promoted or a candidate."""
        rows = self._rows("SELECT * FROM policies ORDER BY round DESC, id DESC LIMIT 1")
        return Policy(**rows[0]) if rows else None

    def current_policy(self) -> Policy | None:
        """The promoted policy of the highest round (Policy.is_promoted): it writes the pairs and the next round
        starts from it. Candidates that were not promoted stay rows (their votes count) but are never current."""
        return current_policy_of(self.policies())

    def first_policy(self) -> Policy | None:
        """The reference: the last recorded policy of the lowest round (an SFT model recorded at round 0 after the
        base model replaces it)."""
        rows = self._rows("SELECT * FROM policies ORDER BY round ASC, id DESC LIMIT 1")
        return Policy(**rows[0]) if rows else None

    def ensure_base_policy(self, model_name: str) -> Policy:
        """The current policy, recording `model_name` as the round-0 (base) policy when there is none yet (stored as
        given: "default", a hub id or a folder, which rlhf.models resolves when loading)."""
        current = self.current_policy()
        return current if current is not None else self.policy(self.add_policy(round=0, path=str(model_name)))
