"""Steps 1-2 of a round on the main process: stale rounds, the preference set, the refusal on too few new pairs, what a
crashed round left to resume from, and the round's row and checkpoint folder. The plan is broadcast to every process."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from annotate.metrics import (ROUND_ACTOR_POLICY_ID, ROUND_MIN_ACCURACY, ROUND_NEW_PAIRS, ROUND_PAIRS_GENERATED,
                              ROUND_PAIRS_USED, ROUND_POLICY_ID, ROUND_PPO_PROMPTS, ROUND_REFERENCE,
                              ROUND_REWARD_MODEL_PATH, ROUND_STAGE, ROUND_VOTES)
from annotate.records import Preference
from annotate.store import Store
from loop.checks import RoundRefused
from loop.children.liveness import process_is_alive
from loop.config import LoopConfig

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
    """The latest policy: PPO starts from it."""
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


def _crashed_work(store: Store, n_preferences: int) -> tuple[str | None, int | None]:
    """What the most recent failed round finished before it died (reward model on the same votes, a policy)."""
    last_done = store.last_done_round()
    for round_ in reversed(store.rounds()):
        if last_done is not None and round_.id <= last_done.id:
            break
        if round_.status != "failed":
            continue
        metrics = round_.metrics
        policy_id = metrics.get(ROUND_POLICY_ID.name)
        if policy_id is not None and not metrics.get(ROUND_PAIRS_GENERATED.name):
            return metrics.get(ROUND_REWARD_MODEL_PATH), int(policy_id)
        reward_path = metrics.get(ROUND_REWARD_MODEL_PATH)
        if reward_path and metrics.get(ROUND_PAIRS_USED.name) == n_preferences and Path(reward_path).is_dir():
            return reward_path, None
    return None, None


def plan_round(store: Store, base_model: str, config: LoopConfig, exclude_prompts: set[str] | None = None,
               log: Log = print) -> RoundPlan:
    """Steps 1-2 on the main process: stale rounds, preference set, refusal on too few new pairs, a round row."""
    stale = store.mark_stale_rounds_failed(process_is_alive)
    if stale:
        log(f"Marked crashed round(s) {', '.join(map(str, stale))} as failed; resuming from what they finished.")
    store.ensure_base_policy(base_model)
    preferences = list(store.preferences())
    last_done = store.last_done_round()
    used_before = int(last_done.metrics.get(ROUND_PAIRS_USED.name, 0)) if last_done else 0
    new_pairs = len(preferences) - used_before
    reuse_reward, reuse_policy = _crashed_work(store, len(preferences))
    if reuse_policy is None and new_pairs < config.round.min_new_pairs:
        raise RoundRefused(
            f"Only {new_pairs} new preference pairs since the last round (minimum {config.round.min_new_pairs}; "
            f"{len(preferences)} in all). Collect more votes (ties, 'both bad' and skips do not count), "
            "or lower round.min_new_pairs with --set round.min_new_pairs=N."
        )
    latest, first = store.latest_policy(), store.first_policy()
    rng = random.Random(config.round.seed + len(store.rounds()))
    prompts = [p.text for p in store.prompts() if not exclude_prompts or p.text not in exclude_prompts]
    if not prompts:
        raise RoundRefused("No prompts in the database: import some with --import-prompts FILE.")
    ppo_prompts = rng.sample(prompts, min(config.round.ppo_prompts, len(prompts)))
    round_id = store.start_round(pid=os.getpid())
    policy_round = max(p.round for p in store.policies()) + 1
    out_dir = round_checkpoint_dir(config.round.checkpoints_dir, store.path, round_id)
    plan = RoundPlan(
        round_id=round_id, policy_round=policy_round, preferences=preferences, new_pairs=new_pairs,
        reference_path=first.path, actor_path=latest.path, actor_policy_id=latest.id,
        reward_warm_start=last_done.metrics.get(ROUND_REWARD_MODEL_PATH) if last_done else None,
        ppo_prompts=ppo_prompts, out_dir=str(out_dir), reuse_reward_path=reuse_reward, reuse_policy_id=reuse_policy,
    )
    store.update_round_metrics(round_id, {
        ROUND_PAIRS_USED.name: len(preferences), ROUND_NEW_PAIRS.name: new_pairs, ROUND_STAGE: "planned",
        ROUND_ACTOR_POLICY_ID: latest.id, ROUND_REFERENCE: first.path,
        ROUND_VOTES.name: store.count_votes_since(None), ROUND_MIN_ACCURACY.name: config.round.min_accuracy,
        ROUND_PPO_PROMPTS: ppo_prompts,
    })
    return plan


def round_checkpoint_dir(checkpoints_dir: str | Path, db_path: str | Path, round_id: int) -> Path:
    """`<checkpoints_dir>/<database name>/round-<id>`: round ids restart in every database, and a round replaces
    a folder of its own name (a crashed attempt), so two databases (a demo beside the real one) must never share one.
    """
    database = "memory" if str(db_path) == ":memory:" else Path(db_path).stem
    return Path(checkpoints_dir) / database / f"round-{round_id}"
