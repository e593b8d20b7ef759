"""`python app.py --annotators`, `--exclude NAME` and `--include NAME`: the people table of the Admin page in the
terminal (annotate.people), and an admin's exclusion of an annotator whose votes then stay in the database, unused by
the reward model and by promotion, until they are included again."""

from __future__ import annotations

import sys

from annotate.people import PEOPLE_COLUMNS, people_rows, store_gold_proposals, store_people
from commands.data import existing_store
from loop.config import LoopConfig


def text_table(columns: list[str], rows: list[list]) -> str:
    """Rows under their column names, each column as wide as its widest cell."""
    cells = [[str(cell) for cell in row] for row in [columns, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)


def annotators(args, config: LoopConfig) -> int:
    """Every annotator who voted: votes, left picks with their interval and binomial p, agreement, median seconds,
    Dawid-Skene accuracy; and who is excluded. Exit 2 without a database."""
    with existing_store(config.app.db) as store:
        persons = store_people(store)
        excluded = {a.name: a.excluded_at for a in store.annotators() if a.excluded_at is not None}
        proposals = store_gold_proposals(store, persons)
    if not persons:
        print("No votes yet.")
        return 0
    table = [[*row, f"since {excluded[row[0]][:19].replace('T', ' ')}" if row[0] in excluded else ""]
             for row in people_rows(persons)]
    print(text_table([*PEOPLE_COLUMNS, "excluded"], table))
    if proposals:
        shown = ", ".join(f"{p.pair_id} ({p.side}, {p.voters} voters)" for p in proposals[:20])
        print(f"\nProposed gold pairs, on which two or more careful annotators (not excluded, not flagged) picked "
              f"the same answer: {shown}{', ...' if len(proposals) > 20 else ''} ({len(proposals)} in all). Mark one "
              "with --gold PAIR SIDE, or all with the Admin tab's 'Mark the proposed pairs gold'.")
    return 0


def exclude(args, config: LoopConfig) -> int:
    return _set_excluded(args.exclude, True, config)


def include(args, config: LoopConfig) -> int:
    return _set_excluded(args.include, False, config)


def _set_excluded(name: str, excluded: bool, config: LoopConfig) -> int:
    """Exclude or include `name`; exit 2 for a name the database does not know."""
    with existing_store(config.app.db) as store:
        try:
            store.set_excluded(name, excluded)
        except (KeyError, ValueError) as error:
            print(f"error: {error.args[0]}; python app.py --annotators lists who voted.", file=sys.stderr)
            return 2
        votes = len(store.votes(annotator=name))
    print(f"{name} is {'excluded: their' if excluded else 'included again: their'} {votes} votes "
          f"{'stay in the database, unused by the next rounds and by promotion' if excluded else 'count again'}.")
    return 0


def gold(args, config: LoopConfig) -> int:
    """`--gold PAIR SIDE`: mark pair PAIR's right answer (a: its answer a, b: its answer b) or make it an ordinary pair
    again (none). Exit 2 on an unknown pair or side."""
    pair_text, side = args.gold
    if side not in ("a", "b", "none") or not pair_text.isdigit():
        print(f"error: --gold PAIR SIDE takes a pair id and a, b or none (got {pair_text!r} {side!r}).",
              file=sys.stderr)
        return 2
    with existing_store(config.app.db) as store:
        try:
            store.set_gold(int(pair_text), None if side == "none" else side)
        except KeyError as error:
            print(f"error: {error.args[0]} in {config.app.db}.", file=sys.stderr)
            return 2
        marked = len(store.gold_pair_ids())
    what = "an ordinary pair again" if side == "none" else f"a gold pair, answer {side} right"
    print(f"Pair {pair_text} is {what}; {marked} gold pairs in all. With [app] gold_share = "
          f"{config.app.gold_share:g}, that share of each annotator's next pairs are gold pairs they have not voted on.")
    return 0
