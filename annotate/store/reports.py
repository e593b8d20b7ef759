"""What the dashboard and exports read: counts, agreement, preferences (majority of a/b votes), win rates.

Mixed into `Store` (annotate/store/core.py), whose `_rows` / `_scalar` reads these methods use.
"""

from __future__ import annotations

import json
from pathlib import Path

from annotate.agreement import AgreementReport, agreement_report
from annotate.records import CHOICES, Preference, VersusVote, VoteTexts, WinRate
from annotate.store import sql as queries


def _side_strength(row: dict, side: str) -> float:
    """The mean strength of a pair's votes for `side` (1 slightly, 2 much better); 1 when none voted for it."""
    return row[f"strength_{side}"] / row[f"n_{side}"] if row[f"n_{side}"] else 1.0


def _source(kind: str, chosen_by: str | None) -> str:
    """A preference's source (Preference.source): versus, chosen (for disagreement) or sample (at random or unknown)."""
    if kind == "versus":
        return "versus"
    return "chosen" if chosen_by == "uncertain" else "sample"


class Reports:
    """Read-only views over votes and pairs."""

    def stats(self, overlap: int = 1) -> dict:
        """Counts for the dashboard (pairs waiting: those with fewer than `overlap` votes)."""
        by_choice = dict.fromkeys(CHOICES, 0)
        by_choice.update({row["choice"]: row["n"] for row in self._rows(queries.COUNT_VOTES_BY_CHOICE)})
        by_annotator = {row["annotator"]: row["n"] for row in self._rows(queries.COUNT_VOTES_BY_ANNOTATOR)}
        return {
            "prompts": self.count_prompts(),
            "policies": self._scalar("SELECT COUNT(*) FROM policies"),
            "generations": self._scalar("SELECT COUNT(*) FROM generations"),
            "pairs": self.count_pairs(),
            "pairs_waiting": self.pairs_waiting(overlap=overlap),
            "votes": sum(by_choice.values()),
            "votes_by_choice": by_choice,
            "votes_by_annotator": by_annotator,
            "preferences": len(self.preferences()),
            "demonstrations": self._scalar("SELECT COUNT(*) FROM demonstrations"),
        }

    def agreement(self) -> AgreementReport:
        """Percent agreement and Cohen's kappa over pairs with two or more non-skip votes."""
        labels_by_pair: dict[int, dict[str, str]] = {}
        for row in self._rows("SELECT pair_id, annotator, choice FROM votes WHERE choice != 'skip'"):
            labels_by_pair.setdefault(row["pair_id"], {})[row["annotator"]] = row["choice"]
        return agreement_report(labels_by_pair)

    def preferences(self) -> list[Preference]:
        """Pairs with a strict majority among their a/b votes, oldest pair first, each with its source; a gold pair
        (an admin marked its right answer) with any a/b vote is its gold side, once, whatever the votes say."""
        preferences = []
        for row in self._rows(queries.SELECT_PAIR_TALLIES):
            if row["gold"] is None and row["n_a"] == row["n_b"]:
                continue
            if row["gold"] is not None and row["n_a"] + row["n_b"] == 0:
                continue
            a_wins = row["gold"] == "a" if row["gold"] is not None else row["n_a"] > row["n_b"]
            strength = _side_strength(row, "a" if a_wins else "b")
            preferences.append(Preference(
                pair_id=row["id"], prompt=row["prompt"],
                chosen=row["text_a"] if a_wins else row["text_b"], rejected=row["text_b"] if a_wins else row["text_a"],
                votes=row["n_a"] + row["n_b"], kind=row["kind"],
                source=_source(row["kind"], row["chosen_by"]), strength=strength,
            ))
        return preferences

    def export_dataset(self):
        """Preferences as a `datasets.Dataset` with TRL's columns prompt, chosen, rejected, and strength (how much
        better: 1 slightly or ungraded, 2 much, between for a mean of votes)."""
        import datasets

        preferences = self.preferences()
        features = datasets.Features({**{name: datasets.Value("string") for name in ("prompt", "chosen", "rejected")},
                                      "strength": datasets.Value("float64")})
        return datasets.Dataset.from_dict(
            {
                "prompt": [p.prompt for p in preferences],
                "chosen": [p.chosen for p in preferences],
                "rejected": [p.rejected for p in preferences],
                "strength": [p.strength for p in preferences],
            },
            features=features,
        )

    def export_jsonl(self, path: str | Path) -> int:
        """Write preferences as JSON Lines {prompt, chosen, rejected, strength}; returns the number of rows."""
        preferences = self.preferences()
        with open(path, "w", encoding="utf-8") as out:
            for p in preferences:
                out.write(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected,
                                      "strength": p.strength}) + "\n")
        return len(preferences)

    def export_parquet(self, path: str | Path) -> int:
        dataset = self.export_dataset()
        dataset.to_parquet(str(path))
        return len(dataset)

    def ab_vote_texts(self) -> list[VoteTexts]:
        """Every a/b vote, excluded annotators' too, oldest first, as the texts the voter picked between."""
        return [VoteTexts(**row) for row in self._rows(queries.SELECT_AB_VOTE_TEXTS)]

    def gold_pair_ids(self) -> list[int]:
        """The pairs an admin marked gold, oldest first."""
        return [row["id"] for row in self._rows("SELECT id FROM pairs WHERE gold IS NOT NULL ORDER BY id")]

    def gold_results(self) -> dict[str, tuple[int, int]]:
        """Per annotator, (a/b votes on gold pairs that named the gold side, a/b votes on gold pairs)."""
        results: dict[str, tuple[int, int]] = {}
        for row in self._rows(queries.SELECT_GOLD_VOTES):
            right, judged = results.get(row["annotator"], (0, 0))
            results[row["annotator"]] = (right + (row["choice"] == row["gold"]), judged + 1)
        return results

    def versus_win_rates(self) -> list[WinRate]:
        """Per (newer policy, earlier policy): human votes on `versus` pairs, ties counting half a win."""
        return [WinRate(**row) for row in self._rows(queries.SELECT_VERSUS_TALLIES)]

    def versus_votes(self) -> list[VersusVote]:
        """Every counted vote on a `versus` pair, with the two policies it judged (the newer one's answer is gen_a)."""
        return [VersusVote(**row) for row in self._rows(queries.SELECT_VERSUS_VOTES)]
