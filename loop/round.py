"""One round of the loop: votes -> reward model -> PPO -> new policy -> next pairs.

The one place that reads votes from the store and hands data to the trainers. Under `accelerate launch`
every process trains; only the main process takes the lock, reads and writes the database and
generates the next pairs; the plan it makes is broadcast to the others.

Crash safety: each finished stage records what it produced in the round's metrics (`round/reward_model_path`,
`round/policy_id`) as soon as it exists, and checkpoints are written to a staging folder then renamed. A
crashed round is marked `failed` by the next start, which picks up what the crashed one finished.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from annotate.metrics import (ACTIVE_CANDIDATE_ANSWERS, ACTIVE_UNCERTAIN, HISTORY, PEOPLE_MODEL_AGREEMENT, PPO_PREFIX,
                              RM_INCREMENTAL, RM_LIVE_PREFIX, RM_N_NEW, RM_N_REPLAY, RM_PREFIX,
                              ROUND_ACTIVE_CANDIDATE_ANSWERS, ROUND_ACTIVE_SHARE,
                              ROUND_CEILING_POLICY_PATH, ROUND_NORMALIZE_REWARDS, ROUND_PAIRS_GENERATED,
                              ROUND_POLICY_ID, ROUND_POLICY_PATH, ROUND_PPO_LAM, ROUND_PPO_REWARD, ROUND_PPO_SEED,
                              ROUND_PROMOTED, ROUND_PROMOTION, ROUND_RESUMED_FROM, ROUND_RESUMED_POLICY,
                              ROUND_REWARD_MODEL_PATH, ROUND_RM_STRATEGY, ROUND_SECONDS, ROUND_STAGE, ceiling_name,
                              stage_seconds)
from annotate.promotion import decide_for
from annotate.store import Store
from loop.checks import RoundRefused, check_accuracy
from loop.config import LoopConfig, function_ppo_settings, ppo_settings, strategy_settings
from loop.memory import with_engine
from loop.model_agreement import model_agreement
from loop.round_lock import RoundLock
from loop.round_plan import Log, RoundPlan, feature_cache_dir, plan_round
from rlhf.distributed import broadcast_from_main, is_main_process, wait_for_everyone
from rlhf.folders import replace_folder
from rlhf.ppo.config import RewardFunction


@dataclass
class RoundResult:
    """What a finished round produced."""

    round_id: int
    policy_id: int
    metrics: dict = field(default_factory=dict)


def _silent(message: str) -> None:
    """The log of the processes other than the main one."""


@dataclass
class RoundRun:
    """One round as it runs on this process: its plan and settings, the store and the lock (None on the processes
    other than the main one), its log, and the metrics it has recorded so far."""

    plan: RoundPlan
    config: LoopConfig
    store: Store | None
    log: Log = print
    lock: RoundLock | None = None
    metrics: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    @property
    def is_main(self) -> bool:
        return self.store is not None

    def record(self, values: dict) -> None:
        """Keep `values` and, on the main process, merge them into the round's metrics in the store at once."""
        self.metrics.update(values)
        if self.store is not None:
            self.store.update_round_metrics(self.plan.round_id, values)

    def timed(self, stage: str, run_stage: Callable, *stage_args):
        """A stage's result; its wall seconds recorded as round/<stage>_seconds."""
        stage_started = time.perf_counter()
        outcome = run_stage(self, *stage_args)
        self.record({stage_seconds(stage).name: time.perf_counter() - stage_started})
        return outcome

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if self.store is not None:
            self.store.close()


def start_round(db_path: str | Path, base_model: str, config: LoopConfig, exclude_prompts: set[str] | None,
                log: Log) -> RoundRun:
    """Steps 1-2: on the main process the lock and the plan (loop.round_plan), broadcast to every process; a refusal
    is raised on every process, as the same kind."""
    if not is_main_process():
        plan, refusal = broadcast_from_main((None, None))
        if refusal is not None:
            raise refusal
        return RoundRun(plan, config, None, _silent, metrics=dict(plan.carried))  # every process runs the stages
    store, lock = Store(db_path), RoundLock(db_path)
    plan = refusal = None
    try:
        lock.acquire()
        plan = plan_round(store, base_model, config, exclude_prompts, log)
    except RoundRefused as error:
        refusal = error
        lock.release()
        store.close()
    broadcast_from_main((plan, refusal))  # the refusal itself, so every process raises the same kind
    if refusal is not None:
        raise refusal
    if plan.carried:
        log(f"Round {plan.round_id}: going on from crashed round {plan.carried[ROUND_RESUMED_FROM]} (its figures "
            "carried).")
    return RoundRun(plan, config, store, log, lock, metrics=dict(plan.carried))


def _train(run: RoundRun, base_model: str, reward_function: RewardFunction | None,
           ceiling_reward: RewardFunction | None) -> tuple[int, str | None]:
    """Steps 3-5, or what a crashed round left of them: (the new policy's id, the reward model's folder)."""
    plan = run.plan
    if plan.reuse_policy_id is not None:
        run.log(f"Round {plan.round_id}: policy {plan.reuse_policy_id} was saved by a crashed round; generating its "
                "pairs.")
        run.record({ROUND_POLICY_ID.name: plan.reuse_policy_id, ROUND_RESUMED_POLICY: True})
        return plan.reuse_policy_id, plan.reuse_reward_path
    reward_path = run.timed("reward", _reward_stage, base_model)
    policy_id = run.timed("ppo", _ppo_stage, reward_path, reward_function)
    if ceiling_reward is not None:  # the demo's measurement, not the round's work: timed apart
        run.timed("ceiling", _ceiling_stage, reward_path, ceiling_reward)
    return policy_id, reward_path


def run_round(db_path: str | Path, base_model: str, config: LoopConfig, log: Log = print,
              exclude_prompts: set[str] | None = None,
              reward_function: RewardFunction | None = None,
              ceiling_reward: RewardFunction | None = None, make_report: bool = True) -> RoundResult:
    """Run one round end to end (steps 1-6 of docs/design.md, "The round"); raises RoundRefused with the reason.

    `exclude_prompts` (the demo's evaluation prompts) are kept out of PPO and of the next pairs.
    `reward_function` (texts of answers -> scores) replaces the reward model as PPO's reward; the reward model is still
    trained and its accuracy checked and recorded. `ceiling_reward` adds a second PPO run from the same policy with
    that reward (`_ceiling_stage`): its policy is a folder only, recorded as round/ceiling_policy_path. The round ends
    with its report (loop.report) unless `make_report` is False (the demo loop makes it from its own answers) or
    round.report_prompts is 0.
    """
    run = start_round(db_path, base_model, config, exclude_prompts, log)
    try:
        policy_id, reward_path = _train(run, base_model, reward_function, ceiling_reward)
        if run.is_main:
            _finish(run, policy_id, reward_path, frozenset(exclude_prompts or ()), make_report)
        wait_for_everyone()
    except BaseException as error:
        if run.is_main:
            run.store.fail_round(run.plan.round_id, f"{type(error).__name__}: {error}")
        raise
    finally:
        run.close()
    return RoundResult(round_id=run.plan.round_id, policy_id=policy_id, metrics=run.metrics)


def _finish(run: RoundRun, policy_id: int, reward_path: str | None, exclude_prompts: frozenset[str],
            make_report: bool) -> None:
    """Step 6 and the round's end, on the main process: the new policy promoted or kept a candidate
    (annotate.promotion), the next pairs (not again when the crashed round this one goes on from had queued them), the
    report, the round's row marked done, then the checkpoints no rule keeps deleted (loop.retention,
    round.keep_policies), the lock still held."""
    from loop.retention import prune_after_round

    _promotion_stage(run, policy_id)
    if not run.plan.reuse_pairs:
        run.record({ROUND_STAGE: "pairs"})
        made = run.timed("pairs", _pairs_stage, policy_id, reward_path, exclude_prompts)
        run.record({ROUND_PAIRS_GENERATED.name: made})
    if make_report and run.config.round.report_prompts > 0:
        run.timed("report", _report_stage)
    run.record({ROUND_SECONDS.name: time.perf_counter() - run.started, ROUND_STAGE: "done"})
    run.store.finish_round(run.plan.round_id)
    prune_after_round(run.store, run.config, run.plan.round_id, run.log)


def _promotion_stage(run: RoundRun, policy_id: int) -> None:
    """The new policy promoted (it writes the next sample pairs and the next round starts from it) or kept a candidate
    on the evidence at the round's end, before people have voted on its versus pairs (annotate.promotion)."""
    decision = decide_for(run.store, run.store.policy(policy_id), run.config.promotion,
                          weighting=run.config.votes.weighting)
    run.record({ROUND_PROMOTED.name: int(decision.promoted), ROUND_PROMOTION: asdict(decision)})
    verdict = "promoted" if decision.promoted else "kept a candidate, not promoted"
    run.log(f"Round {run.plan.round_id}: policy {policy_id} is {verdict} ({decision.rule}: {decision.reason}); "
            "people's votes on its versus pairs decide again at the next round's start.")


def _reward_stage(run: RoundRun, base_model: str) -> str:
    """Step 3: train the reward model on every preference with the strategy the vote count calls for
    (rlhf.reward.strategies), then refuse PPO on a model that cannot be told from chance."""
    from rlhf.reward.strategies import choose_strategy, train_strategy

    plan, config, record, log = run.plan, run.config, run.record, run.log
    if plan.reuse_reward_path:
        log(f"Round {plan.round_id}: reusing the reward model a crashed round trained on the same votes.")
        check_accuracy({k: v for k, v in plan.carried.items() if k.startswith(RM_PREFIX)}, plan, config, record, log)
        record({ROUND_REWARD_MODEL_PATH: plan.reuse_reward_path})
        return plan.reuse_reward_path
    votes = config.votes
    strategy = choose_strategy(len(plan.preferences), votes)
    record({ROUND_STAGE: "reward", ROUND_RM_STRATEGY: strategy})
    out_dir = Path(plan.out_dir) / "reward"
    staging = Path(plan.out_dir) / ".reward-staging"
    seed = config.round.seed + plan.round_id
    strategy_config = strategy_settings(config, seed, plan.reward_warm_start)
    log(f"Round {plan.round_id}: training the reward model ({strategy}) on {len(plan.preferences)} preference pairs "
        f"({plan.new_pairs} new){' from the last one' if strategy == 'full' and plan.reward_warm_start else ''}.")
    model = train_strategy(strategy, plan.preferences, plan.reference_path, strategy_config,
                           on_progress=lambda m: record({RM_LIVE_PREFIX + k.split("/")[-1]: v for k, v in m.items()}),
                           feature_cache=feature_cache_dir(plan.out_dir))
    if model.metrics.get(RM_INCREMENTAL.name):
        log(f"Round {plan.round_id}: LP-FT went on from the last round's model on its {model.metrics[RM_N_NEW.name]} "
            f"new and {model.metrics[RM_N_REPLAY.name]} replayed votes (votes.incremental).")
    model.refuse_non_finite()  # on every process, before the main one saves: NaN weights are never published
    if run.is_main:
        model.save(staging)
        replace_folder(staging, out_dir)
        record({PEOPLE_MODEL_AGREEMENT: model_agreement(run.store.ab_vote_texts(), model, strategy_config)})
    wait_for_everyone()
    check_accuracy(model.metrics, plan, config, record, log)
    record({ROUND_REWARD_MODEL_PATH: str(out_dir)})
    return str(out_dir)


def _ppo_stage(run: RoundRun, reward_path: str, reward_function: RewardFunction | None = None) -> int | None:
    """Steps 4-5: PPO from the last policy against the first (rewarded by the reward model, or by `reward_function`
    with its scores normalised: function_ppo_settings), then save and record the new policy."""
    from rlhf.ppo.train import reward_label, train_ppo

    plan, config, record, log = run.plan, run.config, run.record, run.log
    record({ROUND_STAGE: "ppo"})
    ppo_config = with_engine(ppo_settings(config, reward_path, plan.round_id), config, plan.actor_path)
    adapted = " (head reward model: scores normalised, GAE lambda 1)" if ppo_config.lam != config.ppo.lam or \
        ppo_config.normalize_rewards != config.ppo.normalize_rewards else ""
    if reward_function is not None:
        ppo_config = function_ppo_settings(ppo_config)
        adapted = " rewarded by a function of the answers' text in place of the reward model (scores normalised)"
    log(f"Round {plan.round_id}: PPO on {len(plan.ppo_prompts)} prompts from policy {plan.actor_policy_id}{adapted}.")
    record({ROUND_NORMALIZE_REWARDS: ppo_config.normalize_rewards, ROUND_PPO_LAM: ppo_config.lam,
            ROUND_PPO_SEED: ppo_config.seed, ROUND_PPO_REWARD: "model" if reward_function is None else "function"})
    history: list[dict] = []

    def on_step(step_metrics: dict) -> None:
        history.append(step_metrics)
        record({HISTORY: history})

    staging = Path(plan.out_dir) / ".policy-staging"
    result = train_ppo(plan.actor_path, reward_path, plan.ppo_prompts, ppo_config, staging,
                       reference_path=plan.reference_path, on_step=on_step, reward_function=reward_function)
    policy_id = _publish_policy(run, staging, result.history, ppo_config, reward_label(reward_path, reward_function))
    return broadcast_from_main(policy_id)


def _publish_policy(run: RoundRun, staging: Path, history: list[dict], ppo_config, reward: str) -> int | None:
    """Step 5 on the main process: the round's model card over train_ppo's (before the rename: a published policy
    folder always has one), the folder renamed into place and recorded as the new policy; None elsewhere."""
    from loop.model_card import write_model_card
    from rlhf.ppo.train import summarise_ppo

    if not run.is_main:
        return None
    plan, store = run.plan, run.store
    summary = summarise_ppo(history)
    write_model_card(staging, plan.reference_path, round_number=plan.policy_round, n_pairs=len(plan.preferences),
                     n_votes=store.count_votes_since(None), sampling=ppo_config.sampling,
                     metrics={**store.round(plan.round_id).metrics, **summary}, reward_model=reward)
    target = replace_folder(staging, Path(plan.out_dir) / "policy")
    policy_id = store.add_policy(plan.policy_round, str(target), parent_id=plan.actor_policy_id)
    run.record({**summary, ROUND_POLICY_ID.name: policy_id, ROUND_POLICY_PATH: str(target)})
    run.log(f"Round {plan.round_id}: saved policy {policy_id} (round {plan.policy_round}) to {target}.")
    return policy_id


def _ceiling_stage(run: RoundRun, reward_path: str, reward_function: RewardFunction) -> None:
    """PPO once more from the round's starting policy, rewarded by `reward_function` (the demo's oracle) with the
    settings and seed of the round's own PPO (function_ppo_settings), the critic again from the round's reward model:
    what the round's PPO budget buys with a perfect reward. Saved as a folder beside the round's policy
    (`ceiling-policy`), never as a policy row, so the loop, its next pairs and the app go on from the round's own
    policy; its path is round/ceiling_policy_path and its mean step metrics ceiling/* (ceiling/kl, ceiling/score...).
    """
    from loop.model_card import write_model_card
    from rlhf.ppo.train import reward_label, summarise_ppo, train_ppo

    plan, config, record, log = run.plan, run.config, run.record, run.log
    record({ROUND_STAGE: "ceiling"})
    ppo_config = function_ppo_settings(with_engine(ppo_settings(config, reward_path, plan.round_id), config,
                                                   plan.actor_path))
    log(f"Round {plan.round_id}: the ceiling: PPO again from policy {plan.actor_policy_id} on the same prompts, "
        "rewarded by the annotator's own score.")
    staging = Path(plan.out_dir) / ".ceiling-staging"
    result = train_ppo(plan.actor_path, reward_path, plan.ppo_prompts, ppo_config, staging,
                       reference_path=plan.reference_path, reward_function=reward_function)
    if run.is_main:
        summary = summarise_ppo(result.history)
        write_model_card(staging, plan.reference_path, metrics=summary, sampling=ppo_config.sampling,
                         reward_model=reward_label(reward_path, reward_function))
        target = replace_folder(staging, Path(plan.out_dir) / "ceiling-policy")
        record({**{ceiling_name(key): value for key, value in summary.items() if key.startswith(PPO_PREFIX)},
                ROUND_CEILING_POLICY_PATH: str(target)})
        log(f"Round {plan.round_id}: saved the ceiling's policy to {target} (not a policy of the loop).")
    wait_for_everyone()


def _pairs_stage(run: RoundRun, policy_id: int, reward_path: str | None = None,
                 exclude_prompts: frozenset[str] = frozenset()) -> int:
    """Step 6: the next batch of pairs: a share of the new policy against the one it started from (people's votes on
    them decide its promotion), the sample pairs from the current policy (the new one once promoted), chosen where the
    reward model's bootstrap heads disagree most (over-sampled answers), plus a random share; none for the prompts
    kept out of the round (the demo's evaluation prompts)."""
    from loop.pair_request import PairBar, PairRequest
    from loop.pairs import queue_pairs
    from loop.policies import load_pair_judge

    plan, config, log = run.plan, run.config, run.log
    earlier, current = plan.actor_policy_id, run.store.current_policy()
    n_pairs = config.round.next_pairs
    log(f"Round {plan.round_id}: generating {n_pairs} pairs from policy {current.id} "
        f"({config.round.versus_share:.0%} of policy {policy_id} against policy {earlier}).")
    judge = load_pair_judge(reward_path, config.votes)
    request = PairRequest(n_pairs, current.id, versus_share=config.round.versus_share, versus_policy_id=earlier,
                          versus_newer_id=policy_id, sampling=config.sampling, seed=config.round.seed + plan.round_id,
                          batch_size=config.pairs.batch_size, exclude_prompts=exclude_prompts)
    report = queue_pairs(run.store, request, config.votes, judge=judge, progress=PairBar())
    if judge is not None:
        share = min(report.stats.get(ACTIVE_UNCERTAIN, 0.0) / max(report.sample, 1), 1.0)
        run.record({ROUND_ACTIVE_SHARE: share,
                    ROUND_ACTIVE_CANDIDATE_ANSWERS: report.stats.get(ACTIVE_CANDIDATE_ANSWERS, 0.0)})
        log(f"Round {plan.round_id}: {report.sample} sample pairs, {share:.0%} chosen for the reward model's "
            f"disagreement from {config.votes.oversample} answers a prompt.")
    return report.written


def _report_stage(run: RoundRun) -> None:
    """The round's report: round.report_prompts prompts PPO did not train on, answered before and after, scored, kept
    in the store (loop.report). The round's work is done by then: a report that fails is said, not a failed round."""
    from loop.report import make_round_report

    run.record({ROUND_STAGE: "report"})
    try:
        make_round_report(run.store, run.plan.round_id, run.config, log=run.log)
    except Exception as error:  # the policy and the next pairs stand; the report can be made again from them
        run.log(f"Round {run.plan.round_id}: its report was not made ({type(error).__name__}: {error}); make it with "
                f"python app.py --report {run.plan.round_id}.")
