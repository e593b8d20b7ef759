"""`python app.py --generate-pairs N`: pairs from the current policy, with [sampling] and [votes] of the one
configuration (loop.pair_batch); the annotation app runs the same command as a child process (`--progress-lines`),
so the web server never loads a model."""

from __future__ import annotations

import sys

from commands.data import require_database
from loop.config import LoopConfig


def _fail(message: str) -> int:
    print(f"app.py --generate-pairs: {message}", file=sys.stderr)
    return 2


def generate_pairs(args, config: LoopConfig) -> int:
    """Check N, --versus-share and the database, then make the batch; exit 0 done, 2 bad input."""
    from loop.pair_batch import generate_pair_batch

    try:
        n_pairs = int(args.generate_pairs)
    except ValueError:
        n_pairs = 0
    if n_pairs < 1:
        return _fail(f"N must be a positive whole number (pairs to generate), not {args.generate_pairs!r}.")
    if not 0.0 <= args.versus_share <= 1.0:
        return _fail(f"--versus-share must lie between 0 and 1 (the share of versus pairs), not {args.versus_share}.")
    require_database(config.app.db)  # pairs answer the prompts there: a mistyped --db has none
    return generate_pair_batch(config, n_pairs, args.versus_share, progress_lines=args.progress_lines)
