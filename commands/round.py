"""`python app.py --train-round` and `--demo-loop`: the round (loop.round) and the headless end-to-end demonstration
(loop.demo)."""

from __future__ import annotations

import sys

from commands.data import require_database
from loop.config import LoopConfig

EXIT_REFUSED = 3
EXIT_BUSY = 4
EXIT_NOT_FINITE = 5


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary_table(metrics: dict) -> str:
    """A line for each of annotate.metrics.SUMMARY that the round recorded: its label and value; then the new
    policy's promotion decision (annotate.promotion) with its rule and reason."""
    from annotate.metrics import ROUND_PROMOTION, SUMMARY

    lines = [f"  {metric.label:<44} {metric.text(value)}" for metric in SUMMARY
             if (value := metric.of(metrics)) is not None]
    if (decision := metrics.get(ROUND_PROMOTION)) is not None:
        state = "promoted: the current policy" if decision["promoted"] else "a candidate, not promoted"
        lines.append(f"  {'the new policy':<44} {state} ({decision['rule']}: {decision['reason']})")
    return "\n".join(lines)


def train_round(args, config: LoopConfig) -> int:
    """One round; exit 0 done, 2 a model its settings do not fit (or no database at --db), 3 refused (too few pairs,
    reward model below the bar), 4 another round running, 5 training made NaN or inf (nothing published)."""
    from loop import round as rounds
    from loop.checks import RoundRefused, context_misfit
    from loop.round_lock import RoundBusy
    from rlhf.distributed import is_main_process
    from rlhf.finite import NotFinite

    if (misfit := context_misfit(config)) is not None:
        print(f"error: {misfit}", file=sys.stderr)
        return 2
    require_database(config.app.db)  # a round trains on the votes there: a mistyped --db has none
    try:
        result = rounds.run_round(config.app.db, config.app.model, config, log=_log)
    except RoundBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BUSY
    except RoundRefused as error:
        print(f"round refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except NotFinite as error:
        print(f"round failed: {error} The previous policy stays current; the round is marked failed.", file=sys.stderr)
        return EXIT_NOT_FINITE
    if is_main_process():
        print(f"Round {result.round_id} done.\n{summary_table(result.metrics)}")
    return 0


def demo_loop(args, config: LoopConfig) -> int:
    """simulate -> round, R times, each new policy judged against the first (loop.demo)."""
    from loop.demo import run_demo_loop

    return run_demo_loop(config)
