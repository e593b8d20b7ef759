"""The data side of app.py: import prompts, export preferences, simulated votes, show the configuration.

Each takes the parsed arguments and returns an exit code; errors a user can fix are one clear line on stderr.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from annotate.importers import PromptImportError
from annotate.simulate import AnnotatorSpecError, noisy, resolve_judge, resolve_score, simulate_votes
from annotate.store import Store
from loop.config import LoopConfig
from loop.config_files import config_as_toml


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def open_store(db: str) -> Store:
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    return Store(db)


def import_prompts(args, config: LoopConfig) -> int:
    """`--import-prompts FILE`: add prompts (deduplicated); nothing is written when the file is bad."""
    path = Path(args.import_prompts)
    if not path.exists():
        return _fail(f"{path} does not exist")
    with open_store(config.app.db) as store:
        try:
            result = store.import_prompts(path)
        except PromptImportError as error:
            return _fail(f"{error} (nothing was imported)")
        print(f"Imported {result.added} prompts from {path} ({result.skipped} already there or repeated); "
              f"{store.count_prompts()} prompts in {config.app.db}.")
    return 0


def export(args, config: LoopConfig) -> int:
    """`--export FILE`: the preferences (majority of a/b votes) as TRL's prompt, chosen, rejected."""
    path = Path(args.export)
    with open_store(config.app.db) as store:
        if path.suffix == ".jsonl":
            count = store.export_jsonl(path)
        elif path.suffix == ".parquet":
            count = store.export_parquet(path)
        else:
            return _fail(f"cannot export to {path.name}: use a .jsonl or .parquet file name")
    print(f"Exported {count} preference pairs to {path}.")
    return 0


def simulate(args, config: LoopConfig) -> int:
    """`--simulate ANNOTATOR --votes N`: vote on waiting pairs through the same store path as people."""
    sim = config.simulate
    try:
        judge = resolve_judge(args.simulate)
        if sim.noise:
            judge = noisy(judge, sim.noise, random.Random(sim.seed + 1))
    except AnnotatorSpecError as error:
        return _fail(str(error))
    name = sim.annotator_name or f"sim:{args.simulate}"
    with open_store(config.app.db) as store:
        try:
            result = simulate_votes(store, judge, name, sim.votes, overlap=config.app.overlap, seed=sim.seed,
                                    score=resolve_score(args.simulate))
        except AnnotatorSpecError as error:
            return _fail(str(error))
        choices = ", ".join(f"{choice} {count}" for choice, count in sorted(result.choices.items())) or "none"
        much = f"; {result.much_better} of the a/b votes much better" if result.much_better else ""
        print(f"{name} voted {result.votes} times ({choices}{much}); {store.pairs_waiting(overlap=config.app.overlap)} "
              f"pairs still waiting.")
        if result.queue_empty:
            print("The queue ran dry: generate more pairs with --generate-pairs N or run a round.")
    return 0


def show_config(args, config: LoopConfig) -> int:
    """`--show-config`: the configuration every command would use here, as TOML (a start for rlhf-loop.toml)."""
    print(config_as_toml(config), end="")
    return 0
