"""One round of the loop: votes -> reward model -> PPO -> new policy -> next pairs.

The one place that reads votes from the store and hands data to the trainers. Under `accelerate launch`
every process trains; only the main process takes the lock, reads and writes the database and
generates the next pairs; the plan it makes is broadcast to the others.

Crash safety: each finished stage records what it produced in the round's metrics (`round/reward_model_path`,
`round/policy_id`) as soon as it exists, and checkpoints are written to a staging folder then renamed. A
crashed round is marked `failed` by the next start, which picks up what the crashed one finished.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from annotate.store import Store
from loop.checks import RoundRefused, check_accuracy
from loop.config import LoopConfig, function_ppo_settings, ppo_settings, strategy_settings
from loop.round_lock import RoundBusy, RoundLock
from loop.round_plan import Log, RoundPlan, plan_round
from rlhf.distributed import broadcast_from_main, is_main_process, wait_for_everyone
from rlhf.ppo.config import RewardFunction

__all__ = ["RoundBusy", "RoundLock", "RoundRefused", "RoundResult", "run_round"]


@dataclass
class RoundResult:
    """What a finished round produced."""

    round_id: int
    policy_id: int
    metrics: dict = field(default_factory=dict)


def _publish(staging: Path, target: Path) -> Path:
    """Rename a finished checkpoint into place, so a crash never leaves a half-written folder under its name."""
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target


def _silent(message: str) -> None:
    """The log of the processes other than the main one."""


def run_round(db_path: str | Path, base_model: str, config: LoopConfig, log: Log = print,
              exclude_prompts: set[str] | None = None,
              reward_function: RewardFunction | None = None,
              ceiling_reward: RewardFunction | None = None) -> RoundResult:
    """Run one round end to end (steps 1-6 of DESIGN.md "The round"); raises RoundRefused with the reason.

    `exclude_prompts` (the demo's evaluation prompts) are kept out of PPO and of the next pairs.
    `reward_function` (texts of answers -> scores) replaces the reward model as PPO's reward; the reward model is still
    trained and its accuracy checked and recorded. `ceiling_reward` adds a second PPO run from the same policy with
    that reward (`_ceiling_stage`): its policy is a folder only, recorded as round/ceiling_policy_path.
    """
    is_main = is_main_process()
    if not is_main:
        log = _silent  # every process runs the stages; one tells the user about them
    store = Store(db_path) if is_main else None
    lock = RoundLock(db_path) if is_main else None
    plan, refusal = None, None
    if is_main:
        try:
            lock.acquire()
            plan = plan_round(store, base_model, config, exclude_prompts, log)
        except RoundRefused as error:
            refusal = error
            lock.release()
    plan, refusal = broadcast_from_main((plan, refusal))  # the refusal itself, so every process raises the same kind
    if refusal is not None:
        raise refusal
    started = time.perf_counter()
    metrics: dict = {}

    def record(values: dict) -> None:
        metrics.update(values)
        if is_main:
            store.update_round_metrics(plan.round_id, values)

    def timed(stage: str, run_stage, *stage_args):
        """A stage's result; its wall seconds recorded as round/<stage>_seconds."""
        stage_started = time.perf_counter()
        outcome = run_stage(*stage_args)
        record({f"round/{stage}_seconds": time.perf_counter() - stage_started})
        return outcome

    try:
        policy_id, reward_path = plan.reuse_policy_id, plan.reuse_reward_path
        if policy_id is None:
            reward_path = timed("reward", _reward_stage, plan, base_model, config, record, log)
            policy_id = timed("ppo", _ppo_stage, plan, reward_path, config, record, log, store, reward_function)
            if ceiling_reward is not None:  # the demo's measurement, not the round's work: timed apart
                timed("ceiling", _ceiling_stage, plan, reward_path, config, record, log, ceiling_reward)
        else:
            log(f"Round {plan.round_id}: policy {policy_id} was saved by a crashed round; generating its pairs.")
            record({"round/policy_id": policy_id, "round/resumed_policy": True})
        if is_main:
            record({"round/stage": "pairs"})
            made = timed("pairs", _pairs_stage, store, plan, policy_id, config, log, reward_path, record,
                         frozenset(exclude_prompts or ()))
            record({"round/pairs_generated": made, "round/seconds": time.perf_counter() - started,
                    "round/stage": "done"})
            store.finish_round(plan.round_id)
        wait_for_everyone()
    except BaseException as error:
        if is_main:
            store.fail_round(plan.round_id, f"{type(error).__name__}: {error}")
        raise
    finally:
        if is_main:
            lock.release()
            store.close()
    return RoundResult(round_id=plan.round_id, policy_id=policy_id, metrics=metrics)


def _reward_stage(plan: RoundPlan, base_model: str, config: LoopConfig, record, log: Log) -> str:
    """Step 3: train the reward model on every preference with the strategy the vote count calls for
    (rlhf.reward.strategies), then refuse PPO on a model that cannot be told from chance."""
    from rlhf.reward.data import PreferencePair
    from rlhf.reward.strategies import choose_strategy, train_strategy

    if plan.reuse_reward_path:
        log(f"Round {plan.round_id}: reusing the reward model a crashed round trained on the same votes.")
        record({"round/reward_model_path": plan.reuse_reward_path})
        return plan.reuse_reward_path
    votes = config.votes
    strategy = choose_strategy(len(plan.preferences), votes)
    record({"round/stage": "reward", "round/rm_strategy": strategy})
    out_dir = Path(plan.out_dir) / "reward"
    staging = Path(plan.out_dir) / ".reward-staging"
    seed = config.round.seed + plan.round_id
    strategy_config = strategy_settings(config, seed, plan.reward_warm_start)
    log(f"Round {plan.round_id}: training the reward model ({strategy}) on {len(plan.preferences)} preference pairs "
        f"({plan.new_pairs} new){' from the last one' if strategy == 'full' and plan.reward_warm_start else ''}.")
    pairs = [PreferencePair(*row) for row in plan.preferences]
    model = train_strategy(strategy, pairs, plan.reference_path, strategy_config,
                           on_progress=lambda m: record({"rm/live_" + k.split("/")[-1]: v for k, v in m.items()}))
    if is_main_process():
        model.save(staging)
        _publish(staging, out_dir)
    wait_for_everyone()
    check_accuracy(model.metrics, plan, config, record, log)
    record({"round/reward_model_path": str(out_dir)})
    return str(out_dir)


def _ppo_stage(plan: RoundPlan, reward_path: str, config: LoopConfig, record, log: Log, store,
               reward_function: RewardFunction | None = None) -> int | None:
    """Steps 4-5: PPO from the last policy against the first (rewarded by the reward model, or by `reward_function`
    with its scores normalised: function_ppo_settings), then save and record the new policy."""
    from rlhf.ppo.model_card import write_model_card
    from rlhf.ppo.train import reward_label, summarise_ppo, train_ppo

    record({"round/stage": "ppo"})
    ppo_config = ppo_settings(config, reward_path, plan.round_id)
    adapted = " (head reward model: scores normalised, GAE lambda 1)" if ppo_config.lam != config.ppo.lam or \
        ppo_config.normalize_rewards != config.ppo.normalize_rewards else ""
    if reward_function is not None:
        ppo_config = function_ppo_settings(ppo_config)
        adapted = " rewarded by a function of the answers' text in place of the reward model (scores normalised)"
    log(f"Round {plan.round_id}: PPO on {len(plan.ppo_prompts)} prompts from policy {plan.actor_policy_id}{adapted}.")
    record({"round/normalize_rewards": ppo_config.normalize_rewards, "round/ppo_lam": ppo_config.lam,
            "round/ppo_seed": ppo_config.seed, "round/ppo_reward": "model" if reward_function is None else "function"})
    history: list[dict] = []

    def on_step(step_metrics: dict) -> None:
        history.append(step_metrics)
        record({"history": history})

    staging = Path(plan.out_dir) / ".policy-staging"
    result = train_ppo(plan.actor_path, reward_path, plan.ppo_prompts, ppo_config, staging,
                       reference_path=plan.reference_path, on_step=on_step, reward_function=reward_function)
    policy_id = None
    if is_main_process():
        summary = summarise_ppo(result.history)
        # the round's card over train_ppo's, before the rename: a published policy folder always has one
        write_model_card(staging, plan.reference_path, round_number=plan.policy_round, n_pairs=len(plan.preferences),
                         n_votes=store.count_votes_since(None), sampling=ppo_config.sampling,
                         metrics={**store.round(plan.round_id).metrics, **summary},
                         reward_model=reward_label(reward_path, reward_function))
        target = _publish(staging, Path(plan.out_dir) / "policy")
        policy_id = store.add_policy(plan.policy_round, str(target), parent_id=plan.actor_policy_id)
        record({**summary, "round/policy_id": policy_id, "round/policy_path": str(target)})
        log(f"Round {plan.round_id}: saved policy {policy_id} (round {plan.policy_round}) to {target}.")
    return broadcast_from_main(policy_id)


def _ceiling_stage(plan: RoundPlan, reward_path: str, config: LoopConfig, record, log: Log,
                   reward_function: RewardFunction) -> None:
    """PPO once more from the round's starting policy, rewarded by `reward_function` (the demo's oracle) with the
    settings and seed of the round's own PPO (function_ppo_settings), the critic again from the round's reward model:
    what the round's PPO budget buys with a perfect reward. Saved as a folder beside the round's policy
    (`ceiling-policy`), never as a policy row, so the loop, its next pairs and the app go on from the round's own
    policy; its path is round/ceiling_policy_path and its mean step metrics ceiling/* (ceiling/kl, ceiling/score...).
    """
    from rlhf.ppo.train import summarise_ppo, train_ppo

    record({"round/stage": "ceiling"})
    ppo_config = function_ppo_settings(ppo_settings(config, reward_path, plan.round_id))
    log(f"Round {plan.round_id}: the ceiling: PPO again from policy {plan.actor_policy_id} on the same prompts, "
        "rewarded by the annotator's own score.")
    staging = Path(plan.out_dir) / ".ceiling-staging"
    result = train_ppo(plan.actor_path, reward_path, plan.ppo_prompts, ppo_config, staging,
                       reference_path=plan.reference_path, reward_function=reward_function)
    if is_main_process():
        target = _publish(staging, Path(plan.out_dir) / "ceiling-policy")
        summary = summarise_ppo(result.history)
        record({**{"ceiling/" + key.split("/", 1)[1]: value for key, value in summary.items()
                   if key.startswith("ppo/")}, "round/ceiling_policy_path": str(target)})
        log(f"Round {plan.round_id}: saved the ceiling's policy to {target} (not a policy of the loop).")
    wait_for_everyone()


def _pairs_stage(store: Store, plan: RoundPlan, policy_id: int, config: LoopConfig, log: Log,
                 reward_path: str | None = None, record=None,
                 exclude_prompts: frozenset[str] = frozenset()) -> int:
    """Step 6: the next batch of pairs from the new policy: a share against an earlier policy, the sample pairs
    chosen where the reward model's bootstrap heads disagree most (over-sampled answers), plus a random share; none
    for the prompts kept out of the round (the demo's evaluation prompts)."""
    from loop.pair_request import PairBar, PairRequest
    from loop.pairs import queue_pairs
    from loop.policies import load_pair_judge

    earlier = plan.actor_policy_id
    n_pairs = config.round.next_pairs
    log(f"Round {plan.round_id}: generating {n_pairs} pairs from policy {policy_id} "
        f"({config.round.versus_share:.0%} against policy {earlier}).")
    judge = load_pair_judge(reward_path, config.votes)
    request = PairRequest(n_pairs, policy_id, versus_share=config.round.versus_share, versus_policy_id=earlier,
                          sampling=config.sampling, seed=config.round.seed + plan.round_id,
                          batch_size=config.pairs.batch_size, exclude_prompts=exclude_prompts)
    report = queue_pairs(store, request, config.votes, judge=judge, progress=PairBar())
    if judge is not None:
        share = min(report.stats.get("active/uncertain", 0.0) / max(report.sample, 1), 1.0)
        if record is not None:
            record({"round/active_share": share,
                    "round/active_candidates_answers": report.stats.get("active/candidate_answers", 0.0)})
        log(f"Round {plan.round_id}: {report.sample} sample pairs, {share:.0%} chosen for the reward model's "
            f"disagreement from {config.votes.oversample} answers a prompt.")
    return report.written
