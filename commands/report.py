"""`python app.py --report ROUND [--out FILE]`: the round's report (loop.report) as one self-contained HTML file."""

from __future__ import annotations

import sys
from pathlib import Path

from annotate.store import Store
from commands.data import write_problem
from loop.config import LoopConfig
from loop.report import ReportRefused, kept_or_made_report, report_file, write_report_html


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report(args, config: LoopConfig) -> int:
    """Write the report the database keeps for round ROUND (made and kept first when it has none) to --out, by default
    <round.checkpoints_dir>/<db name>/round-ROUND/report.html, and print its path. Exit 2: no such database, no such
    round, a round that saved no new policy, or an --out that cannot be written."""
    try:
        round_id = int(args.report)
    except ValueError:
        return _fail(f"--report takes a round number, not {args.report!r}")
    db = Path(config.app.db)
    if not db.is_file():
        return _fail(f"there is no database at {db}: name the one the rounds ran on with --db PATH")
    with Store(db) as store:
        try:
            made = kept_or_made_report(store, round_id, config, log=_log)
        except ReportRefused as error:
            return _fail(str(error))
    out = Path(args.out or report_file(config, round_id))
    try:
        print(write_report_html(made, out))
    except OSError as error:
        return _fail(f"{write_problem(out, error)} (the report is kept in {db}: run --report again with another --out)")
    return 0
