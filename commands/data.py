"""The data side of app.py: import prompts, export preferences, simulated votes, show the configuration.

Each takes the parsed arguments and returns an exit code; errors a user can fix are one clear line on stderr.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from annotate.importers import PromptImportError
from annotate.simulate import (
    AnnotatorSpecError,
    SimulationResult,
    noisy,
    resolve_judge,
    resolve_score,
    simulate_votes,
)
from annotate.team import TEAM_ANNOTATOR, build_team, parse_team, simulate_team_votes
from annotate.store import Store, StoreOpenError
from loop.config import LoopConfig
from loop.config_files import config_as_toml


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def require_database(db: str) -> None:
    """Raise StoreOpenError (app.py says it, exit 2) when `db` does not exist: the commands that work on what is stored
    already would otherwise make a new, empty database of a mistyped --db, then say there is nothing to work on."""
    if db != ":memory:" and not Path(db).exists():
        raise StoreOpenError(f"{db} does not exist: check --db, or create it by starting the app (python app.py) or "
                             "with python app.py --import-prompts FILE")


def existing_store(db: str) -> Store:
    """The store at `db`, which must exist (require_database)."""
    require_database(db)
    return Store(db)


def folder_problem(path: Path) -> str | None:
    """Why the file `path` has no folder to be written in (missing, or a file in its place), or None."""
    nearest = next(folder for folder in path.parents if folder.exists())
    if nearest == path.parent and nearest.is_dir():
        return None
    if not nearest.is_dir():
        return f"cannot write {path.name}: {nearest} is a file, not a folder"
    return f"cannot write {path.name}: folder {path.parent} does not exist"


def write_problem(path: Path, error: OSError) -> str:
    """Why the file `path` could not be written, in words: no folder for it, permission denied, disk full..."""
    no_folder = isinstance(error, (FileNotFoundError, FileExistsError, NotADirectoryError))
    return (no_folder and folder_problem(path)) or (
        f"cannot write {path.name} in {path.parent}: {(error.strerror or str(error)).lower()}")


def import_prompts(args, config: LoopConfig) -> int:
    """`--import-prompts FILE`: add prompts (deduplicated); nothing is written when the file is bad."""
    path = Path(args.import_prompts)
    if not path.exists():
        return _fail(f"{path} does not exist")
    with Store(config.app.db) as store:  # a first step on a new database: made when there is none
        try:
            result = store.import_prompts(path, max_prompt_chars=config.app.max_prompt_chars)
        except PromptImportError as error:
            return _fail(f"{error} (nothing was imported)")
        print(f"Imported {result.added} prompts from {path} ({result.skipped} already there or repeated); "
              f"{store.count_prompts()} prompts in {config.app.db}.")
    return 0


def export(args, config: LoopConfig) -> int:
    """`--export FILE`: the preferences (majority of a/b votes) as TRL's prompt, chosen, rejected."""
    path = Path(args.export)
    if path.suffix not in (".jsonl", ".parquet"):
        return _fail(f"cannot export to {path.name}: use a .jsonl or .parquet file name")
    if (problem := folder_problem(path)) is not None:
        return _fail(problem)
    with existing_store(config.app.db) as store:
        try:
            count = store.export_jsonl(path) if path.suffix == ".jsonl" else store.export_parquet(path)
        except OSError as error:
            return _fail(write_problem(path, error))
    print(f"Exported {count} preference pairs to {path}.")
    return 0


def simulate(args, config: LoopConfig) -> int:
    """`--simulate ANNOTATOR --votes N`: vote on waiting pairs through the same store path as people;
    `--simulate team` votes as the team of [simulate] team (`--team SPEC`)."""
    sim = config.simulate
    if args.simulate == TEAM_ANNOTATOR:
        return simulate_team(config)
    if getattr(args, "team", None):
        return _fail(f"--team votes with a team: give --simulate {TEAM_ANNOTATOR} --team SPEC (--simulate "
                     f"{args.simulate} is one annotator)")
    try:
        judge = resolve_judge(args.simulate)
        if sim.noise:
            judge = noisy(judge, sim.noise, random.Random(sim.seed + 1))
    except AnnotatorSpecError as error:
        return _fail(str(error))
    name = sim.annotator_name or f"sim:{args.simulate}"
    with existing_store(config.app.db) as store:
        try:
            result = simulate_votes(store, judge, name, sim.votes, overlap=config.app.overlap, seed=sim.seed,
                                    score=resolve_score(args.simulate))
        except AnnotatorSpecError as error:
            return _fail(str(error))
        print(f"{name} voted {_votes_text(result)}; {store.pairs_waiting(overlap=config.app.overlap)} "
              f"pairs still waiting.")
        if result.queue_empty:
            print("The queue ran dry: generate more pairs with --generate-pairs N or run a round.")
    return 0


def _votes_text(result: SimulationResult) -> str:
    choices = ", ".join(f"{choice} {count}" for choice, count in sorted(result.choices.items())) or "none"
    much = f"; {result.much_better} of the a/b votes much better" if result.much_better else ""
    return f"{result.votes} times ({choices}{much})"


def simulate_team(config: LoopConfig) -> int:
    """`--simulate team`: the team of [simulate] team casts simulate.votes votes, each next pair going to a member
    drawn by share (annotate.team), with app.overlap votes a pair."""
    sim = config.simulate
    if not sim.team:
        return _fail("--simulate team votes as [simulate] team, which is empty: give --team SPEC, for example "
                     "--team \"courteous*3,random,left\"")
    try:
        team = build_team(parse_team(sim.team), noise=sim.noise, seed=sim.seed + 1)
    except AnnotatorSpecError as error:
        return _fail(str(error))
    with existing_store(config.app.db) as store:
        try:
            result = simulate_team_votes(store, team, sim.votes, overlap=config.app.overlap, seed=sim.seed,
                                         gold_share=config.app.gold_share)
        except AnnotatorSpecError as error:
            return _fail(str(error))
        for member in team:
            voted = _votes_text(result.members[member.name])
            print(f"{member.name} ({member.spec.share:.0%} of the votes) voted {voted}.")
        print(f"The team voted {result.votes} times; {store.pairs_waiting(overlap=config.app.overlap)} pairs still "
              f"waiting.")
        if result.queue_empty:
            print("The queue ran dry: generate more pairs with --generate-pairs N or run a round.")
    return 0


def show_config(args, config: LoopConfig) -> int:
    """`--show-config`: the configuration every command would use here, as TOML (a start for rlhf-loop.toml)."""
    print(config_as_toml(config), end="")
    return 0
