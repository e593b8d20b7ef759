"""`python app.py --train-round` and `--demo-loop`: the round (loop.round) and the headless end-to-end demonstration
(loop.demo)."""

from __future__ import annotations

import sys
from pathlib import Path

from loop.config import LoopConfig

EXIT_REFUSED = 3
EXIT_BUSY = 4
SUMMARY_KEYS = [
    ("rm/heldout_accuracy", "reward model held-out accuracy", "{:.1%}"),
    ("rm/n_heldout_sample", "  on random sample pairs held out", "{:.0f}"),
    ("rm/heldout_accuracy_versus", "  held-out accuracy, versus pairs", "{:.1%}"),
    ("rm/heldout_accuracy_chosen", "  held-out accuracy, chosen pairs", "{:.1%}"),
    ("rm/n_train", "pairs trained on", "{:.0f}"),
    ("ppo/reward", "mean reward (score - KL)", "{:.3f}"),
    ("ppo/score", "mean reward-model score", "{:.3f}"),
    ("ppo/kl", "KL to the reference", "{:.4f}"),
    ("ppo/response_len", "mean answer length (tokens)", "{:.1f}"),
    ("round/policy_id", "new policy", "{}"),
    ("round/pairs_generated", "pairs queued for annotation", "{}"),
    ("round/reward_seconds", "seconds: reward model", "{:.0f}"),
    ("round/ppo_seconds", "seconds: PPO", "{:.0f}"),
    ("round/ceiling_seconds", "seconds: the oracle's ceiling (demo)", "{:.0f}"),
    ("round/pairs_seconds", "seconds: next pairs", "{:.0f}"),
    ("round/seconds", "seconds: the whole round", "{:.0f}"),
]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary_table(metrics: dict) -> str:
    rows = []
    for key, label, fmt in SUMMARY_KEYS:
        value = metrics.get(key)
        if value is not None:
            rows.append(f"  {label:<34} {fmt.format(value)}")
    return "\n".join(rows)


def train_round(args, config: LoopConfig) -> int:
    """One round; exit 0 done, 2 a model its settings do not fit, 3 refused (too few pairs, reward model below the
    bar), 4 another round running."""
    from loop import round as rounds
    from loop.checks import RoundRefused, context_misfit
    from loop.round_lock import RoundBusy
    from rlhf.distributed import is_main_process

    if (misfit := context_misfit(config)) is not None:
        print(f"error: {misfit}", file=sys.stderr)
        return 2
    Path(config.app.db).parent.mkdir(parents=True, exist_ok=True)
    try:
        result = rounds.run_round(config.app.db, config.app.model, config, log=_log)
    except RoundBusy as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BUSY
    except RoundRefused as error:
        print(f"round refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if is_main_process():
        print(f"Round {result.round_id} done.\n{summary_table(result.metrics)}")
    return 0


def demo_loop(args, config: LoopConfig) -> int:
    """simulate -> round, R times, each new policy judged against the first (loop.demo)."""
    from loop.demo import run_demo_loop

    return run_demo_loop(config)
