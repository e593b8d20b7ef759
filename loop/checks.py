"""The round's refusal of PPO on a reward model that cannot be told from chance, and the refusal type itself.

Held-out accuracy here is over the random sample pairs only (rlhf.reward.data.heldout_accuracies): pairs chosen for
the reward model's disagreement are harder than what the policy writes, and versus pairs are answers of two
policies, so neither estimates how well the model ranks the answers PPO will hand it. Both are recorded beside it.
"""

from __future__ import annotations

from typing import Callable

from annotate.metrics import (PAIR_SOURCES_MEASURED, RM_HELDOUT_ACCURACY, RM_HELDOUT_HIGH, RM_HELDOUT_LOW, RM_HELDOUT_N,
                              RM_LIVE_PREFIX, RM_N_HELDOUT, heldout_accuracy_of, n_heldout_of)
from annotate.statistics import votes_to_beat_chance, wilson_interval

CURVE_VOTES_FOR_TARGET = 200
"""bench/reward_curve.py (25% flips, 232 prompts x 8 answers of the default model, 10 splits): the default head
(answer-mean of layer 2, "mean@2") reached 72% held-out accuracy at 200 votes for the courteous annotator and 63% for
the polite one (66% at 384); the last-token feature stayed at chance. The refusal quotes it when the measured
accuracy itself says nothing about the votes needed."""
CURVE_ACCURACY_AT_TARGET = (0.63, 0.72)
"""The curve's held-out accuracy at CURVE_VOTES_FOR_TARGET votes: polite and courteous annotators."""


class RoundRefused(RuntimeError):
    """The round cannot (or should not) run; the message says why and what to do. Exit code 3."""


def check_accuracy(metrics: dict, plan, config, record: Callable[[dict], None], log: Callable[[str], None]) -> None:
    """Record held-out accuracy with its interval; refuse PPO below the bar, when the interval reaches chance, or
    when no random sample pair was held out (an unmeasured model).

    `metrics` are the trained model's (rm/heldout_accuracy and rm/n_heldout_sample over the random sample pairs),
    `plan` the round's (its round_id and preferences), `config` the LoopConfig. round.min_accuracy = 0 turns
    every refusal off.
    """
    accuracy, n_sample = RM_HELDOUT_ACCURACY.of(metrics), int(RM_HELDOUT_N.of(metrics) or 0)
    z = config.votes.confidence_z
    low, high = wilson_interval(accuracy, n_sample, z) if accuracy is not None else (0.0, 1.0)
    record({**{k: v for k, v in metrics.items() if not k.startswith(RM_LIVE_PREFIX)},
            RM_HELDOUT_ACCURACY.name: accuracy, RM_HELDOUT_LOW.name: low, RM_HELDOUT_HIGH.name: high})
    others = [f"{source} pairs {value:.1%} on {int(n_heldout_of(source).of(metrics) or 0)}"
              for source in PAIR_SOURCES_MEASURED if (value := heldout_accuracy_of(source).of(metrics)) is not None]
    log(f"Round {plan.round_id}: reward model held-out accuracy on random sample pairs "
        f"{'n/a (none held out)' if accuracy is None else f'{accuracy:.1%} ({low:.0%}-{high:.0%} on {n_sample} pairs)'}"
        f"{'; ' + ', '.join(others) if others else ''} "
        f"(bar {config.round.min_accuracy:.0%}, and the interval must clear chance).")
    if config.round.min_accuracy <= 0:
        return
    n_votes = len(plan.preferences)
    if accuracy is None:
        raise RoundRefused(
            f"No random sample pair was held out ({int(RM_N_HELDOUT.of(metrics) or 0)} held-out pairs in all: the "
            f"prompts whose hash falls in reward.heldout_fraction = {config.reward.heldout_fraction:.0%}, all of them "
            "versus or chosen pairs, or none at all), so the reward model's accuracy on what the policy writes is "
            "unmeasured: PPO on it could chase noise. Collect votes on more prompts, or set round.min_accuracy=0 to "
            "run PPO on an unmeasured model."
        )
    if accuracy < config.round.min_accuracy or low < 0.5:
        needed = votes_to_beat_chance(accuracy, n_sample / max(n_votes, 1), z)
        if needed is not None and needed > n_votes and accuracy >= config.round.min_accuracy:
            more = f"At this accuracy about {needed - n_votes} more votes ({needed} in all) would show it is not chance"
        else:
            low_curve, high_curve = CURVE_ACCURACY_AT_TARGET
            more = (f"On the learning curves (bench/reward_curve.py, simulated annotators, 25% flips) the default head "
                    f"needed about {CURVE_VOTES_FOR_TARGET} votes in all for {low_curve:.0%}-{high_curve:.0%} held-out "
                    f"accuracy: about {max(CURVE_VOTES_FOR_TARGET - n_votes, 0)} more")
        raise RoundRefused(
            f"The reward model's held-out accuracy {accuracy:.1%} ({low:.0%}-{high:.0%}, 95% interval on {n_sample} "
            f"held-out random sample pairs) cannot be told from chance or is below the bar "
            f"{config.round.min_accuracy:.0%}: PPO on it would chase noise. {more}. Collect more votes, or lower "
            "round.min_accuracy (0 turns this off)."
        )


def context_misfit(config) -> str | None:
    """Why the model cannot run a round with these settings (its context too short for them), or None: checked before
    anything is read, trained or written."""
    from rlhf.models import ModelNotFoundError, check_context

    try:
        check_context(config.app.model,
                      {"[sampling] max_new_tokens": config.sampling.max_new_tokens,
                       "[ppo.sampling] max_new_tokens": config.ppo.sampling.max_new_tokens},
                      {"[reward] max_length": config.reward.max_length})
    except ModelNotFoundError as error:
        return str(error)
    return None
