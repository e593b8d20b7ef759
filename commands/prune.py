"""`python app.py --prune [--dry-run]`: delete the checkpoint folders round.keep_policies does not keep
(loop.retention), listing each folder with its size and the reason it is kept, then the disk the loop uses."""

from __future__ import annotations

import sys

from commands.data import existing_store
from commands.round import EXIT_BUSY
from loop.config import LoopConfig


def prune(args, config: LoopConfig) -> int:
    """List what round.keep_policies keeps and deletes in <round.checkpoints_dir>/<db name> and, without --dry-run,
    delete it. Exit 0 done, 2 no database at --db, 4 a round holds the database's round lock (nothing deleted)."""
    from loop.retention import prune_database
    from loop.round_lock import RoundBusy

    dry_run = bool(getattr(args, "dry_run", False))
    with existing_store(config.app.db) as store:
        try:
            report, disk = prune_database(store, config, dry_run=dry_run)
        except RoundBusy as error:
            print(f"error: {error} Nothing was deleted.", file=sys.stderr)
            return EXIT_BUSY
    listing = [*report.lines(), report.summary()] if report.decisions else \
        ["No checkpoint folder of this database's rounds is on disk."]
    print("\n".join([*listing, disk]))
    return 0
