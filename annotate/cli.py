"""Command functions for the data side of app.py: import prompts, export preferences, simulated votes.

Each takes the parsed arguments and returns an exit code; errors a user can fix are one clear line on stderr.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from annotate.importers import PromptImportError
from annotate.simulate import AnnotatorSpecError, noisy, resolve_judge, simulate_votes
from annotate.store import Store


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def open_store(db: str) -> Store:
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    return Store(db)


def import_prompts(args) -> int:
    """`--import-prompts FILE`: add prompts (deduplicated); nothing is written when the file is bad."""
    path = Path(args.import_prompts)
    if not path.exists():
        return _fail(f"{path} does not exist")
    with open_store(args.db) as store:
        try:
            result = store.import_prompts(path)
        except PromptImportError as error:
            return _fail(f"{error} (nothing was imported)")
        print(f"Imported {result.added} prompts from {path} ({result.skipped} already there or repeated); "
              f"{store.count_prompts()} prompts in {args.db}.")
    return 0


def export(args) -> int:
    """`--export FILE`: the preferences (majority of a/b votes) as TRL's prompt, chosen, rejected."""
    path = Path(args.export)
    with open_store(args.db) as store:
        if path.suffix == ".jsonl":
            count = store.export_jsonl(path)
        elif path.suffix == ".parquet":
            count = store.export_parquet(path)
        else:
            return _fail(f"cannot export to {path.name}: use a .jsonl or .parquet file name")
    print(f"Exported {count} preference pairs to {path}.")
    return 0


def simulate(args) -> int:
    """`--simulate ANNOTATOR --votes N`: vote on waiting pairs through the same store path as people."""
    try:
        judge = resolve_judge(args.simulate)
        if args.noise:
            judge = noisy(judge, args.noise, random.Random(args.seed + 1))
    except AnnotatorSpecError as error:
        return _fail(str(error))
    name = args.annotator_name or f"sim:{args.simulate}"
    with open_store(args.db) as store:
        try:
            result = simulate_votes(store, judge, name, args.votes, overlap=args.overlap, seed=args.seed)
        except AnnotatorSpecError as error:
            return _fail(str(error))
        choices = ", ".join(f"{choice} {count}" for choice, count in sorted(result.choices.items())) or "none"
        print(f"{name} voted {result.votes} times ({choices}); {store.pairs_waiting(overlap=args.overlap)} pairs "
              f"still waiting.")
        if result.queue_empty:
            print("The queue ran dry: generate more pairs with --generate-pairs N or run a round.")
    return 0
