"""The headless demonstration of the whole loop (`python app.py --demo-loop`): a simulated annotator votes on pairs, a
round runs on the votes, and the new policy is judged against the first on prompts kept out of training; R times.

With simulate.reward = "oracle" PPO chases the annotator's own score instead of the reward model (with
simulate.oracle = "win_rate", its verdicts against the first policy's answers), and with simulate.oracle_ceiling each
round is judged beside PPO on that oracle from the same policy (what a perfect reward model would buy). Every number is
printed as a line per round and, at the end, one JSON line."""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from annotate.metrics import (DEMO_ANNOTATOR, DEMO_FIRST_JUDGE_SCORE, DEMO_JUDGE_SCORE, DEMO_WIN_RATE,
                              DEMO_WIN_RATE_HIGH, DEMO_WIN_RATE_LOW, PPO_KL, PPO_REWARD, RM_HELDOUT_ACCURACY,
                              ROUND_ACTOR_POLICY_ID, ROUND_CEILING_POLICY_PATH, ROUND_PROMOTED, ROUND_REWARD_MODEL_PATH,
                              ROUND_SECONDS, ceiling_name, stage_seconds)
from annotate.promotion import PromotionDecision, refresh_promotions
from annotate.records import current_policy_of
from annotate.simulate import AnnotatorSpecError, noisy, resolve_judge, resolve_score
from annotate.statistics import mean_and_standard_error
from annotate.store import Store
from annotate.team import build_team, parse_team, team_judge
from loop.checks import RoundRefused, context_misfit
from loop.config import LoopConfig, SimulateSettings
from loop.judging import judged, oracle_reward, repeat_each, reward_model_means, win_rate_reward
from loop.pair_request import PairBar, PairRequest
from loop.retention import loadable_path

EXIT_REFUSED = 3
MAX_PAIR_CALLS = 4
"""Calls the demo makes to fill its queue to simulate.votes pairs before a round (each makes at most one a prompt)."""
SHIPPED_PROMPTS = Path("data/prompts.jsonl")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DemoSeeds:
    """Every seed the demo draws, each derived here from simulate.seed. A second demo on the same database goes on from
    its rounds (`rounds_before`), so it draws new flips, pairs and votes; the evaluation prompts and answers depend on
    the seed alone, the same on a database whatever ran before."""

    seed: int
    rounds_before: int

    def flips(self) -> int:
        """Which votes the noisy annotator flips."""
        return self.seed + 7 + self.rounds_before

    def evaluation(self) -> int:
        """The evaluation prompts and every policy's sampled answers to them."""
        return self.seed

    def votes(self, round_number: int) -> int:
        """The simulated votes of a round."""
        return self.seed + self.rounds_before + round_number

    def pairs(self, round_number: int, call: int) -> int:
        """The pairs of a round's `call`-th fill of the queue."""
        return self.votes(round_number) + 1000 * call


@dataclass(frozen=True)
class DemoAnnotator:
    """The simulated annotator who votes (with its flips) and judges (without them)."""

    spec: str
    """What simulate.annotator names: a rule or module:function."""
    name: str
    """Who the votes are cast as."""
    judge: Callable
    """judge(prompt, a, b) -> "a" | "b" | "tie": the verdicts without flips."""
    score: Callable | None
    """The rule's score of an answer; None for an annotator that only judges pairs."""
    voter: Callable
    """The judge with simulate.noise of its a/b verdicts flipped: what votes."""
    team: list | None = None
    """With simulate.team, the members who vote in the voter's place (annotate.team), each under their own name;
    `spec` is then the team's first rule member, who judges. None: the one annotator votes."""

    @classmethod
    def from_settings(cls, sim: SimulateSettings, seeds: DemoSeeds) -> DemoAnnotator:
        """Raises AnnotatorSpecError for an unknown annotator or team member."""
        spec = judge_spec(sim)
        judge = resolve_judge(spec)
        voter = noisy(judge, sim.noise, random.Random(seeds.flips())) if sim.noise else judge
        team = build_team(parse_team(sim.team), sim.noise, seeds.flips()) if sim.team else None
        name = f"the team {sim.team}" if sim.team else sim.annotator_name or f"sim:{spec}"
        return cls(spec, name, judge, resolve_score(spec), voter, team)

    def oracle(self, kind: str, first_answers: list[str]):
        """PPO's reward from the rule (simulate.oracle): its own score, or with "win_rate" the share of the first
        policy's answers an answer beats under it; None without a score."""
        if self.score is None:
            return None
        return win_rate_reward(self.score, first_answers, self.spec) if kind == "win_rate" else \
            oracle_reward(self.score, self.spec)


def ppo_reward_words(sim: SimulateSettings) -> str:
    """What rewards the demo's PPO, in words: the reward model (beside the oracle's ceiling) or the oracle."""
    oracle = "the annotator's " + ("win rate against the first policy's answers" if sim.oracle == "win_rate"
                                   else "score")
    if sim.reward == "oracle":
        return oracle
    return "the reward model" + (f" beside the oracle ceiling ({oracle})" if sim.oracle_ceiling else "")


def judge_spec(sim: SimulateSettings) -> str | None:
    """Who judges the win rate (and is the oracle): simulate.annotator, or with a team its first rule member (None
    for a team without one)."""
    return team_judge(parse_team(sim.team)) if sim.team else sim.annotator


def settings_problem(config: LoopConfig) -> str | None:
    """Why the demo cannot run with these settings (checked before the database is touched), or None."""
    sim = config.simulate
    spec = judge_spec(sim)
    if spec is None:
        return (f"the team {sim.team!r} has no rule member to judge the demo's win rate: add one, for example "
                "courteous")
    try:
        resolve_judge(spec)
        if sim.team:
            build_team(parse_team(sim.team))
    except AnnotatorSpecError as error:
        return str(error)
    if resolve_score(spec) is None and (sim.reward == "oracle" or sim.oracle_ceiling):
        asked = "--reward oracle" if sim.reward == "oracle" else "--oracle-ceiling"
        return (f"{asked} rewards PPO with the annotator's own score of each answer, and {spec!r} has "
                "none: it only judges pairs. Use an annotator with a score (a built-in rule such as courteous, or "
                "contains:WORD) or --reward model.")
    return context_misfit(config)


def _plus_minus(value: float | None, error: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}" + ("" if error is None else f" (SE {error:.4f})")


class Evaluation:
    """The prompts every policy is judged on (the same every round and every run on a database), the first policy's
    answers to them, and the judging of a policy's answers against those."""

    def __init__(self, store: Store, sim: SimulateSettings, config: LoopConfig, annotator: DemoAnnotator,
                 seeds: DemoSeeds):
        rng = random.Random(seeds.evaluation())
        self.prompts = rng.sample([p.text for p in store.prompts()], min(sim.eval_prompts, store.count_prompts()))
        self.per_prompt = sim.eval_answers
        self.sampling, self.seed, self.batch_size = config.sampling, seeds.evaluation(), config.pairs.batch_size
        self.annotator = annotator
        self.each = repeat_each(self.prompts, self.per_prompt)
        """The prompt of each answer."""
        self.first_answers: list[str] = []
        self.first_score: dict = {"judge_score": None, "judge_score_se": None}
        self.by_policy: dict[str, list[str]] = {}
        """Each policy's answers, by its folder: sampled with one seed, a policy's answers are the same each time."""

    def answer_first(self, first_path: str) -> None:
        """The first policy's answers, which every later policy's are judged against, and the rule's score of them."""
        self.first_answers = self.answers(first_path)
        if self.annotator.score is not None:
            judge_score, judge_score_se = mean_and_standard_error(
                [self.annotator.score(answer) for answer in self.first_answers], self.per_prompt)
            self.first_score = {"judge_score": judge_score, "judge_score_se": judge_score_se}

    def answers(self, policy_path: str) -> list[str]:
        from loop import policies

        if policy_path not in self.by_policy:
            self.by_policy[policy_path] = policies.policy_answers(policy_path, self.prompts, self.sampling,
                                                                  self.per_prompt, self.seed, self.batch_size)
        return self.by_policy[policy_path]

    def judge_policy(self, policy_path: str) -> tuple[list[str], dict]:
        """The policy's answers and their verdicts against the first policy's (loop.judging.judged)."""
        answers = self.answers(policy_path)
        return answers, judged(self.annotator.judge, self.annotator.score, self.each, answers, self.first_answers,
                               self.per_prompt)


def fill_pair_queue(store: Store, config: LoopConfig, wanted: int, seeds: DemoSeeds, round_number: int,
                    exclude: frozenset[str]) -> None:
    """Queue pairs until `wanted` wait, as the app's "generate now" would: sample pairs from the current policy, chosen
    by the last reward model once there is one, and round.versus_share of the newest policy against the one it started
    from (their votes decide its promotion: annotate.promotion). A call makes at most one pair a prompt, so more votes
    than prompts take more calls on the least-used ones."""
    from loop import pairs, policies

    for call in range(MAX_PAIR_CALLS):
        waiting = store.pairs_waiting()
        if waiting >= wanted:
            return
        refresh_promotions(store, config.promotion, config.votes.weighting)
        current, newest = store.current_policy(), store.latest_policy()
        judge_path = policies.pair_judge_path(store)
        pair_judge = policies.load_pair_judge(judge_path, config.votes)  # not the annotator: the reward model
        versus_share = config.round.versus_share if newest.round > 0 else 0.0  # the base has no parent to face
        versus = f", {versus_share:.0%} of them policy {newest.id} against the one it started from" if versus_share \
            else ""
        _log(f"Generating {wanted - waiting} pairs from policy {current.id} to vote on{versus}"
             f"{', chosen by the reward model at ' + judge_path if pair_judge is not None else ''}.")
        request = PairRequest(wanted - waiting, current.id, versus_share=versus_share,
                              versus_newer_id=newest.id, sampling=config.sampling,
                              seed=seeds.pairs(round_number, call), batch_size=config.pairs.batch_size,
                              exclude_prompts=exclude)
        pairs.queue_pairs(store, request, config.votes, judge=pair_judge, progress=PairBar())
        if store.pairs_waiting() == waiting:  # nothing usable came back: vote on what there is
            return


def own_round_seconds(metrics: dict) -> float | None:
    """Seconds the round itself took (what `--train-round` takes on the same votes): its run less the oracle's ceiling,
    a demo measurement; None for a round a crash left without a time."""
    seconds = ROUND_SECONDS.of(metrics)
    return None if seconds is None else round(seconds - (stage_seconds("ceiling").of(metrics) or 0.0), 1)


def demo_row(result, policy_path: str, evaluation: Evaluation, config: LoopConfig) -> dict:
    """One round's row of the demo's JSON line: the round's figures, the judge's verdicts and scores of the new policy
    at `policy_path`, the reward model's scores of the same answers, and the oracle's ceiling when it ran."""
    sim = config.simulate
    metrics = result.metrics
    new_answers, verdicts = evaluation.judge_policy(policy_path)
    row = {"round": result.round_id,  # the database's round: a reused database goes on from its last one
           "policy_id": result.policy_id, "promoted_at_round_end": bool(ROUND_PROMOTED.of(metrics)),
           "rm_accuracy": RM_HELDOUT_ACCURACY.of(metrics), "reward": PPO_REWARD.of(metrics), "kl": PPO_KL.of(metrics),
           **verdicts}
    reward_path = metrics.get(ROUND_REWARD_MODEL_PATH)  # absent when a resumed round reused a crashed one's
    row["rm_score"], row["rm_score_first"] = reward_model_means(
        reward_path, evaluation.each, [new_answers, evaluation.first_answers], config.reward.max_length) \
        if reward_path and Path(reward_path).is_dir() else (None, None)
    if sim.oracle_ceiling:  # None when a resumed round never ran it
        ceiling = metrics.get(ROUND_CEILING_POLICY_PATH)
        row.update({"oracle_" + key: value for key, value in evaluation.judge_policy(ceiling)[1].items()} if ceiling
                   else {"oracle_win_rate": None})
        row["oracle_kl"] = metrics.get(ceiling_name(PPO_KL.name))
    row["round_seconds"] = own_round_seconds(metrics)
    return row


def round_line(row: dict, first: dict) -> str:
    """The printed line of a demo round: the judge's verdicts and scores, the reward model's, the oracle's."""
    def verdicts(prefix: str) -> str:
        return (f"{row[prefix + 'win_rate']:.1%} (95% CI {row[prefix + 'win_rate_low']:.1%}-"
                f"{row[prefix + 'win_rate_high']:.1%}; {row[prefix + 'wins']} wins, {row[prefix + 'losses']} losses, "
                f"{row[prefix + 'ties']} ties)")

    text = (f"round {row['round']}: policy {row['policy_id']} "
            f"{'promoted' if row['promoted_at_round_end'] else 'kept a candidate'} at the round's end, "
            f"rm accuracy {row['rm_accuracy']}, reward {row['reward']}, kl {row['kl']}, "
            f"win rate vs first {verdicts('')}")
    if row["judge_score"] is not None:
        text += (f", judge score {_plus_minus(row['judge_score'], row['judge_score_se'])} "
                 f"(first {_plus_minus(first['judge_score'], first['judge_score_se'])})")
    if row.get("rm_score") is not None:
        text += f", reward-model score {row['rm_score']:.4f} (first {row['rm_score_first']:.4f})"
    if row.get("oracle_win_rate") is not None:
        text += (f"; oracle ceiling: win rate {verdicts('oracle_')}, judge score "
                 f"{_plus_minus(row['oracle_judge_score'], row['oracle_judge_score_se'])}, kl {row['oracle_kl']}")
    if row.get("round_seconds") is not None:
        text += f", the round {row['round_seconds']} s"
    return text + f", {row['seconds']} s with votes and judging"


def cast_round_votes(store: Store, config: LoopConfig, annotator: DemoAnnotator, evaluation: Evaluation,
                     seeds: DemoSeeds, round_number: int) -> int:
    """The votes a round starts with: simulate.votes of them, less those already cast since the last round (a previous
    demo's closing votes, or people's), on pairs queued as the app would; returns how many were cast now."""
    from annotate import simulate, team

    already = store.votes_since_last_round()
    wanted = max(0, config.simulate.votes - already)
    if already:
        _log(f"{already} votes are in since the last round (a demo's closing votes, or people's): {wanted} more to "
             "cast.")
    if wanted == 0:
        return 0
    fill_pair_queue(store, config, wanted, seeds, round_number, frozenset(evaluation.prompts))
    if annotator.team:
        return team.simulate_team_votes(store, annotator.team, wanted, seed=seeds.votes(round_number)).votes
    return simulate.simulate_votes(store, annotator.voter, annotator.name, wanted, seed=seeds.votes(round_number),
                                   score=annotator.score).votes  # graded by the rule's score, where it has one


def demo_round(store: Store, config: LoopConfig, annotator: DemoAnnotator, evaluation: Evaluation, seeds: DemoSeeds,
               round_number: int) -> dict | None:
    """Pairs, votes, a round and its judging; the round's row, or None when the round was refused."""
    from loop import round as rounds

    sim = config.simulate
    started = time.perf_counter()
    voted = cast_round_votes(store, config, annotator, evaluation, seeds, round_number)
    _log(f"Demo round {round_number} of {sim.rounds}: {annotator.name} cast {voted} votes.")
    oracle = annotator.oracle(sim.oracle, evaluation.first_answers)
    try:
        result = rounds.run_round(config.app.db, config.app.model, config, log=_log,
                                  exclude_prompts=set(evaluation.prompts),
                                  reward_function=oracle if sim.reward == "oracle" else None,
                                  ceiling_reward=oracle if sim.oracle_ceiling else None, make_report=False)
    except RoundRefused as error:
        print(f"demo round {round_number} of {sim.rounds} refused: {error}", file=sys.stderr)
        return None
    new_path = loadable_path(store.policy(result.policy_id))
    row = demo_row(result, new_path, evaluation, config)
    row["seconds"] = round(time.perf_counter() - started, 1)
    store.update_round_metrics(result.round_id, judge_metrics(row, evaluation.first_score, annotator.spec))
    report_from_evaluation(store, result.round_id, new_path, evaluation, config)
    return row


def report_from_evaluation(store: Store, round_id: int, new_path: str, evaluation: Evaluation,
                           config: LoopConfig) -> None:
    """The round's report on the evaluation prompts: the answers of the policy the round started from (the previous
    round's, judged then, or sampled now) beside the new policy's."""
    from loop.report import make_round_report

    actor = store.policy(int(store.round(round_id).metrics[ROUND_ACTOR_POLICY_ID]))
    answers = list(zip(evaluation.each, evaluation.answers(loadable_path(actor)), evaluation.answers(new_path)))
    make_round_report(store, round_id, config, answers=answers, log=_log)


def judge_metrics(row: dict, first: dict, annotator: str) -> dict:
    """The judge's figures of a demo round, recorded with the round (the Dashboard shows them where they exist: only a
    simulated annotator can judge every answer)."""
    return {DEMO_ANNOTATOR: annotator, DEMO_WIN_RATE.name: row["win_rate"], DEMO_WIN_RATE_LOW.name: row["win_rate_low"],
            DEMO_WIN_RATE_HIGH.name: row["win_rate_high"], DEMO_JUDGE_SCORE.name: row["judge_score"],
            DEMO_FIRST_JUDGE_SCORE.name: first["judge_score"]}


def cast_closing_votes(store: Store, config: LoopConfig, annotator: DemoAnnotator, evaluation: Evaluation,
                       seeds: DemoSeeds, rows: list[dict]) -> int:
    """With simulate.closing_votes, once every round ran: the votes the next round would start with, among them
    people's on the last round's versus pairs, so its promotion is theirs as every earlier round's is (without them
    the reward model decides it alone). Returns the votes cast."""
    sim = config.simulate
    if not (sim.closing_votes and rows and len(rows) == sim.rounds):
        return 0
    closing = cast_round_votes(store, config, annotator, evaluation, seeds, sim.rounds + 1)
    _log(f"Closing votes: {annotator.name} cast {closing} votes on the pairs a next round would start with, so round "
         f"{rows[-1]['round']}'s promotion is decided on people's votes.")
    return closing


def promotion_outcome(store: Store, rows: list[dict], evaluation: Evaluation, config: LoopConfig) -> None:
    """Each row's `promoted` (the decision on the votes in at the demo's end: people judge a round's policy by the
    next round's start, the last round's by the closing votes) and `current_win_rate` (the win rate against the first
    of the policy current after that round, with its interval), printed as one line a round."""
    refresh_promotions(store, config.promotion, config.votes.weighting)
    policies = store.policies()
    for row in rows:
        made = store.policy(row["policy_id"])
        current = current_policy_of([p for p in policies if (p.round, p.id) <= (made.round, made.id)])
        judged = current.path in evaluation.by_policy or not current.pruned  # answered in this run, or loadable
        verdicts = evaluation.judge_policy(current.path)[1] if judged else {}
        decision = PromotionDecision.from_json(made.promotion)
        row.update({"promoted": made.is_promoted, "promotion_rule": decision.rule if decision else None,
                    "current_policy_id": current.id, "current_win_rate": verdicts.get("win_rate"),
                    "current_win_rate_low": verdicts.get("win_rate_low"),
                    "current_win_rate_high": verdicts.get("win_rate_high")})
        rate = "n/a (its folder was pruned)" if not verdicts else \
            f"{verdicts['win_rate']:.1%} ({verdicts['win_rate_low']:.1%}-{verdicts['win_rate_high']:.1%})"
        print(f"round {row['round']}: policy {made.id} {'promoted' if row['promoted'] else 'not promoted'}"
              f"{f' ({decision.rule}: {decision.reason})' if decision else ''}; current after it policy {current.id}, "
              f"win rate vs first {rate}", flush=True)


def run_demo_loop(config: LoopConfig, on_round: Callable[[dict], None] | None = None) -> int:
    """simulate -> round, simulate.rounds times, on the database's prompts (the shipped ones on an empty database);
    exit 0 when every round ran, 2 bad settings, 3 a round refused. `on_round(row)` after each round (bench/soak.py
    measures the disk there)."""
    sim = config.simulate
    if (problem := settings_problem(config)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    Path(config.app.db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(config.app.db)
    seeds = DemoSeeds(sim.seed, rounds_before=len(store.rounds()))
    annotator = DemoAnnotator.from_settings(sim, seeds)
    if store.count_prompts() == 0:
        store.import_prompts(SHIPPED_PROMPTS)
    store.ensure_base_policy(config.app.model)
    first = store.first_policy()  # round 0 (the base, or its SFT), whatever rounds a database ran before
    evaluation = Evaluation(store, sim, config, annotator, seeds)
    voters = f"team {sim.team} judged by {annotator.spec}" if sim.team else f"annotator {sim.annotator}"
    _log(f"Demo loop: {sim.rounds} rounds, {voters} (noise {sim.noise:.0%}), "
         f"{sim.votes} votes a round, PPO rewarded by {ppo_reward_words(sim)}, win rate judged on {sim.eval_answers} "
         f"answer(s) to each of {len(evaluation.prompts)} prompts kept out of PPO "
         f"({store.count_prompts() - len(evaluation.prompts)} left for it).")
    _log(f"Every policy is judged against policy {first.id} (round 0, {first.path}): the first policy.")
    evaluation.answer_first(first.path)
    if annotator.score is not None:
        first_score = evaluation.first_score
        _log(f"The first policy's answers score "
             f"{_plus_minus(first_score['judge_score'], first_score['judge_score_se'])} on average by the "
             f"{annotator.spec} rule.")
    rows = []
    for round_number in range(1, sim.rounds + 1):
        row = demo_round(store, config, annotator, evaluation, seeds, round_number)
        if row is None:
            break
        rows.append(row)
        print(round_line(row, evaluation.first_score), flush=True)
        if on_round is not None:
            on_round(row)
    closing = cast_closing_votes(store, config, annotator, evaluation, seeds, rows)
    promotion_outcome(store, rows, evaluation, config)
    store.close()
    print(json.dumps({"reward": sim.reward, "oracle": sim.oracle, "first_policy_id": first.id, "closing_votes": closing,
                      "eval_prompts": len(evaluation.prompts),
                      "eval_answers": sim.eval_answers, "first_judge_score": evaluation.first_score["judge_score"],
                      "first_judge_score_se": evaluation.first_score["judge_score_se"], "rounds": rows}))
    return 0 if len(rows) == sim.rounds else EXIT_REFUSED
