"""Steps 1-2 of a round on the main process: stale rounds, the preference set, the refusal on too few new pairs, what a
crashed round left to resume from, and the round's row and checkpoint folder. The plan is broadcast to every process."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from annotate.metrics import (RM_LIVE_PREFIX, RM_PREFIX, ROUND_ACTOR_POLICY_ID, ROUND_EXCLUDED_ANNOTATORS,
                              ROUND_MIN_ACCURACY, ROUND_NEW_PAIRS, ROUND_PAIRS_GENERATED, ROUND_PAIRS_USED,
                              ROUND_POLICY_ID, ROUND_PPO_PROMPTS, ROUND_REFERENCE, ROUND_RESUMED_FROM,
                              ROUND_REWARD_MODEL_PATH, ROUND_RM_STRATEGY, ROUND_SECONDS, ROUND_STAGE,
                              ROUND_STARTED_FROM, ROUND_VOTES, ROUND_WEIGHTING, stage_seconds)
from annotate.promotion import PromotionDecision, refresh_promotions
from annotate.records import Policy, Preference
from annotate.reliability import reliability_weighted
from annotate.store import Store
from loop.checks import RoundRefused
from loop.config import LoopConfig
from loop.memory import refuse_unfit_round

Log = Callable[[str], None]


@dataclass
class RoundPlan:
    """What the main process decided; broadcast to every process so all train the same thing."""

    round_id: int
    """Row of this round in the rounds table."""
    policy_round: int
    """Round number the new policy is recorded under (last policy's + 1)."""
    preferences: list[Preference]
    """Every pair with a majority among its a/b votes, all rounds, as the store gives them (its source, by which
    held-out accuracy is reported, and its strength go to the reward trainers unchanged)."""
    new_pairs: int
    """Preference pairs that arrived since the last finished round."""
    reference_path: str
    """The first policy (base or SFT): PPO's frozen reference, and the reward model's init on round one."""
    actor_path: str
    """The current policy (the last promoted: annotate.promotion): PPO starts from it."""
    actor_policy_id: int
    """Its row in the policies table (parent of the new policy)."""
    reward_warm_start: str | None
    """The last finished round's reward model, continued from; None trains from the reference."""
    ppo_prompts: list[str]
    """Prompts PPO trains on this round."""
    out_dir: str
    """Folder of this round's checkpoints."""
    reuse_reward_path: str | None = None
    """A reward model a crashed round finished on the same votes: not trained again."""
    reuse_policy_id: int | None = None
    """A policy a crashed round saved: the round only generates its pairs."""
    reuse_pairs: bool = False
    """The crashed round had queued its next pairs too: the round only finishes (its report, its row)."""
    carried: dict = field(default_factory=dict)
    """What the crashed round recorded of the work reused (its accuracy, PPO figures, seconds...), recorded again in
    this round, so the finished round names its reward model and shows its numbers."""


@dataclass
class CrashedWork:
    """What the most recent failed round finished before it died, and the plan it had made."""

    round_id: int
    metrics: dict
    """Everything it recorded (loop.round records each stage's output as soon as it exists)."""
    reward_path: str | None = None
    """Its reward model, when it was trained on the votes the new round has."""
    policy_id: int | None = None
    """Its saved policy."""

    @property
    def pairs_made(self) -> bool:
        return ROUND_PAIRS_GENERATED.name in self.metrics

    def carried(self) -> dict:
        """The metrics of the work reused, under their names: all but the stage and the whole-round seconds when the
        policy is reused; the reward model's figures alone when only it is."""
        if self.policy_id is not None:
            kept = {k: v for k, v in self.metrics.items() if k not in (ROUND_STAGE, ROUND_SECONDS.name)}
        else:
            reward_keys = (ROUND_RM_STRATEGY, ROUND_REWARD_MODEL_PATH, stage_seconds("reward").name)
            kept = {k: v for k, v in self.metrics.items() if k.startswith(RM_PREFIX) or k in reward_keys}
        kept = {k: v for k, v in kept.items() if not k.startswith(RM_LIVE_PREFIX)}
        return {**kept, ROUND_RESUMED_FROM: self.round_id}


def crashed_work(store: Store, n_preferences: int) -> CrashedWork | None:
    """The most recent failed round (since the last finished one) that left a policy, or a reward model trained on
    the same `n_preferences` votes; None when there is nothing to go on from."""
    last_done = store.last_done_round()
    for round_ in reversed(store.rounds()):
        if last_done is not None and round_.id <= last_done.id:
            break
        if round_.status != "failed":
            continue
        metrics = round_.metrics
        reward_path = metrics.get(ROUND_REWARD_MODEL_PATH)
        if metrics.get(ROUND_POLICY_ID.name) is not None:
            return CrashedWork(round_.id, metrics, reward_path, int(metrics[ROUND_POLICY_ID.name]))
        if reward_path and metrics.get(ROUND_PAIRS_USED.name) == n_preferences and Path(reward_path).is_dir():
            return CrashedWork(round_.id, metrics, reward_path)
    return None


def plan_round(store: Store, base_model: str, config: LoopConfig, exclude_prompts: set[str] | None = None,
               log: Log = print) -> RoundPlan:
    """Steps 1-2 on the main process (which holds the round lock): stale rounds, preference set, refusal on too few
    new pairs, a round row. A round resumed from a crashed one keeps the crashed one's plan: its actor (so its versus
    pairs set the new policy against the policy before it, not against itself), reference and PPO prompts."""
    stale = store.mark_stale_rounds_failed(lambda pid: False)  # we hold the lock: any `running` row is a dead one
    if stale:
        log(f"Marked crashed round(s) {', '.join(map(str, stale))} as failed; resuming from what they finished.")
    store.ensure_base_policy(base_model)
    preferences = list(store.preferences())
    if config.votes.weighting == "reliability":  # each pair weighted by how sure its votes are
        preferences = reliability_weighted(store, preferences)
    last_done = store.last_done_round()
    used_before = int(last_done.metrics.get(ROUND_PAIRS_USED.name, 0)) if last_done else 0
    new_pairs = len(preferences) - used_before
    crashed = crashed_work(store, len(preferences))
    reuse_policy = crashed.policy_id if crashed else None
    if reuse_policy is None and new_pairs < config.round.min_new_pairs:
        raise RoundRefused(
            f"Only {new_pairs} new preference pairs since the last round (minimum {config.round.min_new_pairs}; "
            f"{len(preferences)} in all). Collect more votes (ties, 'both bad' and skips do not count), "
            "or lower round.min_new_pairs with --set round.min_new_pairs=N."
        )
    _refuse_heads_settings(config, len(preferences), reuse_policy)
    held_back = _refresh_promotions(store, config, log)
    actor, first = _actor_and_reference(store, crashed)
    if reuse_policy is None:  # PPO runs: refused here when it would not fit, before any model loads
        refuse_unfit_round(config, actor.path)
    ppo_prompts = _ppo_prompts(store, config, exclude_prompts, crashed)
    round_id = store.start_round(pid=os.getpid())
    policy_round = max(p.round for p in store.policies()) + 1
    out_dir = round_checkpoint_dir(config.round.checkpoints_dir, store.path, round_id)
    plan = RoundPlan(
        round_id=round_id, policy_round=policy_round, preferences=preferences, new_pairs=new_pairs,
        reference_path=first, actor_path=actor.path, actor_policy_id=actor.id,
        reward_warm_start=last_done.metrics.get(ROUND_REWARD_MODEL_PATH) if last_done else None,
        ppo_prompts=ppo_prompts, out_dir=str(out_dir), reuse_reward_path=crashed.reward_path if crashed else None,
        reuse_policy_id=reuse_policy, reuse_pairs=bool(crashed and reuse_policy and crashed.pairs_made),
        carried=crashed.carried() if crashed else {},
    )
    store.update_round_metrics(round_id, {
        ROUND_PAIRS_USED.name: len(preferences), ROUND_NEW_PAIRS.name: new_pairs, ROUND_STAGE: "planned",
        ROUND_ACTOR_POLICY_ID: actor.id, ROUND_REFERENCE: first,
        ROUND_VOTES.name: store.count_votes_since(None), ROUND_MIN_ACCURACY.name: config.round.min_accuracy,
        ROUND_PPO_PROMPTS: ppo_prompts, ROUND_STARTED_FROM: held_back,
        ROUND_EXCLUDED_ANNOTATORS: store.excluded_annotators(), ROUND_WEIGHTING: config.votes.weighting,
        **plan.carried,  # a reused policy's own counts of votes and pairs win
    })
    return plan


def _refuse_heads_settings(config: LoopConfig, n_preferences: int, reuse_policy: int | None) -> None:
    """RoundRefused before anything trains when ppo.reward_spread_penalty or ppo.drift_budget is on and the reward
    model this round trains will have no bootstrap heads PPO can read (rlhf.reward.strategies.score_heads)."""
    from rlhf.ppo.config import NeedsHeads
    from rlhf.reward.strategies import choose_strategy

    strategy = choose_strategy(n_preferences, config.votes)
    if reuse_policy is not None or (strategy != "full" and config.votes.n_heads >= 2):
        return  # head, ensemble and lpft (its heads fitted on its own features: StrategyConfig.tuned_heads) have them
    try:
        config.ppo.refuse_without_heads(f"this round trains a {strategy!r} reward model on {n_preferences} preference "
                                        f"pairs with votes.n_heads = {config.votes.n_heads}")
    except NeedsHeads as error:
        raise RoundRefused(str(error)) from None


def _refresh_promotions(store: Store, config: LoopConfig, log: Log) -> str:
    """Every promotion decision taken again on the votes in now (annotate.promotion), the changes logged; a line on the
    policy the round starts from and the newer candidates it passes over (recorded as round/started_from)."""
    for policy, decision in refresh_promotions(store, config.promotion, config.votes.weighting):
        log(f"Policy {policy.id} (round {policy.round}) is {'now promoted' if decision.promoted else 'held back'}: "
            f"{decision.reason}.")
    current = store.current_policy()
    passed = [p for p in store.policies() if (p.round, p.id) > (current.round, current.id)]
    line = f"policy {current.id} (round {current.round}), the last promoted"
    for policy in passed:
        decision = PromotionDecision.from_json(policy.promotion)
        line += f"; policy {policy.id} (round {policy.round}) stays a candidate" + \
            (f": {decision.reason}" if decision is not None else "")
    log(f"The round starts from {line}.")
    return line


def _actor_and_reference(store: Store, crashed: CrashedWork | None) -> tuple[Policy, str]:
    """(the policy PPO starts from, the reference's path): the current (last promoted) and the first policy, or those
    the crashed round recorded; RoundRefused for an actor whose folder was pruned (a guard: loop.retention keeps
    both)."""
    actor, reference = store.current_policy(), store.first_policy().path
    if crashed is not None and crashed.metrics.get(ROUND_ACTOR_POLICY_ID) is not None:
        actor = store.policy(int(crashed.metrics[ROUND_ACTOR_POLICY_ID]))
        reference = crashed.metrics.get(ROUND_REFERENCE, reference)
    if actor.pruned:
        raise RoundRefused(f"The round cannot start: {actor.pruned_sentence()}")
    return actor, reference


def _ppo_prompts(store: Store, config: LoopConfig, exclude_prompts: set[str] | None,
                 crashed: CrashedWork | None) -> list[str]:
    """round.ppo_prompts prompts drawn with the round's seed, outside `exclude_prompts`; the crashed round's own."""
    if crashed is not None and crashed.metrics.get(ROUND_PPO_PROMPTS):
        return list(crashed.metrics[ROUND_PPO_PROMPTS])
    rng = random.Random(config.round.seed + len(store.rounds()))
    prompts = [p.text for p in store.prompts() if not exclude_prompts or p.text not in exclude_prompts]
    if not prompts:
        raise RoundRefused("No prompts in the database: import some with --import-prompts FILE.")
    return rng.sample(prompts, min(config.round.ppo_prompts, len(prompts)))


def round_checkpoint_dir(checkpoints_dir: str | Path, db_path: str | Path, round_id: int) -> Path:
    """`<checkpoints_dir>/<database name>/round-<id>`: round ids restart in every database, and a round replaces
    a folder of its own name (a crashed attempt), so two databases (a demo beside the real one) must never share one.
    """
    return database_checkpoint_dir(checkpoints_dir, db_path) / f"round-{round_id}"


def database_checkpoint_dir(checkpoints_dir: str | Path, db_path: str | Path) -> Path:
    """`<checkpoints_dir>/<database name>`: the folder of one database's round folders (and its caches), the only one
    loop.retention ever deletes in."""
    database = "memory" if str(db_path) == ":memory:" else Path(db_path).stem
    return Path(checkpoints_dir) / database


def feature_cache_dir(round_dir: str | Path) -> Path:
    """`<checkpoints_dir>/<database name>/features`, beside the round folders (`round_dir` is one): the reward stage's
    cached features of every answer voted on (rlhf.reward.feature_cache), kept across rounds. A cache, safe to
    delete: the next round computes them again."""
    return Path(round_dir).parent / "features"
