"""The one vocabulary of metric names: what a round records in the store (its own figures, the reward model's and
PPO's, the demo's judge), and what reads them back: `--train-round`'s summary, the model card, the demo loop and the
Dashboard. Nothing reads or writes a metric by a name spelled anywhere else; a `Metric` carries what people see
beside the name (its label and how its value is written).

The trainers in rlhf/ produce their own rm/*, ppo/* and gen/* keys: rlhf imports nothing of ours, so it cannot import
this module. tests/test_dashboard.py runs a real round and fails when a name listed here as the trainers' is not among
what it wrote, and when any module of annotate/, loop/ or commands/ spells a metric name outside this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A recorded number: its name in the round's metrics, what people read, and how its value is written."""

    name: str
    label: str
    fmt: str = "{:.4g}"
    """format() pattern of its value."""

    def text(self, value) -> str:
        """The value as people read it; "" for none, or for what is not a finite number."""
        if not is_number(value):
            return ""
        text, zero = self.fmt.format(value), self.fmt.format(0.0)
        return zero if text == "-" + zero else text  # a rounded -0.000 reads 0.000

    def of(self, metrics: dict) -> float | None:
        """Its value in a round's metrics: a finite number, or None."""
        value = metrics.get(self.name)
        return float(value) if is_number(value) else None


def is_number(value) -> bool:
    """A finite int or float (a bool is no number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# The reward model (rlhf.reward: the trainers' names, and the interval the round adds to them in loop.checks)
RM_HELDOUT_ACCURACY = Metric("rm/heldout_accuracy", "held-out accuracy (random sample pairs)", "{:.1%}")
RM_HELDOUT_LOW = Metric("rm/heldout_low", "its 95% interval, low", "{:.1%}")
RM_HELDOUT_HIGH = Metric("rm/heldout_high", "its 95% interval, high", "{:.1%}")
RM_HELDOUT_N = Metric("rm/n_heldout_sample", "random sample pairs held out", "{:.0f}")
RM_TRAIN_ACCURACY = Metric("rm/accuracy", "training accuracy (the pairs it trained on)", "{:.1%}")
RM_N_TRAIN = Metric("rm/n_train", "pairs trained on", "{:.0f}")
RM_N_HELDOUT = Metric("rm/n_heldout", "pairs held out, every kind", "{:.0f}")
RM_INCREMENTAL = Metric("rm/incremental", "LP-FT went on from the last round's reward model")
RM_N_NEW = Metric("rm/n_new", "votes the last round's reward model had not trained on", "{:.0f}")
RM_N_REPLAY = Metric("rm/n_replay", "earlier votes replayed with them", "{:.0f}")
RM_PREFIX = "rm/"
RM_LIVE_PREFIX = "rm/live_"
"""The reward stage's progress while it runs (rm/live_loss, rm/live_step...): not kept once the model is trained."""
PAIR_SOURCES_MEASURED = ("versus", "chosen")
"""The held-out pairs measured beside the random sample pairs (rlhf.reward.data.PAIR_SOURCES but "sample")."""


def heldout_accuracy_of(source: str) -> Metric:
    """Held-out accuracy on the pairs of one other source: "versus" or "chosen" (picked for disagreement)."""
    return Metric(f"rm/heldout_accuracy_{source}", f"held-out accuracy, {source} pairs", "{:.1%}")


def n_heldout_of(source: str) -> Metric:
    return Metric(f"rm/n_heldout_{source}", f"{source} pairs held out", "{:.0f}")


# PPO (rlhf.ppo.trainer: the trainer's names, per step in HISTORY, their means over the steps in the round's metrics)
PPO_STEP = Metric("ppo/step", "PPO step", "{:.0f}")
PPO_REWARD = Metric("ppo/reward", "mean reward (score - KL)", "{:.3f}")
PPO_SCORE = Metric("ppo/score", "mean reward-model score", "{:.3f}")
PPO_KL = Metric("ppo/kl", "KL to the reference (nats an answer)", "{:.4f}")
PPO_RESPONSE_LEN = Metric("ppo/response_len", "mean answer length (tokens)", "{:.1f}")
PPO_POLICY_LOSS = Metric("ppo/policy_loss", "policy loss", "{:.4f}")
PPO_VALUE_LOSS = Metric("ppo/value_loss", "value loss", "{:.4f}")
PPO_PREFIX = "ppo/"
HISTORY = "history"
"""The round's per-step PPO metrics: a list of {PPO_STEP.name: n, "ppo/...": value}."""
PEOPLE_MODEL_AGREEMENT = "people/model_agreement"
"""Each annotator's agreement with a head fitted on everyone else's votes, measured by the round's reward stage
(loop.model_agreement): {name: [votes the head agrees with, their a/b votes]}."""
CEILING_PREFIX = "ceiling/"
"""The oracle ceiling's PPO means (a demo measurement): ceiling/kl... for ppo/kl..."""


def ceiling_name(ppo_name: str) -> str:
    """The oracle ceiling's name for one of PPO's metrics: ceiling/kl for ppo/kl."""
    return CEILING_PREFIX + ppo_name.removeprefix(PPO_PREFIX)


# Answers generated (rlhf.generate's figures, merged over a batch of pairs)
GEN_ANSWERS = "gen/answers"
GEN_FINISHED_SHARE = "gen/finished_share"
GEN_MEAN_TOKENS = "gen/mean_tokens"
GEN_TOKENS_PER_S = "gen/tokens_per_s"
TIME_GENERATE_S = "time/generate_s"
ACTIVE_UNCERTAIN = "active/uncertain"
"""Pairs chosen for the reward model's disagreement."""
ACTIVE_CANDIDATE_ANSWERS = "active/candidate_answers"

# The round's own (loop.round, loop.round_plan)
ROUND_STAGE = "round/stage"
ROUND_POLICY_ID = Metric("round/policy_id", "new policy", "{:.0f}")
ROUND_POLICY_PATH = "round/policy_path"
ROUND_PROMOTED = Metric("round/promoted", "promoted (1) or kept a candidate (0) at the round's end", "{:.0f}")
ROUND_PROMOTION = "round/promotion"
"""The promotion decision at the round's end, as annotate.promotion.PromotionDecision's dict (rule, reason, numbers);
the policy row holds the decision taken since, as votes came in."""
ROUND_EXCLUDED_ANNOTATORS = "round/excluded_annotators"
"""The annotators an admin had excluded when the round read its votes (their votes unused): a list of names."""
ROUND_WEIGHTING = "round/weighting"
"""votes.weighting the round trained with: "majority" or "reliability" (annotate.reliability.weighted_preferences)."""
ROUND_STARTED_FROM = "round/started_from"
"""Why the round's PPO starts from its actor: the last promoted policy, and the newer candidates it passed over."""
ROUND_ACTOR_POLICY_ID = "round/actor_policy_id"
ROUND_REFERENCE = "round/reference"
ROUND_REWARD_MODEL_PATH = "round/reward_model_path"
ROUND_RM_STRATEGY = "round/rm_strategy"
ROUND_RESUMED_POLICY = "round/resumed_policy"
ROUND_RESUMED_FROM = "round/resumed_from"
"""The crashed round whose work (reward model, policy, pairs) this round went on from; its metrics are carried."""
ROUND_PAIRS_USED = Metric("round/pairs_used", "preference pairs trained on and held out", "{:.0f}")
ROUND_NEW_PAIRS = Metric("round/new_pairs", "new preference pairs", "{:.0f}")
ROUND_VOTES = Metric("round/votes", "votes (a/b, tie, both bad)", "{:.0f}")
ROUND_MIN_ACCURACY = Metric("round/min_accuracy", "the accuracy bar below which PPO is refused", "{:.0%}")
ROUND_PPO_PROMPTS = "round/ppo_prompts"
"""The prompts PPO trained on (a list): the round report answers others."""
ROUND_NORMALIZE_REWARDS = "round/normalize_rewards"
ROUND_PPO_LAM = "round/ppo_lam"
ROUND_PPO_SEED = "round/ppo_seed"
ROUND_PPO_REWARD = "round/ppo_reward"
ROUND_ACTIVE_SHARE = "round/active_share"
ROUND_ACTIVE_CANDIDATE_ANSWERS = "round/active_candidates_answers"
ROUND_PAIRS_GENERATED = Metric("round/pairs_generated", "pairs queued for annotation", "{:.0f}")
ROUND_CEILING_POLICY_PATH = "round/ceiling_policy_path"
ROUND_SECONDS = Metric("round/seconds", "seconds: the whole round", "{:.0f}")
STAGES = ("reward", "ppo", "ceiling", "pairs", "report")
"""The round's timed stages, in order (the ceiling is the demo's measurement, not the round's work)."""
STAGE_LABELS = {"reward": "reward model", "ppo": "PPO", "ceiling": "the oracle's ceiling (demo)",
                "pairs": "next pairs", "report": "the round report"}


def stage_seconds(stage: str) -> Metric:
    """The wall seconds of one of the round's STAGES."""
    return Metric(f"round/{stage}_seconds", f"seconds: {STAGE_LABELS[stage]}", "{:.0f}")


# The demo loop's judge (loop.demo): only where a simulated annotator judged the round's policy
DEMO_ANNOTATOR = "demo/annotator"
DEMO_WIN_RATE = Metric("demo/win_rate", "judge's win rate against the first policy", "{:.1%}")
DEMO_WIN_RATE_LOW = Metric("demo/win_rate_low", "its 95% interval, low", "{:.1%}")
DEMO_WIN_RATE_HIGH = Metric("demo/win_rate_high", "its 95% interval, high", "{:.1%}")
DEMO_JUDGE_SCORE = Metric("demo/judge_score", "judge's mean score of the answers", "{:.4f}")
DEMO_FIRST_JUDGE_SCORE = Metric("demo/first_judge_score", "judge's mean score of the first policy's answers",
                                "{:.4f}")

SUMMARY = [
    RM_HELDOUT_ACCURACY, RM_HELDOUT_N, heldout_accuracy_of("versus"), heldout_accuracy_of("chosen"), RM_TRAIN_ACCURACY,
    RM_N_TRAIN, PPO_REWARD, PPO_SCORE, PPO_KL, PPO_RESPONSE_LEN, ROUND_POLICY_ID, ROUND_PAIRS_GENERATED,
    *[stage_seconds(stage) for stage in STAGES], ROUND_SECONDS,
]
"""What `--train-round` prints when a round is done, in this order (a line for each that the round recorded)."""


# conservative reward (#34): rlhf.ppo.trainer's names where the reward model has bootstrap heads (ppo.drift_budget,
# ppo.reward_spread_penalty)
PPO_HEAD_SPREAD = Metric("ppo/head_spread", "mean spread (std) of the bootstrap heads' scores of an answer", "{:.4f}")
PPO_DRIFT_STOPPED = Metric("ppo/drift_stopped", "the drift budget ended PPO (1, on its last step only)", "{:.0f}")
